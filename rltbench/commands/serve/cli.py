"""`rltbench serve`: one model and one kernel arm behind an OpenAI-compatible HTTP server.

Flag names follow vLLM where the meaning is the same (--max-num-seqs, --max-num-batched-tokens,
--block-size, --max-model-len, --enforce-eager, --served-model-name, --host, --port). Usage, the
metrics contract and the capacity behaviour: docs/serve.md.
"""

from __future__ import annotations

from typing import Annotated

import typer

from rltbench import arms as armspec
from rltbench import runtime
from rltbench.commands.serve.server import ServeOptions, run
from rltbench.errors import UsageError


def parse_lengths(text: str | None) -> tuple[int, ...]:
    """'512,1024' -> (512, 1024)."""
    if not text:
        return ()
    try:
        return tuple(int(p) for p in runtime.comma_list(text, "--warmup-prefill-len", "512,1024"))
    except ValueError:
        raise UsageError(f"--warmup-prefill-len {text!r}: expected integers, e.g. 512,1024") from None


def serve_command(
    model: runtime.ModelOption = "ouro-1.4b",
    weights: runtime.WeightsOption = "random",
    arm: Annotated[
        str,
        typer.Option(
            help="The one kernel arm: torch, exact, approx, cuda or NAME=norm:exact/rope:off/scope:all. "
            "The served model name says it (ouro-1.4b:exact); start one server per arm."
        ),
    ] = "exact",
    norm: armspec.NormOption = None,
    rope: armspec.RopeOption = None,
    act: armspec.ActOption = None,
    scope: armspec.ScopeOption = None,
    dtype: runtime.DtypeOption = None,
    device: runtime.DeviceOption = None,
    seed: runtime.SeedOption = 0,
    kv_cache_gib: runtime.KvCacheGibOption = None,
    max_num_seqs: Annotated[int, typer.Option(help="Requests decoded together at most.")] = 128,
    max_num_batched_tokens: runtime.MaxNumBatchedTokensOption = 2048,
    block_size: runtime.BlockSizeOption = 16,
    max_model_len: Annotated[
        int | None, typer.Option(help="Context: prompt + max_tokens (default min(model context, 4096)).")
    ] = None,
    enforce_eager: runtime.EnforceEagerOption = False,
    prefix_caching: Annotated[bool, typer.Option(help="Reuse the KV of shared prompt prefixes.")] = True,
    prefill_graphs: runtime.PrefillGraphsOption = True,
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
    flags = dict(locals())  # the parameters, which are ServeOptions' fields (one of them still a string)
    flags["warmup_prefill_lens"] = parse_lengths(flags.pop("warmup_prefill_len"))
    code = run(ServeOptions(**flags))
    if code:
        raise typer.Exit(code=code)
