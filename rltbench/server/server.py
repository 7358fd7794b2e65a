"""`rltbench serve` end to end: validated options -> model, engine, codec -> warm-up -> listen ->
SIGINT/SIGTERM -> stop accepting, abort in-flight requests, account for every KV block.

`build` and `serve_forever` are separate so tests (and embedding code) can run the server on their own
event loop and stop it with an `asyncio.Event` instead of a signal.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from aiohttp import web

from rltbench import runtime
from rltbench.arms import override_flags, parse_arms
from rltbench.engine.types import EngineConfig, SamplingParams
from rltbench.errors import UsageError
from rltbench.server.app import ServerApp
from rltbench.server.codecs import SPECIAL, export_hf_tokenizer, make_codec
from rltbench.server.loop import EngineLoop, Failure
from rltbench.server.protocol import ServedModel

DEFAULT_MAX_MODEL_LEN = 4096  # decode graphs are captured per context class up to this; raise it for longer
SHUTDOWN_GRACE_S = 5.0
WARMUP_PROMPT_LEN = 4
GIL_SWITCH_S = 0.001


@dataclass
class ServeOptions:
    """Everything `rltbench serve` takes (flag names follow vLLM where the meaning is the same)."""

    model: str = "ouro-1.4b"
    weights: str = "random"
    arm: str = "exact"
    norm: str | None = None
    rope: str | None = None
    act: str | None = None
    scope: str | None = None
    dtype: str | None = None
    device: str | None = None
    seed: int = 0
    kv_cache_gib: float | None = None
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    max_model_len: int | None = None
    enforce_eager: bool = False
    prefix_caching: bool = True
    prefill_graphs: bool = True
    warmup_prefill_lens: tuple[int, ...] = ()
    max_queue: int = 1024
    tokenizer: str | None = None
    export_tokenizer: str | None = None
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000

    def validate(self) -> None:
        """Refuse bad options before any model work (each number was checked against its bounds when
        the command line was parsed: rltbench.options)."""
        runtime.check_engine_flags(self.engine_config(self.max_model_len))
        if self.tokenizer is not None and self.tokenizer not in SPECIAL and not Path(self.tokenizer).exists():
            raise UsageError(
                f"--tokenizer {self.tokenizer}: no such file or directory (or use fallback, ids)"
            )

    @property
    def source(self) -> runtime.ModelSource:
        return runtime.ModelSource(self.model, self.weights, self.seed)

    def engine_config(self, max_model_len: int | None) -> EngineConfig:
        return EngineConfig(
            kv_cache_gib=self.kv_cache_gib,
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_prefix_caching=self.prefix_caching,
            use_cuda_graph=not self.enforce_eager,
            max_model_len=max_model_len,
            prefill_graphs=self.prefill_graphs,
        )


@dataclass
class Built:
    """A ready-to-warm server: the app over its engine loop, plus what the ready line prints."""

    app: ServerApp
    warmup: Callable[[Any], None]
    summary: str



def _context_len(opts: ServeOptions) -> int:
    """--max-model-len checked against the preset's or checkpoint's config, before any weights exist."""
    model_len = int(opts.source.config().max_position_embeddings)
    max_len = opts.max_model_len or min(model_len, DEFAULT_MAX_MODEL_LEN)
    if max_len > model_len:
        raise UsageError(f"--max-model-len {max_len} exceeds the model's context {model_len}")
    if any(n >= max_len for n in opts.warmup_prefill_lens):
        raise UsageError(f"--warmup-prefill-len must be < --max-model-len {max_len}")
    return max_len


def build(opts: ServeOptions) -> Built:
    """Model, codec, engine and app (nothing listens yet, nothing is captured yet)."""
    opts.validate()
    arms = parse_arms(opts.arm, override_flags(opts.norm, opts.rope, opts.act, opts.scope))
    if len(arms) != 1:
        raise UsageError(f"--arm {opts.arm!r}: one arm per server (start one server per arm)")
    (arm_name,) = arms
    max_len = _context_len(opts)
    dev = runtime.resolve_device(opts.device)
    want_tok = (not opts.source.random and opts.tokenizer is None
                and (Path(opts.weights) / "tokenizer.json").is_file())
    model, tok = runtime.load(opts.source, dev, runtime.resolve_dtype(opts.dtype, dev), tokenizer=want_tok)
    label = opts.model if opts.source.random else Path(opts.weights).resolve().name
    codec = make_codec(opts.tokenizer, model.config, tok)
    engine = runtime.build_engine(model, arms, opts.engine_config(max_len))
    if opts.export_tokenizer:
        if codec is None:
            raise UsageError("--export-tokenizer needs a tokenizer (--tokenizer PATH, fallback or ids)")
        export_hf_tokenizer(codec, opts.export_tokenizer, engine.max_model_len)
    name = opts.served_model_name or f"{label}:{arm_name}"
    served = ServedModel(name, int(engine.max_model_len), int(model.config.vocab_size), codec)
    info = {
        "arm": arm_name,
        "device": str(engine.device),
        "dtype": runtime.dtype_name(engine.dtype),
        "weights": "random" if getattr(model, "random_weights", opts.source.random) else "checkpoint",
        "tokenizer": codec.source if codec is not None else "none (token-id prompts only)",
    }
    app = ServerApp(EngineLoop(engine), served, SamplingParams, opts.max_num_seqs + opts.max_queue, info)

    def warmup(eng: Any) -> None:
        """Decode graphs for every bucket and context class, the prefill graphs (every token-count
        bucket; without buckets the asked prefill shapes), then one tiny request through prefill and
        decode (first-use allocations), all before listening. Runs on the
        engine thread: a CUDA engine makes its device current there first (captures and replays use
        the thread's current device and stream)."""
        if eng.device.type == "cuda":
            torch.cuda.set_device(eng.device)
        eng.runner.warmup()
        for n in opts.warmup_prefill_lens:
            eng.runner.warmup_prefill(n)
        eng.runner.warmup_prefill_buckets()
        prompt = [1 + i % (served.vocab_size - 1) for i in range(min(WARMUP_PROMPT_LEN, max_len - 2))]
        eng.add_request("warmup", prompt, SamplingParams(max_tokens=2, ignore_eos=True))
        while eng.has_unfinished():
            eng.step()

    summary = (
        f"model {name} ({info['weights']} weights, {info['dtype']} on {info['device']}), "
        f"KV pool {engine.num_blocks} blocks of {opts.block_size} tokens, context {served.max_model_len}, "
        f"max {opts.max_num_seqs} running + {opts.max_queue} queued, CUDA graphs "
        f"{'on' if engine.use_graphs else 'off'}, prefix caching {'on' if opts.prefix_caching else 'off'}, "
        f"tokenizer: {info['tokenizer']}"
    )
    return Built(app, warmup, summary)


def block_accounting(stats: dict[str, Any]) -> tuple[bool, str]:
    """(all returned, one line) from the engine's final stats."""
    total, free = stats.get("total_blocks"), stats.get("free_blocks")
    if not isinstance(total, int) or not isinstance(free, int):
        return False, f"KV blocks: unknown at shutdown ({stats.get('error', 'no stats')})"
    ok = free == total
    line = f"KV blocks at shutdown: {free}/{total} free, {total - free} in use"
    return ok, line + ("" if ok else "  LEAK: blocks were not returned")


async def serve_forever(
    built: Built,
    host: str,
    port: int,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[int], None] | None = None,
    install_signals: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Warm up, listen until `stop` is set (or SIGINT/SIGTERM), shut down; returns the final stats."""
    aloop = asyncio.get_running_loop()
    app = built.app
    app.loop.attach(aloop)
    log(f"warming up ({built.summary})")
    try:
        await aloop.run_in_executor(None, app.loop.start, built.warmup)
    except (RuntimeError, ValueError) as exc:  # CUDA out of memory during capture, engine refusals
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise UsageError(
            f"warm-up failed ({type(exc).__name__}: {first}); lower --kv-cache-gib, --max-num-seqs or "
            "--max-model-len, or use --enforce-eager"
        ) from None
    runner = web.AppRunner(
        app.build(), handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S
    )
    await runner.setup()
    stop = stop or asyncio.Event()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        bound = runner.addresses[0][1]
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                aloop.add_signal_handler(sig, stop.set)
        log(f"ready on http://{host}:{bound}  (model {app.served.name})")
        if on_ready is not None:
            on_ready(bound)
        await stop.wait()
        log("shutting down: no new requests, aborting in-flight ones")
        app.closing = True
        await site.stop()
    finally:
        final = await aloop.run_in_executor(None, app.loop.stop)
        app.loop.fail_remaining(Failure("the server is shutting down", 503, "shutting_down"))
        await runner.cleanup()
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                aloop.remove_signal_handler(sig)
    return final


def run(opts: ServeOptions) -> int:
    """The command: 0 when every KV block came back at shutdown, 1 otherwise.

    The GIL switch interval drops from 5 ms to GIL_SWITCH_S for this process: right after a step the
    event loop writes that step's chunks while the engine thread prepares the next step, and with the
    default interval the engine thread can wait up to 5 ms for the GIL while the GPU idles."""
    sys.setswitchinterval(GIL_SWITCH_S)
    built = build(opts)
    final = asyncio.run(serve_forever(built, opts.host, opts.port, log=lambda s: print(s, flush=True)))
    ok, line = block_accounting(final)
    print(line, flush=True)
    return 0 if ok else 1
