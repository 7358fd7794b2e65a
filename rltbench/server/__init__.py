"""The OpenAI-compatible HTTP server around the engine (docs/serve.md); `rltbench serve` is its command.

Modules: protocol (request validation, response bodies), textstream (incremental text, stop strings),
codecs (which tokenizer), loop (the thread that owns the engine), metrics (Prometheus text), app
(aiohttp routes), server (build, warm up, listen, shut down), bench (the measurement client that
scripts/serve_bench.sh runs against a live server).
"""
