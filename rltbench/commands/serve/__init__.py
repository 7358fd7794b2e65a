"""`rltbench serve`: the engine behind an OpenAI-compatible HTTP server (docs/serve.md).

Modules: protocol (request validation, response bodies), textstream (incremental text, stop strings),
codecs (which tokenizer), loop (the thread that owns the engine), metrics (Prometheus text), app
(aiohttp routes), server (build, warm up, listen, shut down), cli (the command).
"""
