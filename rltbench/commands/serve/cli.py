"""`rltbench serve`: one model and one kernel arm behind an OpenAI-compatible HTTP server.

Flag names follow vLLM where the meaning is the same (--max-num-seqs, --max-num-batched-tokens,
--block-size, --max-model-len, --enforce-eager, --served-model-name, --host, --port). Usage, the
metrics contract and the capacity behaviour: docs/serve.md.
"""

from __future__ import annotations

from typing import Annotated

import typer

from rltbench.arms import ActOption, NormOption, RopeOption, ScopeOption
from rltbench.commands.serve.server import ServeOptions, run
from rltbench.errors import UsageError
from rltbench.runtime import DeviceOption, DtypeOption, ModelOption, SeedOption, WeightsOption


def parse_lengths(text: str | None) -> tuple[int, ...]:
    """'512,1024' -> (512, 1024)."""
    if not text:
        return ()
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise UsageError(f"--warmup-prefill-len {text!r}: expected integers, e.g. 512,1024") from None


def serve_command(
    model: ModelOption = "ouro-1.4b",
    weights: WeightsOption = "random",
    arm: Annotated[
        str,
        typer.Option(
            help="The one kernel arm: torch, exact, approx, cuda or NAME=norm:exact/rope:off/scope:all. "
            "The served model name says it (ouro-1.4b:exact); start one server per arm."
        ),
    ] = "exact",
    norm: NormOption = None,
    rope: RopeOption = None,
    act: ActOption = None,
    scope: ScopeOption = None,
    dtype: DtypeOption = None,
    device: DeviceOption = None,
    seed: SeedOption = 0,
    kv_cache_gib: Annotated[
        float | None,
        typer.Option(help="KV pool size (default: free GPU memory minus headroom; CPU 512 blocks)."),
    ] = None,
    max_num_seqs: Annotated[int, typer.Option(help="Requests decoded together at most.")] = 128,
    max_num_batched_tokens: Annotated[int, typer.Option(help="Prefill token budget per step.")] = 2048,
    block_size: Annotated[int, typer.Option(help="KV block size (tokens).")] = 16,
    max_model_len: Annotated[
        int | None, typer.Option(help="Context: prompt + max_tokens (default min(model context, 4096)).")
    ] = None,
    enforce_eager: Annotated[
        bool, typer.Option(help="No CUDA graphs (scope-graph arms then equal torch).")
    ] = False,
    prefix_caching: Annotated[bool, typer.Option(help="Reuse the KV of shared prompt prefixes.")] = True,
    prefill_graphs: Annotated[
        bool, typer.Option(help="Capture prefill steps whose exact shape repeats in CUDA graphs.")
    ] = True,
    warmup_prefill_len: Annotated[
        str | None,
        typer.Option(
            help="Prompt lengths (comma list) whose burst prefill graphs are captured before listening."
        ),
    ] = None,
    max_queue: Annotated[
        int, typer.Option(help="Requests that may wait beyond --max-num-seqs; more get 503 + Retry-After.")
    ] = 1024,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="tokenizer.json (or its DIR), 'fallback' (GSM8K byte BPE) or 'ids' (word t<i> per id); "
            "default: the checkpoint's; none = token-id prompts only."
        ),
    ] = None,
    export_tokenizer: Annotated[
        str | None, typer.Option(help="Write the tokenizer as an HF tokenizer DIR for clients.")
    ] = None,
    served_model_name: Annotated[str | None, typer.Option(help="Model id (default MODEL:ARM).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 = any free port, printed on the ready line).")] = 8000,
) -> None:
    """OpenAI-compatible server (completions, chat, models, health, Prometheus metrics) over the engine."""
    opts = ServeOptions(
        model=model,
        weights=weights,
        arm=arm,
        norm=norm,
        rope=rope,
        act=act,
        scope=scope,
        dtype=dtype,
        device=device,
        seed=seed,
        kv_cache_gib=kv_cache_gib,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        max_model_len=max_model_len,
        enforce_eager=enforce_eager,
        prefix_caching=prefix_caching,
        prefill_graphs=prefill_graphs,
        warmup_prefill_lens=parse_lengths(warmup_prefill_len),
        max_queue=max_queue,
        tokenizer=tokenizer,
        export_tokenizer=export_tokenizer,
        served_model_name=served_model_name,
        host=host,
        port=port,
    )
    code = run(opts)
    if code:
        raise typer.Exit(code=code)
