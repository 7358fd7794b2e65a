"""The Engine: one model, one paged KV pool, one decode-graph set per kernel arm.

Step loop: the scheduler picks a prefill batch (chunked; eager, or a CUDA-graph replay when the
step's exact shape repeats) or a decode batch (CUDA-graph replay of the smallest bucket that fits,
padded rows have seq_len 0 and slot -1; eager when no bucket fits or graphs are off). Sampling is
greedy: one argmax over the batch's logits, inside the graph when there is one. Per step the host does
one H2D copy of packed metadata and one D2H copy of the sampled ids.
See docs/engine.md for the design and why arms share one pool.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Sequence as Seq
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from rltbench.arms import ARMS, REFERENCE, ArmSpec
from rltbench.engine import exit_stop, kv_transfer
from rltbench.engine.block_manager import BlockManager, block_hashes
from rltbench.engine.kv_capacity import blocks_in_budget
from rltbench.engine.paged_context import (
    PagedAttentionContext,
    allocate_kv_pool,
    kv_bytes_per_block,
    prefill_plan_from_host,
)
from rltbench.engine.row_invariant import DEFAULT_TILE_TOKENS, check_model, check_tile_tokens, token_tiles
from rltbench.engine.schedule import ABORT, DECODE, PREFILL, ReplayError, Schedule, StepRecord
from rltbench.engine.scheduler import DecodeBatch, PrefillBatch, Scheduler, Sequence
from rltbench.engine.types import EngineConfig, EngineRequestError, RequestOutput, SamplingParams, TokenEvent
from rltbench.errors import UsageError
from rltbench.kernels.ops import make_ops

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
MIN_LEN_CLASS = 256
# Column layout of the packed decode metadata rows: token id, position, slot, seq_len, block table...
_ID, _POS, _SLOT, _SEQ, _BT = 0, 1, 2, 3, 4
# Prefill shapes remembered for the capture-on-second-sight policy (LRU; bounds host memory when every
# step of a session has a new shape).
PREFILL_SEEN_CAP = 4096
MIN_PREFILL_BUFFER = 4096  # int64 elements of the first static prefill metadata buffer

log = logging.getLogger(__name__)
T = TypeVar("T")
# (per row (context start, chunk tokens), block-table width, indices of the rows whose prompt completes)
PrefillKey = tuple[tuple[tuple[int, int], ...], int, tuple[int, ...]]


def cuda_free_bytes(device: torch.device) -> int:
    """Free memory this process may still take on `device`: the driver's free bytes, capped by the
    process's memory fraction when one is set (``torch.cuda.set_per_process_memory_fraction``, e.g.
    by the GPU test runner's workers), minus what the allocator already holds against that cap."""
    free, total = torch.cuda.mem_get_info(device)
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if get_fraction is not None:
        fraction = float(get_fraction(device))
        if fraction < 1.0:
            free = min(free, int(fraction * total) - torch.cuda.memory_reserved(device))
    return max(0, int(free))


def _plain(stats: Any) -> Any:
    """Ops stats as JSON-friendly data, whatever container the kernels package uses."""
    for name in ("as_dict", "to_dict", "snapshot"):
        fn = getattr(stats, name, None)
        if callable(fn):
            return fn()
    if isinstance(stats, Mapping):
        return {str(k): _plain(v) for k, v in stats.items()}
    if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        return dataclasses.asdict(stats)
    if isinstance(stats, (int, float, str, bool)) or stats is None:
        return stats
    return repr(stats)


def _new_graph() -> torch.cuda.CUDAGraph:
    """A CUDA graph that keeps its cudaGraph_t after instantiation (torch >= 2.7), so the profile
    command can count its kernel nodes; plain graph on older torch."""
    try:
        return torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:
        return torch.cuda.CUDAGraph()


@dataclasses.dataclass(frozen=True)
class _PrefillStep:
    """Host view of one prefill step. Everything the device work depends on, except the values in
    the packed metadata, is a function of `key`: equal keys give identical kernels and offsets, so a
    graph captured for one step replays any later step with the same key."""

    key: PrefillKey
    qsl: list[int]
    seq_lens: list[int]
    ctx_lens: list[int]
    last_idx: list[int]
    packed: np.ndarray  # int64: ids, pos, slots [n_tok] each, qsl, seq_lens, ctx_lens, last_idx, table

    @property
    def n_tok(self) -> int:
        return self.qsl[-1]

    @property
    def nb(self) -> int:
        return len(self.seq_lens)

    @property
    def width(self) -> int:
        return self.key[1]


def prefill_replay_safe(model: torch.nn.Module) -> bool:
    """Whether a replayed prefill computes what the eager step computes. A model that declares itself
    not `prefix_cache_safe` (Huginn with state_noise "random") draws fresh RNG state per forward:
    a replay would draw from the graph's own Philox offsets, not the eager stream."""
    return bool(getattr(model, "prefix_cache_safe", True))


def prefill_key(rows: Seq[tuple[int, int]], width: int, finishing: Seq[int]) -> PrefillKey:
    """The exact shape of a prefill step: per row (context start, chunk tokens), the block-table
    width and which rows complete their prompt (they get logits)."""
    return tuple((int(a), int(n)) for a, n in rows), int(width), tuple(int(i) for i in finishing)


def _step_record(batch: PrefillBatch | DecodeBatch) -> StepRecord:
    """The record of a scheduled batch, taken before it runs (num_computed is still the chunk start)."""
    if isinstance(batch, PrefillBatch):
        return StepRecord(
            PREFILL,
            tuple(
                (seq.request_id, seq.num_computed, n, seq.num_computed + n == seq.prompt_len)
                for seq, n in batch.chunks
            ),
        )
    return StepRecord(DECODE, tuple((seq.request_id,) for seq in batch.seqs))


def _synthetic_prefill(key: PrefillKey) -> _PrefillStep:
    """A step of shape `key` that touches no KV: token ids 0, slots -1, block tables 0 (warm-up)."""
    rows, width, finishing = key
    qsl, seq_lens, ctx_lens = [0], [], []
    for start, n in rows:
        qsl.append(qsl[-1] + n)
        seq_lens.append(start + n)
        ctx_lens.append(start)
    last_idx = [qsl[r + 1] - 1 for r in finishing]
    n_tok = qsl[-1]
    pos = np.concatenate([np.arange(a, a + n, dtype=np.int64) for a, n in rows])
    meta = np.asarray(qsl + seq_lens + ctx_lens + last_idx, np.int64)
    packed = np.concatenate(
        [
            np.zeros(n_tok, np.int64),
            pos,
            np.full(n_tok, -1, np.int64),
            meta,
            np.zeros(len(rows) * width, np.int64),
        ]
    )
    return _PrefillStep(key, qsl, seq_lens, ctx_lens, last_idx, packed)


class PrefillGraphSet:
    """One arm's captured prefill graphs (LRU, at most `cap`) and the policy that fills it: a shape is
    captured the second time it is seen, so a repeating burst gets replays while sessions of unique
    shapes stay eager and pay no capture. Keys whose capture failed stay eager for good."""

    def __init__(self, cap: int, seen_cap: int = PREFILL_SEEN_CAP) -> None:
        self.cap = cap
        self.seen_cap = seen_cap
        self.graphs: OrderedDict[PrefillKey, tuple[Any, Tensor | None]] = OrderedDict()
        self.seen: OrderedDict[PrefillKey, int] = OrderedDict()
        self.bad: set[PrefillKey] = set()

    def get(self, key: PrefillKey) -> tuple[Any, Tensor | None] | None:
        """The captured graph for `key` (marked most recently used), or None."""
        entry = self.graphs.get(key)
        if entry is not None:
            self.graphs.move_to_end(key)
        return entry

    def should_capture(self, key: PrefillKey) -> bool:
        """Count one sighting of an uncaptured `key`; True from the second sighting on."""
        n = self.seen.pop(key, 0) + 1
        self.seen[key] = n
        while len(self.seen) > self.seen_cap:
            self.seen.popitem(last=False)
        return n >= 2 and key not in self.bad

    def put(self, key: PrefillKey, entry: tuple[Any, Tensor | None]) -> None:
        """Keep a new graph, evicting the least recently used beyond `cap` (its pool memory is reused)."""
        self.graphs[key] = entry
        self.graphs.move_to_end(key)
        while len(self.graphs) > self.cap:
            self.graphs.popitem(last=False)

    def clear(self) -> None:
        """Drop the graphs (their static input moved); sighting counts stay, so hot keys recapture."""
        self.graphs.clear()


class _ArmState:
    """Ops, the graph sets (decode and prefill) and the counters of one arm."""

    def __init__(self, name: str, ops: Any, warm_ops: Any, prefill_graph_cap: int = 16) -> None:
        self.name = name
        self.ops = ops
        self.warm_ops = warm_ops  # fused paths on in eager mode: compiles Triton kernels before capture
        # decode graphs: a CUDA graph, or with the compute-saving exit an exit_stop.StagedDecodeGraphs
        self.graphs: dict[tuple[int, int], tuple[Any, Tensor]] = {}
        self.prefill = PrefillGraphSet(prefill_graph_cap)
        self.counters: dict[str, Any] = {}
        self.reset_counters()

    def reset_counters(self) -> None:
        self.counters = dict(
            steps=0,
            prefill_steps=0,
            decode_steps=0,
            prefill_tokens=0,
            decode_tokens=0,
            graph_replays=0,
            graph_captures=0,
            eager_fallbacks=0,
            prefill_graph_replays=0,
            prefill_graph_captures=0,
            prefill_graph_failures=0,
            prefill_eager=0,
            row_invariant_tiles=0,
            frozen_graph_misses=0,
            buffer_growths=0,
            batch_size_hist={},
            decode_loops_hist={},  # compute-saving exit only: loops run -> decode steps
        )


class Engine:
    """Serving engine (API: docs/DESIGN.md section 3)."""

    def __init__(
        self,
        model: torch.nn.Module,
        arms: Mapping[str, Any] | Iterable[str] | None = None,
        config: EngineConfig | None = None,
    ) -> None:
        self.model = model
        self.config = cfg = config or EngineConfig()
        try:
            cfg.validate()
        except ValueError as e:
            raise UsageError(str(e)) from None
        mc = model.config
        if cfg.enable_prefix_caching:
            self._check_prefix_cache_safe()
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.vocab_size = int(mc.vocab_size)
        # a model with an exit gate (Ouro with a threshold) reports each token's exit depth; read once,
        # because the captured graphs include the gate or not
        self.track_exit_depths = getattr(model, "exit_threshold", None) is not None
        # Ouro's compute-saving exit: decode steps run loop by loop and stop once every row has exited
        # (rltbench.engine.exit_stop); prefill steps run every loop. `set_stop_at_exit` switches modes.
        self.stop_at_exit = self.track_exit_depths and bool(getattr(mc, "stop_at_exit", False))
        self.last_replay_depths: dict[str, list[int]] = {}
        self.eos_token_ids = frozenset(int(t) for t in (getattr(mc, "eos_token_ids", None) or ()))
        self._arms = self._build_arms(arms)
        self._arm = next(iter(self._arms.values()))
        # the arm states of each exit mode: a graph captures one mode's work, so each mode keeps its own
        # graph sets and counters (the other mode's are made on the first switch)
        self._arm_sets: dict[bool, dict[str, _ArmState]] = {self.stop_at_exit: self._arms}

        # ---- KV pool ------------------------------------------------------------------------
        bs = cfg.block_size
        planes, hkv, hd = int(mc.num_kv_planes), int(mc.num_kv_heads), int(mc.head_dim)
        bpb = kv_bytes_per_block(planes, bs, hkv, hd, self.dtype)
        if cfg.num_blocks is not None:
            n, budget = cfg.num_blocks, "num_blocks"
        elif cfg.kv_cache_gib is not None:
            n = blocks_in_budget(cfg.kv_cache_gib * 2**30, bpb)
            budget = f"--kv-cache-gib {cfg.kv_cache_gib:g} ({cfg.kv_cache_gib * 2**30:,.0f} bytes)"
        elif self.device.type == "cuda":
            free = cuda_free_bytes(self.device)
            n = blocks_in_budget(free - cfg.kv_headroom_gib * 2**30, bpb)
            budget = f"free GPU memory {free / 2**30:.1f} GiB minus {cfg.kv_headroom_gib:g} GiB headroom"
        else:
            n, budget = cfg.cpu_num_blocks, "cpu_num_blocks"
        if n < 1:
            raise UsageError(
                f"KV pool too small: one block of {bs} tokens needs {bpb:,} bytes "
                f"({planes} planes x K,V x {hkv} heads x {hd}), more than {budget}"
            )
        self.num_blocks = n
        self.kv_bytes_per_token = bpb // bs
        self.kv = allocate_kv_pool(planes, n, bs, hkv, hd, self.dtype, self.device)
        max_pos = int(mc.max_position_embeddings)
        if cfg.max_model_len is not None and cfg.max_model_len > max_pos:
            raise UsageError(f"max_model_len {cfg.max_model_len} exceeds the model's context {max_pos}")
        self.max_model_len = min(cfg.max_model_len or max_pos, n * bs)
        self.max_blocks_per_seq = -(-self.max_model_len // bs)
        self.blocks = BlockManager(n, bs, cfg.enable_prefix_caching)
        self.scheduler = Scheduler(self.blocks, cfg.max_num_seqs, cfg.max_num_batched_tokens,
                                   cfg.max_prefill_seqs)
        self._live: dict[str, Sequence] = {}
        self._held: dict[str, Sequence] = {}  # prefilled for export, blocks kept (add_prefill_request)
        self._seq_counter = 0

        # ---- decode graphs and static metadata ------------------------------------------------
        self.use_graphs = bool(cfg.use_cuda_graph) and self.device.type == "cuda"
        if cfg.graph_batch_sizes is not None:
            buckets = sorted(set(cfg.graph_batch_sizes))
        else:
            buckets = [b for b in DEFAULT_BUCKETS if b < cfg.max_num_seqs]
            buckets += [b for b in DEFAULT_BUCKETS if b >= cfg.max_num_seqs][:1]
        self.buckets = buckets
        rows = max(max(buckets), 1)
        self._meta_rows = rows
        pin = self.device.type == "cuda"
        self._meta_host = torch.zeros(rows, _BT + self.max_blocks_per_seq, dtype=torch.int32, pin_memory=pin)
        self._meta_np = self._meta_host.numpy()
        self._meta_dev = torch.zeros(self._meta_host.shape, dtype=torch.int32, device=self.device)
        self._decode_key: tuple[int, ...] | None = None  # batch whose block tables are in _meta_host
        self._graph_pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self._bench_active = False
        # ---- prefill graphs: one static int64 metadata buffer, graphs per arm keyed by step shape ---
        self.use_prefill_graphs = self.use_graphs and cfg.prefill_graphs and prefill_replay_safe(model)
        self._pf_dev = torch.zeros(self._prefill_buffer_elems(), dtype=torch.int64, device=self.device)
        self._pf_warned = False
        # frozen: no graph is captured (a missing decode bucket or prefill shape runs eagerly and is
        # counted), so a timed window never pays a capture; see `freeze`
        self.frozen = False
        self._recording: Schedule | None = None
        self._eager_ops: Any = None  # replay: the ops eager steps use instead of the arm's
        self._row_tile: int | None = None  # row-invariant prefill: tokens per forward (`row_invariant`)

    def _check_prefix_cache_safe(self) -> None:
        """Refuse the prefix cache for a Huginn model whose initial state is drawn per forward: a
        cached prefix would keep another forward's random state."""
        if getattr(self.model.config, "family", "") == "huginn" and not getattr(
            self.model, "prefix_cache_safe", False
        ):
            raise UsageError(
                "prefix caching is unsafe for this Huginn model (random state per forward); "
                "disable it (enable_prefix_caching=False) or make the model prefix_cache_safe"
            )

    def _prefill_buffer_elems(self) -> int:
        """Int64 elements of the largest prefill step's packed metadata (ids, positions, slots per
        token; qsl, seq_lens, ctx_lens, last_idx per row; block tables), allocated once: growing the
        buffer later drops every captured prefill graph, which a measured window must never pay."""
        cfg = self.config
        rows = min(cfg.max_num_seqs, cfg.max_num_batched_tokens)
        need = 3 * cfg.max_num_batched_tokens + 4 * rows + 1 + rows * self.max_blocks_per_seq
        return max(MIN_PREFILL_BUFFER, 1 << (need - 1).bit_length())

    # ---- arms ---------------------------------------------------------------------------------
    def _build_arms(self, arms: Mapping[str, Any] | Iterable[str] | None) -> dict[str, _ArmState]:
        """One _ArmState per arm: an ArmSpec (or an arm name) becomes its Ops and the same ops with
        scope "all" (warm_ops); an Ops object given directly serves as both."""
        if arms is None:
            arms = {REFERENCE: ARMS[REFERENCE]}
        elif not isinstance(arms, Mapping):
            names = list(arms)
            unknown = [a for a in names if a not in ARMS]
            if unknown:
                raise UsageError(f"unknown arm(s) {unknown}; known: {sorted(ARMS)}")
            arms = {a: ARMS[a] for a in names}
        if not arms:
            raise UsageError("at least one arm is needed")
        out = {}
        for name, spec in arms.items():
            if isinstance(spec, ArmSpec):
                ops, warm = make_ops(spec), make_ops(spec.replace(scope="all"))
            else:
                ops = warm = spec
            out[name] = _ArmState(name, ops, warm, self.config.prefill_graph_cap)
        return out

    @property
    def arm(self) -> str:
        return self._arm.name

    @property
    def arm_names(self) -> list[str]:
        return list(self._arms)

    @property
    def ops(self) -> Any:
        return self._arm.ops

    def set_arm(self, name: str) -> None:
        """Switch ops and graph set. The KV pool and prefix cache are reset: arms never share cache
        contents (each arm must compute its own KV; docs/engine.md)."""
        if name not in self._arms:
            raise UsageError(f"unknown arm {name!r}; this engine has {list(self._arms)}")
        if self.has_unfinished() or self._bench_active:
            raise RuntimeError("set_arm needs an idle engine (finish or abort requests, release benchmarks)")
        self._arm = self._arms[name]
        self.reset_prefix_cache()

    # ---- requests -----------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_ids: Seq[int] | Tensor,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request; raises EngineRequestError (nothing allocated) for bad input."""
        params = params or SamplingParams()
        if request_id in self._live:
            raise EngineRequestError(f"request id {request_id!r} is already live")
        if isinstance(prompt_ids, Tensor):
            prompt_ids = prompt_ids.reshape(-1).tolist()
        try:
            prompt = [int(t) for t in prompt_ids]
        except (TypeError, ValueError):
            raise EngineRequestError(
                f"request {request_id!r}: prompt must be a sequence of token ids"
            ) from None
        if not prompt:
            raise EngineRequestError(f"request {request_id!r}: empty prompt")
        if params.max_tokens < 1:
            raise EngineRequestError(
                f"request {request_id!r}: max_tokens must be >= 1, got {params.max_tokens}"
            )
        lo, hi = min(prompt), max(prompt)
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            raise EngineRequestError(f"request {request_id!r}: token id {bad} outside [0, {self.vocab_size})")
        if len(prompt) > self.max_model_len:
            raise EngineRequestError(
                f"request {request_id!r}: prompt of {len(prompt)} tokens exceeds the "
                f"context of {self.max_model_len} tokens (model or KV pool)"
            )
        max_new = min(params.max_tokens, self.max_model_len - len(prompt) + 1)
        stop = frozenset(int(t) for t in params.stop_token_ids)
        if not params.ignore_eos:
            stop |= self.eos_token_ids
        seq = Sequence(
            request_id,
            prompt,
            params,
            stop,
            max_new,
            time.perf_counter() if arrival_time is None else arrival_time,
        )
        if self.scheduler.blocks_for(seq) > self.num_blocks:
            raise EngineRequestError(
                f"request {request_id!r}: prompt + max_tokens needs "
                f"{self.scheduler.blocks_for(seq)} KV blocks, the pool has {self.num_blocks}"
            )
        self._seq_counter += 1
        seq.seq_no = self._seq_counter
        if self.blocks.enable_prefix_caching:
            seq.hashes = block_hashes(prompt, self.config.block_size)
        self._live[request_id] = seq
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> bool:
        """Cancel a live request and return its blocks; False if the id is not live."""
        seq = self._live.pop(request_id, None)
        if seq is None:
            return False
        if self._recording is not None:
            self._recording.steps.append(StepRecord(ABORT, ((request_id,),)))
        seq.finish_reason = "abort"
        self.scheduler.finish(seq)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def reset_prefix_cache(self) -> None:
        self.blocks.reset_prefix_cache()

    @property
    def prefix_caching(self) -> bool:
        """Whether admitted requests may reuse cached prompt blocks (now; see `set_prefix_caching`)."""
        return self.blocks.enable_prefix_caching

    def set_stop_at_exit(self, enabled: bool) -> None:
        """Turn Ouro's compute-saving exit on or off on an idle engine, so one engine, one pool and one
        model serve both modes of a load interleaved (`e2e --exit-mode all,stop`). Each mode has its
        own graph sets and counters per arm (a graph holds one mode's work); the prefix cache is
        emptied, because a cached block's generated tokens hold one mode's K/V."""
        enabled = bool(enabled)
        if enabled == self.stop_at_exit:
            return
        if enabled and not self.track_exit_depths:
            raise UsageError("the compute-saving exit needs an Ouro model with an exit threshold "
                             "(--exit-threshold)")
        if self.has_unfinished() or self._bench_active:
            raise RuntimeError("set_stop_at_exit needs an idle engine")
        states = self._arm_sets.get(enabled)
        if states is None:
            cap = self.config.prefill_graph_cap
            states = self._arm_sets[enabled] = {n: _ArmState(n, a.ops, a.warm_ops, cap)
                                                for n, a in self._arms.items()}
        self._arms, self._arm = states, states[self._arm.name]
        self.stop_at_exit = enabled
        self.reset_prefix_cache()

    def _mode_kwargs(self) -> dict[str, bool]:
        """The exit mode a model forward runs in (Ouro with a threshold only: the compute-saving
        exit computes the exit loop by loop, in prefill too)."""
        return {"stepwise": self.stop_at_exit} if self.track_exit_depths else {}

    def _all_arm_states(self) -> list[_ArmState]:
        return [a for states in self._arm_sets.values() for a in states.values()]

    def set_prefix_caching(self, enabled: bool) -> None:
        """Turn the prefix cache on or off on an idle engine (the cache is emptied), so one engine, one
        pool and one graph set serve a load with the cache on and off alike: the two settings then
        differ in nothing else."""
        if enabled == self.prefix_caching:
            return
        if self.has_unfinished() or self._bench_active:
            raise RuntimeError("set_prefix_caching needs an idle engine")
        if enabled:
            self._check_prefix_cache_safe()
        self.reset_prefix_cache()
        self.blocks.enable_prefix_caching = enabled

    # ---- schedules: record one arm's batches, replay them on another ------------------------------
    def start_recording(self) -> None:
        """Record every step from now on (cheap: one tuple per step), for `stop_recording`."""
        clean = self.blocks.num_cached_blocks == 0 and not self.has_unfinished()
        self._recording = Schedule(clean_start=clean, prefix_caching=self.prefix_caching)

    def stop_recording(self) -> Schedule:
        """The steps run since `start_recording` (recording stops)."""
        rec, self._recording = self._recording, None
        if rec is None:
            raise RuntimeError("stop_recording without start_recording")
        return rec

    def replay(
        self,
        schedule: Schedule,
        prompts: Mapping[str, Seq[int]],
        max_tokens: Mapping[str, int],
        eager_ops: Any = None,
        row_invariant_tile: int | None = None,
    ) -> dict[str, list[int]]:
        """Run the current arm through exactly the batches of `schedule` (recorded on any arm of this
        engine, from an empty prefix cache) and return each request's generated ids (and, with an exit
        gate, their exit depths in `last_replay_depths`).

        `prompts` and `max_tokens` (the request's SamplingParams.max_tokens when it was recorded: it
        sizes its KV blocks, so the pool and prefix cache evolve as they did) are keyed by the
        schedule's request ids. Each request stops where the recorded run stopped it, whatever it
        generates. Graphs are replayed where captured and never captured here; eager steps use
        `eager_ops` when given (e.g. the arm's kernels forced on outside graphs, so prefill is
        compared too). A schedule recorded with the prefix cache on replays on an engine with it off
        as `Schedule.recomputing_prefix_hits` (each hit prefix computed in a step of its own).
        `row_invariant_tile` runs every prefill step under `row_invariant` with that tile size.
        Raises ReplayError when the schedule cannot be reproduced."""
        if self.has_unfinished() or self._bench_active:
            raise RuntimeError("replay needs an idle engine")
        if not schedule.clean_start:
            raise ReplayError("the schedule was recorded on a warm prefix cache and cannot be replayed")
        if row_invariant_tile is not None:
            with self.row_invariant(row_invariant_tile):
                return self.replay(schedule, prompts, max_tokens, eager_ops)
        if not self.prefix_caching:
            schedule = schedule.recomputing_prefix_hits()
        self.reset_prefix_cache()
        self.last_replay_depths = {}
        emitted = schedule.emitted()
        aborted = {st.rows[0][0] for st in schedule.steps if st.kind == ABORT}
        seqs: dict[str, Sequence] = {}
        out: dict[str, list[int]] = {}
        frozen, self.frozen, self._eager_ops = self.frozen, True, eager_ops
        try:
            for i, st in enumerate(schedule.steps):
                if st.kind == ABORT:
                    self.abort_request(st.rows[0][0])
                    continue
                if st.kind == DECODE:
                    batch: PrefillBatch | DecodeBatch = DecodeBatch([seqs[r[0]] for r in st.rows])
                else:
                    chunks = []
                    for rid, start, n, _done in st.rows:
                        if rid not in seqs:
                            seqs[rid] = self._admit_replayed(
                                rid, prompts[rid], max_tokens[rid], emitted.get(rid, 0), rid in aborted
                            )
                        seq = seqs[rid]
                        if seq.num_computed != start:
                            raise ReplayError(
                                f"step {i}: request {rid} starts at token {seq.num_computed}, recorded "
                                f"{start} (prefix cache differs from the recorded run)"
                            )
                        chunks.append((seq, n))
                    batch = PrefillBatch(chunks)
                for ev in self._run_batch(batch):
                    out.setdefault(ev.request_id, []).extend(ev.token_ids)
                    if ev.exit_depths is not None:
                        self.last_replay_depths.setdefault(ev.request_id, []).extend(ev.exit_depths)
        finally:
            self.frozen, self._eager_ops = frozen, None
            for rid in [r for r in seqs if r in self._live]:
                self.abort_request(rid)
        return out

    def _admit_replayed(
        self, rid: str, prompt: Seq[int], max_tokens: int, emitted: int, aborted: bool
    ) -> Sequence:
        """Queue and admit a replayed request with the recorded block budget (`max_tokens`), then make
        it finish after `emitted` tokens (or run on until its recorded abort) and ignore stop ids."""
        self.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        seq = self._live[rid]
        if not self.scheduler.admit(seq):
            raise ReplayError(f"request {rid} could not be admitted where the recorded run admitted it")
        seq.max_new = emitted + 1 if aborted else emitted
        seq.stop_ids = frozenset()
        return seq

    @contextlib.contextmanager
    def row_invariant(self, tile_tokens: int = DEFAULT_TILE_TOKENS) -> Iterator[None]:
        """Within the block every prefill step runs eagerly as forwards of exactly `tile_tokens`
        tokens with one-query attention per token (rltbench.engine.row_invariant), so a token's K/V
        and logits do not depend on the step's other rows or chunking. Decode steps are unchanged.
        Refused (UsageError) for a model whose K/V depend on the tiling (Huginn "compress")."""
        check_tile_tokens(tile_tokens)
        check_model(self.model)
        prev, self._row_tile = self._row_tile, tile_tokens
        try:
            yield
        finally:
            self._row_tile = prev

    @property
    def fused_ops(self) -> Any:
        """The current arm's ops with its kernels on outside CUDA graphs too (scope "all"): what a
        replay's eager steps use, so prefill steps compare the kernels and not the reference ops."""
        return self._arm.warm_ops

    def freeze(self, frozen: bool = True) -> None:
        """Forbid (or allow again) graph captures: a frozen engine replays the graphs it holds and runs
        everything else eagerly, counted. Timed windows run frozen after a warm-up that covered
        their shapes, so none of them pays a capture."""
        self.frozen = frozen

    # ---- stepping -----------------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        """Run one scheduled batch; returns one event per request that produced a token."""
        if self._bench_active:
            raise RuntimeError("a decode benchmark holds the engine's buffers; release() it first")
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        return self._run_batch(batch)

    def _run_batch(self, batch: PrefillBatch | DecodeBatch) -> list[TokenEvent]:
        if self._recording is not None:
            self._recording.steps.append(_step_record(batch))
        c = self._arm.counters
        c["steps"] += 1
        with torch.no_grad():
            if isinstance(batch, PrefillBatch):
                c["prefill_steps"] += 1
                c["prefill_tokens"] += batch.num_tokens
                return self._prefill(batch)
            c["decode_steps"] += 1
            return self._decode(batch)

    def _emit(
        self, seqs: list[Sequence], tokens: list[int], depths: list[int] | None = None
    ) -> list[TokenEvent]:
        now = time.perf_counter()
        events = []
        for i, (seq, tok) in enumerate(zip(seqs, tokens, strict=True)):
            seq.output.append(tok)
            seq.times.append(now)
            if tok in seq.stop_ids:
                seq.finish_reason = "stop"
            elif len(seq.output) >= seq.max_new:
                seq.finish_reason = "length"
            done = seq.finish_reason is not None
            if done:
                if seq.hold_kv:
                    self._hold(seq)
                else:
                    self.scheduler.finish(seq)
                del self._live[seq.request_id]
            events.append(
                TokenEvent(seq.request_id, [tok], now, done, seq.finish_reason, seq.prefix_hit_tokens,
                           None if depths is None else [depths[i]])
            )
        return events

    def _prefill(self, batch: PrefillBatch) -> list[TokenEvent]:
        step, done = self._prefill_layout(batch)
        tokens, depths = self._prefill_run(step)
        for seq, n in batch.chunks:
            seq.num_computed += n
            self.scheduler.register_computed_blocks(seq)
        return self._emit(done, tokens, depths)

    def _prefill_layout(self, batch: PrefillBatch) -> tuple[_PrefillStep, list[Sequence]]:
        """Host work of a prefill step: its shape key and packed int64 metadata (no device work), plus
        the sequences whose prompt completes (they get a token)."""
        bs = self.config.block_size
        ids, pos, slots, qsl, seq_lens, ctx_lens, last_idx, done = [], [], [], [0], [], [], [], []
        rows, finishing = [], []
        width = 1
        for r, (seq, n) in enumerate(batch.chunks):
            start = seq.num_computed
            p = np.arange(start, start + n, dtype=np.int64)
            assert seq.block_arr is not None
            ids.append(np.asarray(seq.prompt[start : start + n], dtype=np.int64))
            pos.append(p)
            slots.append(seq.block_arr[p // bs].astype(np.int64) * bs + p % bs)
            qsl.append(qsl[-1] + n)
            seq_lens.append(start + n)
            ctx_lens.append(start)
            rows.append((start, n))
            width = max(width, -(-(start + n) // bs))
            if start + n == seq.prompt_len:
                last_idx.append(qsl[-1] - 1)
                finishing.append(r)
                done.append(seq)
        bt = np.zeros((len(batch.chunks), width), dtype=np.int64)
        for i, (seq, _) in enumerate(batch.chunks):
            assert seq.block_arr is not None
            k = min(width, len(seq.block_arr))
            bt[i, :k] = seq.block_arr[:k]
        packed = np.concatenate(
            [*ids, *pos, *slots, np.asarray(qsl + seq_lens + ctx_lens + last_idx, np.int64), bt.reshape(-1)]
        )
        key = prefill_key(rows, width, finishing)
        return _PrefillStep(key, qsl, seq_lens, ctx_lens, last_idx, packed), done

    def _prefill_run(self, step: _PrefillStep) -> tuple[list[int], list[int] | None]:
        """Upload the step's metadata into the static buffer, then replay its graph, capture it (second
        sighting of the shape) or run eagerly; returns the sampled ids of the finishing rows (and their
        exit depths, see `_to_host`)."""
        arm = self._arm
        c = arm.counters
        if self._row_tile is not None:
            return self._to_host(self._prefill_tiled(step, self._eager_ops or arm.ops, self._row_tile))
        self._upload_prefill(step.packed)
        entry = None
        if self.use_prefill_graphs:
            entry = arm.prefill.get(step.key)
            if entry is None and not self.frozen and arm.prefill.should_capture(step.key):
                entry = self._capture_prefill(step)
        if entry is None:
            c["prefill_eager"] += 1
            out = self._prefill_forward(step, self._eager_ops or arm.ops)
        else:
            graph, out = entry
            graph.replay()
            c["prefill_graph_replays"] += 1
        return self._to_host(out)

    def _with_depths(self, ids: Tensor, rows: Tensor | None = None) -> Tensor:
        """The step's device output: the sampled ids [rows], or with an exit gate [2, rows] = ids and
        the loops each row's token used (1-based; `rows` picks the rows of the last forward), so one
        device-to-host copy brings both and a captured graph keeps both in its output."""
        if not self.track_exit_depths:
            return ids
        depths = self.model.last_exit_depths
        if rows is not None:
            depths = depths[rows]
        return torch.stack((ids, depths + 1))

    def _to_host(self, out: Tensor | None, rows: int | None = None) -> tuple[list[int], list[int] | None]:
        """(ids, exit depths or None) of the first `rows` rows (all by default) of a step's output."""
        if out is None:
            return [], None
        if not self.track_exit_depths:
            return out[:rows].tolist(), None
        ids, depths = out[:, :rows].tolist()
        return ids, depths

    def _upload_prefill(self, packed: np.ndarray) -> None:
        """Copy the packed metadata into the static device buffer (pinned, non-blocking on CUDA: the
        caching host allocator keeps the pinned block until the copy is done)."""
        if packed.size > self._pf_dev.numel():
            self._grow_prefill_buffer(packed.size)
        host = torch.from_numpy(packed)
        if self.device.type == "cuda":
            host = host.pin_memory()
        self._pf_dev[: packed.size].copy_(host, non_blocking=True)

    def _grow_prefill_buffer(self, need: int) -> None:
        """A bigger static prefill buffer (next power of two); every arm's prefill graphs read the old
        one, so they are dropped (hot shapes recapture on their next sighting)."""
        size = max(MIN_PREFILL_BUFFER, 1 << (need - 1).bit_length())
        self._pf_dev = torch.zeros(size, dtype=torch.int64, device=self.device)
        self._arm.counters["buffer_growths"] += 1
        for arm in self._all_arm_states():
            arm.prefill.clear()

    def _prefill_forward(self, step: _PrefillStep, ops: Any) -> Tensor | None:
        """The device work of a prefill step, reading only the static buffer and host values fixed by
        the step's key (captured as-is into the prefill graphs); returns the argmax ids of the
        finishing rows (int64), None when no row finishes."""
        n, nb = step.n_tok, step.nb
        parts = self._pf_dev[: step.packed.size].split(
            [n, n, n, nb + 1, nb, nb, len(step.last_idx), nb * step.width]
        )
        t_ids, t_pos, t_slots, qsl, seq, ctx_lens, t_last, bt = parts
        t_bt = bt.view(nb, step.width).to(torch.int32)
        plan = prefill_plan_from_host(t_bt, step.qsl, step.ctx_lens, step.seq_lens, self.config.block_size, n)
        ctx = PagedAttentionContext(
            self.kv,
            t_slots,
            t_bt,
            seq.to(torch.int32),
            qsl.to(torch.int32),
            ctx_lens.to(torch.int32),
            max(step.seq_lens),
            _prefill_plan=plan,
        )
        hidden = self.model.forward(t_ids, t_pos, ctx, ops, **self._mode_kwargs())
        if not step.last_idx:
            return None
        return self._with_depths(self.model.compute_logits(hidden[t_last]).argmax(-1), t_last)

    def _prefill_tiled(self, step: _PrefillStep, ops: Any, tile: int) -> Tensor | None:
        """The row-invariant prefill step (`row_invariant`): forwards of `tile` one-query rows with the
        full block-table width and attention length, so every kernel sees one shape; the head runs on
        whole tiles too. Returns what `_prefill_forward` returns."""
        n, nb, w, p = step.n_tok, step.nb, step.width, step.packed
        width, bs = self.max_blocks_per_seq, self.config.block_size
        rows_of = np.repeat(np.arange(nb), np.diff(step.qsl))
        ids, pos, slots, tables = p[:n], p[n : 2 * n], p[2 * n : 3 * n], p[p.size - nb * w :].reshape(nb, w)
        outs = []
        for t in token_tiles(ids, pos, slots, rows_of, tables, step.last_idx, tile, width):
            self._arm.counters["row_invariant_tiles"] += 1
            t_ids, t_pos, t_slots, t_seq, t_bt = torch.from_numpy(t.packed).to(self.device).split(
                [tile, tile, tile, tile, tile * width]
            )
            ctx = PagedAttentionContext(
                self.kv, t_slots, t_bt.view(tile, width).to(torch.int32), t_seq.to(torch.int32),
                max_seq_len_hint=width * bs,
            )
            hidden = self.model.forward(t_ids, t_pos, ctx, ops, **self._mode_kwargs())
            if t.finishing:
                rows = torch.tensor(t.finishing, dtype=torch.int64, device=self.device)
                outs.append(self._with_depths(self.model.compute_logits(hidden).argmax(-1)[rows], rows))
        return torch.cat(outs, dim=-1) if outs else None

    def _capture_prefill(self, step: _PrefillStep) -> tuple[Any, Tensor | None] | None:
        """Capture the current arm's prefill graph for `step.key` (its metadata is in the static buffer:
        the warm-up runs write the same KV slots that the replay then writes again). Any failure marks
        the key uncapturable (logged once per engine) and returns None: the step runs eagerly."""
        arm = self._arm
        try:
            entry = self._capture_graph(lambda ops: self._prefill_forward(step, ops))
        except Exception as exc:  # never a crash or a wrong answer: the step runs eagerly
            arm.prefill.bad.add(step.key)
            arm.counters["prefill_graph_failures"] += 1
            if not self._pf_warned:
                self._pf_warned = True
                log.warning(
                    "prefill graph capture failed (%s: %s); such steps run eagerly",
                    type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "",
                )
            return None
        arm.prefill.put(step.key, entry)
        arm.counters["prefill_graph_captures"] += 1
        return entry

    def len_class(self, max_seq_len: int) -> int:
        """Decode context class: the smallest power of two >= max_seq_len (at least MIN_LEN_CLASS),
        capped at the block-table width. Decode graphs are captured per (bucket, class) and attention
        covers only the class's positions, so short contexts do not pay for max_model_len."""
        top = self.max_blocks_per_seq * self.config.block_size
        c = max(MIN_LEN_CLASS, self.config.block_size)
        while c < max_seq_len:
            c *= 2
        return min(c, top)

    def eager_len(self, max_seq_len: int) -> int:
        """Eager decode covers just the blocks in use (no shape needs to stay fixed)."""
        bs = self.config.block_size
        return -(-max_seq_len // bs) * bs

    def len_classes(self, max_context: int | None = None) -> list[int]:
        """Every class up to the one of `max_context` (default max_model_len)."""
        last = self.len_class(max_context or self.max_model_len)
        out = [self.len_class(1)]
        while out[-1] < last:
            out.append(self.len_class(out[-1] + 1))
        return out

    def graph_bucket(self, n: int) -> int | None:
        """The smallest decode graph bucket that holds `n` rows (None: larger than every bucket)."""
        for b in self.buckets:
            if b >= n:
                return b
        return None

    def _fill_decode_rows(self, seqs: list[Sequence], rows: int) -> int:
        """Write the decode metadata of `seqs` (+ padding up to `rows`) into the pinned host buffer;
        returns the batch's longest seq_len."""
        bs = self.config.block_size
        m = self._meta_np
        b = len(seqs)
        key = tuple(s.seq_no for s in seqs)
        if key != self._decode_key:
            for i, seq in enumerate(seqs):
                arr = seq.block_arr
                assert arr is not None
                m[i, _BT : _BT + len(arr)] = arr
            self._decode_key = key
        pos = [len(s.prompt) + len(s.output) - 1 for s in seqs]
        m[:b, _ID] = [s.output[-1] for s in seqs]
        m[:b, _POS] = pos
        m[:b, _SLOT] = [s.blocks[p // bs] * bs + p % bs for s, p in zip(seqs, pos, strict=True)]
        m[:b, _SEQ] = [p + 1 for p in pos]
        if rows > b:
            m[b:rows, _ID:_BT] = (0, 0, -1, 0)
        return max(pos) + 1

    def _decode_inputs(self, rows: int, len_class: int) -> tuple[Tensor, Tensor, PagedAttentionContext]:
        """Token ids, positions and the attention context of `rows` decode rows (every seq_len <=
        len_class), read from the static device metadata."""
        meta = self._meta_dev[:rows]
        width = -(-len_class // self.config.block_size)
        ctx = PagedAttentionContext(
            self.kv,
            meta[:, _SLOT].long(),
            meta[:, _BT : _BT + width].contiguous(),
            meta[:, _SEQ].contiguous(),
            max_seq_len_hint=len_class,
        )
        return meta[:, _ID].long(), meta[:, _POS].long(), ctx

    def _decode_forward(self, rows: int, ops: Any, len_class: int) -> Tensor:
        """Decode `rows` rows (every seq_len <= len_class) from the static device metadata; returns the
        argmax ids [rows] (int64; with an exit gate [2, rows], see `_with_depths`). Captured as-is into
        the CUDA graphs."""
        ids, pos, ctx = self._decode_inputs(rows, len_class)
        hidden = self.model.forward(ids, pos, ctx, ops, **self._mode_kwargs())
        return self._with_depths(self.model.compute_logits(hidden).argmax(-1))

    def _staged_decode(self, rows: int, ops: Any, len_class: int) -> exit_stop.StagedDecode:
        """`_decode_forward` as the stages of the compute-saving exit (`stop_at_exit`)."""
        return exit_stop.staged_decode(self.model, self.kv, lambda: self._decode_inputs(rows, len_class), ops,
                                       self._with_depths)

    def _upload(self, rows: int) -> None:
        self._meta_dev[:rows].copy_(self._meta_host[:rows], non_blocking=True)

    def _decode(self, batch: DecodeBatch) -> list[TokenEvent]:
        seqs = batch.seqs
        b = len(seqs)
        c = self._arm.counters
        hist = c["batch_size_hist"]
        hist[b] = hist.get(b, 0) + 1
        c["decode_tokens"] += b
        bucket = self.graph_bucket(b) if self.use_graphs else None
        rows = bucket or b
        if rows > self._meta_rows:  # eager batch larger than the static buffers
            self._grow_meta(rows)
        max_len = self._fill_decode_rows(seqs, rows)
        self._upload(rows)
        entry = self._graph(bucket, self.len_class(max_len)) if bucket is not None else None
        loops: int | None = None
        if entry is not None:
            graph, out = entry
            loops = graph.replay()  # loops run (a compute-saving step); None for a plain graph
            c["graph_replays"] += 1
        else:
            ops, len_class = self._eager_ops or self._arm.ops, self.eager_len(max_len)
            if self.stop_at_exit:
                out, loops = exit_stop.run_eagerly(self._staged_decode(rows, ops, len_class))
            else:
                out = self._decode_forward(rows, ops, len_class)
            if self.use_graphs:
                c["eager_fallbacks"] += 1
        if loops is not None:
            hist = c["decode_loops_hist"]
            hist[loops] = hist.get(loops, 0) + 1
        return self._emit(seqs, *self._to_host(out, b))

    def _grow_meta(self, rows: int) -> None:
        """Bigger static buffers for eager decode beyond the largest bucket; drops captured graphs
        (they point at the old buffers) - only reached when max_num_seqs exceeds every bucket."""
        pin = self.device.type == "cuda"
        self._meta_host = torch.zeros(rows, _BT + self.max_blocks_per_seq, dtype=torch.int32, pin_memory=pin)
        self._meta_np = self._meta_host.numpy()
        self._meta_dev = torch.zeros(self._meta_host.shape, dtype=torch.int32, device=self.device)
        self._meta_rows = rows
        self._decode_key = None
        self._arm.counters["buffer_growths"] += 1
        for arm in self._all_arm_states():
            arm.graphs.clear()

    # ---- CUDA graphs --------------------------------------------------------------------------
    def _graph(self, bucket: int, len_class: int) -> tuple[Any, Tensor] | None:
        """The decode graph of (bucket, class): captured lazily (counted) unless the engine is frozen,
        where a missing graph means an eager step (counted as a frozen miss)."""
        g = self._arm.graphs.get((bucket, len_class))
        if g is None:
            if self.frozen:
                self._arm.counters["frozen_graph_misses"] += 1
                return None
            g = self._capture(bucket, len_class)
        return g

    def _capture(self, bucket: int, len_class: int) -> tuple[Any, Tensor]:
        """Capture the current arm's decode step for `bucket` rows of context class `len_class` (with
        the compute-saving exit, one graph per loop and one for the finish: `exit_stop.capture`).
        Replays read the static buffers, so the metadata present now does not matter (a lazy
        capture's warm runs rewrite the same new-token slots the replay then writes again)."""
        arm = self._arm
        graph: Any
        if self.stop_at_exit:
            graph, out = exit_stop.capture(lambda ops: self._staged_decode(bucket, ops, len_class),
                                           arm.warm_ops, arm.ops, self._graph_pool, _new_graph, self.device)
        else:
            graph, out = self._capture_graph(lambda ops: self._decode_forward(bucket, ops, len_class))
        arm.graphs[(bucket, len_class)] = (graph, out)
        arm.counters["graph_captures"] += 1
        return graph, out

    def _capture_graph(self, fn: Callable[[Any], T]) -> tuple[torch.cuda.CUDAGraph, T]:
        """Capture `fn(ops)` of the current arm into a graph of the shared pool. One eager run with the
        arm's fused paths forced on (scope "all") compiles its Triton kernels first (a kernel must not
        be JIT-compiled/loaded while a stream is being captured), one with the arm's ops warms the
        rest (cuBLAS handles, allocator) outside the capture."""
        arm = self._arm
        with torch.no_grad():
            fn(arm.warm_ops)
            fn(arm.ops)
            torch.cuda.synchronize(self.device)
            graph = _new_graph()
            with torch.cuda.graph(graph, pool=self._graph_pool):
                out = fn(arm.ops)
            if hasattr(graph, "instantiate"):
                graph.instantiate()
            torch.cuda.synchronize(self.device)
        return graph, out

    def warmup(self, batch_sizes: Iterable[int] | None = None, max_context: int | None = None) -> None:
        """Capture the current arm's decode graphs for the buckets of `batch_sizes` (default all) and
        every context class up to `max_context` tokens (default max_model_len; pass the workload's
        prompt + output length to capture fewer). Largest first, one shared memory pool. The padding
        metadata written here (seq_len 0, slot -1) makes the capture runs touch no KV."""
        if not self.use_graphs:
            return
        if self.has_unfinished() or self._bench_active:
            raise RuntimeError("warmup needs an idle engine")
        wanted = sorted(
            {self.graph_bucket(b) or -1 for b in (batch_sizes or self.buckets)} - {-1}, reverse=True
        )
        classes = sorted(self.len_classes(max_context), reverse=True)
        self._meta_np[:, _ID:_BT] = (0, 0, -1, 0)
        self._decode_key = None
        self._upload(self._meta_rows)
        for b in wanted:
            for cls in classes:
                if (b, cls) not in self._arm.graphs:
                    self._capture(b, cls)

    def warmup_prefill(self, prompt_len: int, max_rows: int | None = None) -> int:
        """Capture the current arm's prefill graphs for steps of 1..max_rows whole prompts of
        `prompt_len` tokens (default: as many as one step's token budget and max_num_seqs admit): the
        steps of a burst of equal-length prompts, so a measured burst never pays a capture. Synthetic
        metadata (slots -1: no KV is written; block tables 0), like the decode warm-up. Returns the
        number of graphs captured."""
        if not self.use_prefill_graphs or prompt_len < 1:
            return 0
        if self.has_unfinished() or self._bench_active:
            raise RuntimeError("warmup_prefill needs an idle engine")
        cfg = self.config
        fit = min(cfg.max_num_seqs, cfg.max_num_batched_tokens // prompt_len)
        rows = fit if max_rows is None else min(max_rows, fit)
        width = -(-prompt_len // cfg.block_size)
        pg, captured = self._arm.prefill, 0
        for r in range(1, rows + 1):
            key = prefill_key([(0, prompt_len)] * r, width, range(r))
            if key in pg.graphs or key in pg.bad:
                continue
            step = _synthetic_prefill(key)
            self._upload_prefill(step.packed)
            pg.should_capture(key)  # counts as seen: an evicted warm shape recaptures on its next step
            captured += self._capture_prefill(step) is not None
        return captured

    def warmup_eager_prefill(self) -> None:
        """Run one synthetic eager prefill step of the largest size a step can have (the token budget,
        capped by the context), touching no KV: the caching allocator grows to its peak and cuBLAS
        meets the largest shape here, not inside a timed window that runs such a step eagerly."""
        if self.has_unfinished() or self._bench_active:
            raise RuntimeError("warmup_eager_prefill needs an idle engine")
        n = min(self.config.max_num_batched_tokens, self.max_model_len)
        key = prefill_key([(0, n)], -(-n // self.config.block_size), [0])
        step = _synthetic_prefill(key)
        self._upload_prefill(step.packed)
        with torch.no_grad():
            self._prefill_forward(step, self._arm.ops)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ---- convenience ----------------------------------------------------------------------------
    def generate(
        self, prompts: Seq[Seq[int]], params: SamplingParams | Seq[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """Run `prompts` to completion (alongside any requests already queued); outputs in input order."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise UsageError("generate: one SamplingParams per prompt (or a single one)")
        base = f"_gen{time.perf_counter_ns()}"
        outs: dict[str, RequestOutput] = {}
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
            rid = f"{base}-{i}"
            self.add_request(rid, p, sp)
            outs[rid] = RequestOutput(
                rid, list(self._live[rid].prompt), arrival_time=self._live[rid].arrival_time
            )
        pending = set(outs)
        while pending:
            events = self.step()
            if not events and not self.has_unfinished():
                break
            for ev in events:
                o = outs.get(ev.request_id)
                if o is None:
                    continue
                o.token_ids.extend(ev.token_ids)
                o.exit_depths.extend(ev.exit_depths or ())
                o.times.extend([ev.time] * len(ev.token_ids))
                o.prefix_hit_tokens = ev.prefix_hit_tokens
                if ev.finished:
                    o.finish_reason = ev.finish_reason
                    pending.discard(ev.request_id)
        return list(outs.values())

    def stats(self) -> dict[str, Any]:
        """Counters of the current arm plus pool, prefix-cache and ops stats."""
        c = self._arm.counters
        s = dict(c)
        s["batch_size_hist"] = dict(sorted(c["batch_size_hist"].items()))
        s["decode_loops_hist"] = dict(sorted(c["decode_loops_hist"].items()))
        s["stop_at_exit"] = self.stop_at_exit
        sch = self.scheduler
        s.update(
            arm=self._arm.name,
            free_blocks=self.blocks.num_free_blocks,
            total_blocks=self.num_blocks,
            block_size=self.config.block_size,
            cached_blocks=self.blocks.num_cached_blocks,
            kv_bytes_per_token=self.kv_bytes_per_token,
            max_model_len=self.max_model_len,
            prefix_hit_tokens=sch.prefix_hit_tokens,
            prefix_query_tokens=sch.prefix_query_tokens,
            prefix_hit_requests=sch.prefix_hit_requests,
            prefix_caching=self.prefix_caching,
            graphs_captured=[list(k) for k in sorted(self._arm.graphs)],
            use_cuda_graph=self.use_graphs,
            prefill_graphs=self.use_prefill_graphs,
            prefill_graphs_held=len(self._arm.prefill.graphs),
            ops=_plain(getattr(self._arm.ops, "stats", None)),
        )
        return s

    def reset_stats(self) -> None:
        """Zero the current arm's counters and the prefix-cache hit accounting."""
        self._arm.reset_counters()
        self.scheduler.prefix_hit_tokens = self.scheduler.prefix_query_tokens = 0
        self.scheduler.prefix_hit_requests = 0

    def cold_counters(self) -> dict[str, int]:
        """Graph captures (decode, prefill) and static-buffer growths of every arm so far: work that
        must never happen inside a timed window (rltbench.bench.warmth counts their growth)."""
        keys = ("graph_captures", "prefill_graph_captures", "buffer_growths")
        return {k: sum(int(a.counters[k]) for a in self._all_arm_states()) for k in keys}

    # ---- prefill/decode disaggregation (docs/pd.md) -----------------------------------------------
    # A prefill engine runs a request up to its first token and holds its blocks; their KV leaves as one
    # packed buffer (kv_transfer), and a decode engine admits the request straight into decode.
    def add_prefill_request(
        self, request_id: str, prompt_ids: Seq[int] | Tensor, arrival_time: float | None = None
    ) -> None:
        """Queue a request that stops after its prompt: the step that completes the prompt samples its
        first token (a finished event, reason "length"), then its blocks stay held, neither freed nor
        decoded, until `release_exported`. Its blocks are sized for the prompt alone."""
        self.add_request(request_id, prompt_ids, SamplingParams(max_tokens=1, ignore_eos=True), arrival_time)
        self._live[request_id].hold_kv = True

    def _hold(self, seq: Sequence) -> None:
        """A finished prefill-only request leaves the running list with its blocks still referenced."""
        self.scheduler.running.remove(seq)
        self._held[seq.request_id] = seq

    @property
    def held_requests(self) -> list[str]:
        """Prefilled requests whose blocks are held for export, oldest first."""
        return list(self._held)

    def export_prefilled(
        self, request_id: str, extra_bytes: int = 0
    ) -> tuple[Tensor, kv_transfer.PrefilledMeta]:
        """A held request's KV as one contiguous byte buffer (all its blocks of every plane, then
        `extra_bytes` for the transport: `kv_transfer.pack_blocks`) and its facts. The blocks stay
        held until `release_exported`."""
        seq = self._held.get(request_id)
        if seq is None:
            raise EngineRequestError(f"request {request_id!r} is not a prefilled request held for export")
        geo = kv_transfer.KVGeometry.of_pool(self.kv)
        meta = kv_transfer.PrefilledMeta(request_id, seq.prompt_len, seq.output[0], len(seq.blocks), geo)
        return kv_transfer.pack_blocks(self.kv, seq.blocks, extra_bytes), meta

    def release_exported(self, request_id: str) -> bool:
        """Free a held request's blocks (its transfer finished or failed); False if it is not held."""
        seq = self._held.pop(request_id, None)
        if seq is None:
            return False
        self.blocks.free(seq.blocks)
        seq.blocks, seq.block_arr = [], None
        return True

    def blocks_to_import(self, prompt_len: int, max_tokens: int) -> int:
        """KV blocks `import_prefilled` allocates for such a request (prompt plus output, as admission
        sizes every request), so a receiver can promise room before the payload arrives."""
        max_new = min(max_tokens, self.max_model_len - prompt_len + 1)
        return -(-(prompt_len + max_new - 1) // self.config.block_size)

    def import_prefilled(
        self,
        request_id: str,
        prompt_ids: Seq[int] | Tensor,
        params: SamplingParams,
        packed: Tensor,
        first_token: int,
        arrival_time: float | None = None,
    ) -> TokenEvent:
        """Admit a request whose prompt another engine prefilled straight into decode: validate it like
        `add_request`, allocate its blocks, scatter `packed` (from `export_prefilled` on an engine of the
        same KV geometry) into them and emit `first_token`, the token that engine sampled. Raises
        EngineRequestError, with nothing left allocated, for bad input, a size mismatch or no room.
        Not recorded in a schedule: the first token belongs to the prefill engine's schedule."""
        self.add_request(request_id, prompt_ids, params, arrival_time)
        seq = self._live[request_id]
        try:
            if not 0 <= int(first_token) < self.vocab_size:
                raise EngineRequestError(f"first token {first_token} outside [0, {self.vocab_size})")
            if not self.scheduler.admit(seq):
                raise EngineRequestError(
                    f"no room: {self.blocks_to_import(seq.prompt_len, params.max_tokens)} blocks needed, "
                    f"{self.blocks.num_free_blocks} free, {len(self.scheduler.running)} running "
                    f"of max_num_seqs {self.config.max_num_seqs}"
                )
            bs = self.config.block_size
            n = -(-seq.prompt_len // bs)
            kv_transfer.unpack_blocks(self.kv, seq.blocks[:n], packed, skip=seq.num_computed // bs)
        except (EngineRequestError, kv_transfer.TransferError) as exc:
            del self._live[request_id]
            self.scheduler.finish(seq)
            raise EngineRequestError(f"request {request_id!r}: {exc}") from None
        seq.num_computed = seq.prompt_len
        self.scheduler.register_computed_blocks(seq)
        return self._emit([seq], [int(first_token)])[0]
    # ---- synthetic decode batches: the decode-step benchmark (rltbench.bench.decode_benchmark) ----
    @property
    def synthetic_decode_active(self) -> bool:
        """A synthetic decode batch holds the static decode buffers (no request may be served)."""
        return self._bench_active

    def open_synthetic_decode(self, tables: Seq[Seq[int]], context_len: int, rows: int) -> None:
        """Hold the static decode buffers for one fake sequence per block table in `tables`, each with
        `context_len` cached tokens decoding position `context_len`, padded to `rows` rows, and upload
        their metadata. Until `close_synthetic_decode` the engine serves no request."""
        if self.has_unfinished() or self._bench_active:
            raise RuntimeError("a synthetic decode batch needs an idle engine")
        if rows > self._meta_rows:
            self._grow_meta(rows)
        self._bench_active = True
        self._decode_key = None
        bs = self.config.block_size
        m = self._meta_np
        m[:rows, _ID:_BT] = (0, 0, -1, 0)
        for i, t in enumerate(tables):
            m[i, _BT : _BT + len(t)] = t
            m[i, _ID] = (i * 7919 + 1) % self.vocab_size
            m[i, _POS] = context_len
            m[i, _SLOT] = t[context_len // bs] * bs + context_len % bs
            m[i, _SEQ] = context_len + 1
        self._upload(rows)

    def decode_graph(self, rows: int, len_class: int) -> tuple[Any, Tensor] | None:
        """The current arm's decode graph of (bucket `rows`, class `len_class`), captured now if
        missing (None when frozen); with the compute-saving exit an `exit_stop.StagedDecodeGraphs`."""
        return self._graph(rows, len_class)

    def decode_eager(self, rows: int, len_class: int) -> Tensor:
        """One eager decode of the rows in the static buffers with the current arm's ops."""
        with torch.no_grad():
            if self.stop_at_exit:
                return exit_stop.run_eagerly(self._staged_decode(rows, self.ops, len_class))[0]
            return self._decode_forward(rows, self.ops, len_class)

    def close_synthetic_decode(self) -> None:
        """Hand the static decode buffers back to request serving."""
        self._bench_active = False
        self._decode_key = None
