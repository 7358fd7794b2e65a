"""`rltbench serve`: one model and one kernel arm behind an OpenAI-compatible HTTP server.

Flag names follow vLLM where the meaning is the same (--max-num-seqs, --max-num-batched-tokens,
--block-size, --max-model-len, --enforce-eager, --served-model-name, --host, --port). Usage, the
metrics contract and the capacity behaviour: docs/serve.md.
"""

from __future__ import annotations

from typing import Annotated

import typer

from rltbench import arms as armspec
from rltbench import options


def parse_lengths(text: str | None) -> tuple[int, ...]:
    """'512,1024' -> (512, 1024)."""
    if not text:
        return ()
    return tuple(options.int_list(text, "--warmup-prefill-len", "512,1024"))


def serve_command(
    model: options.ModelOption = "ouro-1.4b",
    weights: options.WeightsOption = "random",
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
    dtype: options.DtypeOption = None,
    device: options.DeviceOption = None,
    seed: options.SeedOption = 0,
    kv_cache_gib: options.KvCacheGibOption = None,
    max_num_seqs: Annotated[int, options.number("Requests decoded together at most.", ge=1)] = 128,
    max_num_batched_tokens: options.MaxNumBatchedTokensOption = 2048,
    block_size: options.BlockSizeOption = 16,
    max_model_len: Annotated[
        int | None, options.number("Context: prompt + max_tokens (default min(model context, 4096); at "
                                   "least 2: one prompt token and one generated).", ge=2)
    ] = None,
    enforce_eager: options.EnforceEagerOption = False,
    prefix_caching: Annotated[bool, typer.Option(help="Reuse the KV of shared prompt prefixes.")] = True,
    prefill_graphs: options.PrefillGraphsOption = True,
    warmup_prefill_len: Annotated[
        str | None,
        typer.Option(
            help="Prompt lengths (comma list) whose burst prefill graphs are captured before listening."
        ),
    ] = None,
    max_queue: Annotated[
        int, options.number("Requests that may wait beyond --max-num-seqs; more get 503 + Retry-After.", ge=0)
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
    port: Annotated[
        int, options.number("Port (0 = any free port, printed on the ready line).", ge=0, le=65535)
    ] = 8000,
) -> None:
    """OpenAI-compatible server (completions, chat, models, health, Prometheus metrics) over the engine."""
    flags = dict(locals())  # the parameters, which are ServeOptions' fields (one of them still a string)
    from rltbench.server.server import ServeOptions, run  # torch: loaded when the command runs

    flags["warmup_prefill_lens"] = parse_lengths(flags.pop("warmup_prefill_len"))
    code = run(ServeOptions(**flags))
    if code:
        raise typer.Exit(code=code)
