"""Plain data types of the engine API: configuration, sampling parameters, events, outputs, errors."""

from __future__ import annotations

from dataclasses import dataclass, field


class EngineRequestError(ValueError):
    """A request the engine cannot serve (empty prompt, too long, bad token ids, duplicate live id...).

    Raised by `Engine.add_request` before anything is allocated, so the engine keeps serving the rest.
    """


@dataclass
class EngineConfig:
    """Engine sizing and features.

    KV pool size, first match wins: `num_blocks` (explicit count), `kv_cache_gib`, on CUDA the free
    memory (`torch.cuda.mem_get_info`) minus `kv_headroom_gib`, on CPU `cpu_num_blocks`.
    `max_model_len` (default: the model's max_position_embeddings, capped by the pool) bounds prompt +
    output and sets the width of the decode graphs' block table; a benchmark may lower it.
    `graph_batch_sizes` (default 1, 2, 4, ... up to max_num_seqs) are the decode-graph buckets.
    `prefill_graphs` (CUDA and `use_cuda_graph` only): prefill steps replay CUDA graphs instead of
    launching ~6000 kernels each from the host. With `prefill_buckets` (the default) a step's tokens
    are padded to the next of a few token-count buckets and its rows to a fixed count, attention reads
    its row metadata on the device, and one graph per bucket (captured at warm-up) serves every step
    of any shape: session prefill runs in graphs with the arm's fused kernels. Without it, a step
    whose exact shape (rows' context start and chunk length, block-table width, finishing rows) was
    seen before is captured the second time and replayed after that; unique shapes stay eager.
    `prefill_graph_cap` exact-shape graphs per arm are kept (LRU); bucket graphs are all kept. Each
    holds only its output ids, activations come from the engine's shared graph pool (docs/engine.md).
    `max_prefill_seqs` caps the requests one prefill step packs (1: one request per step, the unpacked
    baseline of the long-prompt benchmark); None packs as many as the token budget takes.
    """

    kv_cache_gib: float | None = None
    block_size: int = 16
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    use_cuda_graph: bool = True
    # Compatible extensions (not in DESIGN.md section 3):
    num_blocks: int | None = None
    cpu_num_blocks: int = 512
    kv_headroom_gib: float = 6.0
    max_model_len: int | None = None
    graph_batch_sizes: tuple[int, ...] | None = None
    prefill_graphs: bool = True
    prefill_buckets: bool = True
    prefill_graph_cap: int = 16
    max_prefill_seqs: int | None = None  # None: a prefill step packs any number of requests

    def validate(self) -> None:
        """Raise ValueError for settings that cannot work (caught as a usage error by commands)."""
        if self.block_size < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be positive")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError("kv_cache_gib must be positive")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError("num_blocks must be positive")
        if self.graph_batch_sizes is not None and any(b < 1 for b in self.graph_batch_sizes):
            raise ValueError("graph_batch_sizes must be positive")
        if self.max_prefill_seqs is not None and self.max_prefill_seqs < 1:
            raise ValueError("max_prefill_seqs must be >= 1 (None: no limit)")
        if self.prefill_graph_cap < 1:
            raise ValueError("prefill_graph_cap must be >= 1 (prefill_graphs=False turns them off)")


@dataclass(frozen=True)
class SamplingParams:
    """Greedy decoding limits. EOS ids of the model stop a request unless `ignore_eos`;
    `stop_token_ids` always stop it. The stopping token is part of the output (as in vLLM)."""

    max_tokens: int = 16
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class TokenEvent:
    """New token(s) of one request from one `Engine.step()`; `time` is `time.perf_counter()` taken
    right after the sampled ids reached the host. `prefix_hit_tokens` (extension) repeats the
    request's prompt tokens served from the prefix cache. `exit_depths` (extension, a model with an
    exit gate only, else None): per token the loops whose output produced it (1..num_loops), because
    an adaptive-exit model's computation is its tokens and the depth each one exited at."""

    request_id: str
    token_ids: list[int]
    time: float
    finished: bool
    finish_reason: str | None = None  # "stop" | "length" when finished
    prefix_hit_tokens: int = 0
    exit_depths: list[int] | None = None


@dataclass
class RequestOutput:
    """Result of one request of `Engine.generate`; `times[i]` is when `token_ids[i]` was produced and
    `exit_depths[i]` (a model with an exit gate only) the loops it used."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    exit_depths: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    prefix_hit_tokens: int = 0
    arrival_time: float = 0.0
