"""The model runner: the device work of one engine step, and the CUDA graphs around it.

The engine schedules requests; the runner turns a scheduled batch into tokens. Per step the host
packs the batch's metadata (token ids, positions, slots, sequence lengths, block tables) into a
static buffer with one H2D copy, the forward reads only that buffer, and one D2H copy brings back
the sampled ids (greedy: one argmax over the batch's logits, inside the graph when there is one).
Because the forwards read only static buffers, they are captured as they are (gpt-fast's plain step
functions, with graphs captured around them):

- decode: one graph per (batch bucket, context class) and arm; padded rows have seq_len 0 and slot
  -1; eager when no bucket fits or graphs are off. With Ouro's compute-saving exit a step is one
  graph per loop (rltbench.engine.exit_stop).
- prefill: by default one graph per token-count bucket and arm (`prefill_buckets`): the step's tokens
  are padded to the bucket (slot -1), its rows to a fixed count, and attention reads the row
  metadata on the device (rltbench.engine.prefill_attention), so steps of any shape replay a graph
  captured at warm-up. Otherwise eager, or a graph captured the second time a step's exact shape
  is seen (`PrefillGraphSet`). Row-invariant steps (rltbench.engine.row_invariant) run in
  fixed-size tiles.

Each arm (and exit mode) has its own `ArmState` (rltbench.engine.arm_state): ops, graph sets and
counters; the engine picks the current one (`ModelRunner.arm`). Benchmarks drive the runner
directly: synthetic decode batches (`open_synthetic_decode`), one decode graph, the prefill step's
layout, forward and capture. See docs/engine.md.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from rltbench.engine import exit_stop
from rltbench.engine.arm_state import ArmState, BucketKey, PrefillKey
from rltbench.engine.paged_context import PagedAttentionContext, prefill_plan_from_host
from rltbench.engine.row_invariant import token_tiles
from rltbench.engine.scheduler import PrefillBatch, Sequence
from rltbench.engine.types import EngineConfig

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
MIN_LEN_CLASS = 256
# Column layout of the packed decode metadata rows: token id, position, slot, seq_len, block table...
_ID, _POS, _SLOT, _SEQ, _BT = 0, 1, 2, 3, 4
MIN_PREFILL_BUFFER = 4096  # int64 elements of the first static prefill metadata buffer

log = logging.getLogger(__name__)
T = TypeVar("T")


def new_graph() -> torch.cuda.CUDAGraph:
    """A CUDA graph that keeps its cudaGraph_t after instantiation (torch >= 2.7), so the profile
    command can count its kernel nodes; plain graph on older torch."""
    try:
        return torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:
        return torch.cuda.CUDAGraph()


@dataclasses.dataclass(frozen=True)
class PrefillLayout:
    """Sizes of the packed prefill metadata: ids, positions and slots [tokens] each, query_start_loc
    [rows + 1], seq_lens and ctx_lens [rows] each, last-token indices [finishing], block tables
    [rows x width]. A bucketed step's sizes are its bucket's (padding included), an exact-shape
    step's are its own."""

    tokens: int
    rows: int
    finishing: int
    width: int

    def splits(self) -> list[int]:
        t, r = self.tokens, self.rows
        return [t, t, t, r + 1, r, r, self.finishing, r * self.width]


@dataclasses.dataclass(frozen=True)
class PrefillStep:
    """Host view of one prefill step. Everything the device work depends on, except the values in
    the packed metadata, is a function of `key`: equal keys give identical kernels and offsets, so a
    graph captured for one step replays any later step with the same key. `qsl`, `seq_lens`,
    `ctx_lens` and `last_idx` describe the real rows; `layout` the packed buffer (a bucketed step's
    padding included); the first `len(last_idx)` outputs are the finishing rows' tokens."""

    key: PrefillKey | BucketKey
    qsl: list[int]
    seq_lens: list[int]
    ctx_lens: list[int]
    last_idx: list[int]
    packed: np.ndarray  # int64, `layout.splits()`
    layout: PrefillLayout
    bucketed: bool = False

    @property
    def n_tok(self) -> int:
        return self.qsl[-1]

    @property
    def nb(self) -> int:
        return len(self.seq_lens)


def prefill_buckets(max_tokens: int) -> list[int]:
    """Token counts of the bucketed prefill graphs, the last >= `max_tokens`: powers of two from 16
    to 512, then steps of 256 to 4096 and of 1024 beyond. Padding costs at most half a step's GEMM
    and elementwise work below 512 tokens (where a step is cheap anyway) and less than 1/3 above; a
    2048-token budget needs 12 graphs per arm."""
    out, n = [], 16
    while True:
        out.append(n)
        if n >= max_tokens:
            return out
        n = n * 2 if n < 512 else n + (256 if n < 4096 else 1024)


def prefill_replay_safe(model: torch.nn.Module) -> bool:
    """Whether a replayed prefill computes what the eager step computes. A model that declares itself
    not `prefix_cache_safe` (Huginn with state_noise "random") draws fresh RNG state per forward:
    a replay would draw from the graph's own Philox offsets, not the eager stream."""
    return bool(getattr(model, "prefix_cache_safe", True))


def prefill_key(rows: Seq[tuple[int, int]], width: int, finishing: Iterable[int]) -> PrefillKey:
    """The exact shape of a prefill step: per row (context start, chunk tokens), the block-table
    width and which rows complete their prompt (they get logits)."""
    return tuple((int(a), int(n)) for a, n in rows), int(width), tuple(int(i) for i in finishing)


def pack_prefill(
    tokens: Seq[np.ndarray],
    qsl: list[int],
    seq_lens: list[int],
    ctx_lens: list[int],
    last_idx: list[int],
    tables: np.ndarray,
    layout: PrefillLayout,
) -> np.ndarray:
    """One step's int64 metadata in `layout`. `tokens` = (ids, positions, slots) [n_tok] each,
    `tables` [rows, >= needed blocks]. Padding tokens get id 0, position 0 and slot -1 (no KV write,
    output ignored), padding rows no queries (query_start_loc repeats the total) and lengths 0,
    padding finishing slots index token 0; block tables are zero-filled to the layout's width."""
    n_tok, n_rows = qsl[-1], len(seq_lens)
    pad_t, pad_r = layout.tokens - n_tok, layout.rows - n_rows
    pad_f = layout.finishing - len(last_idx)
    if pad_t < 0 or pad_r < 0 or pad_f < 0:
        raise ValueError(f"a step of {n_tok} tokens, {n_rows} rows does not fit {layout}")
    bt = np.zeros((layout.rows, layout.width), dtype=np.int64)
    k = min(layout.width, tables.shape[1])
    bt[:n_rows, :k] = tables[:, :k]
    ids, pos, slots = tokens
    return np.concatenate(
        [
            ids, np.zeros(pad_t, np.int64),
            pos, np.zeros(pad_t, np.int64),
            slots, np.full(pad_t, -1, np.int64),
            np.asarray(qsl + [n_tok] * pad_r + seq_lens + [0] * pad_r + ctx_lens + [0] * pad_r
                       + last_idx + [0] * pad_f, np.int64),
            bt.reshape(-1),
        ]
    )


def synthetic_prefill(
    key: PrefillKey, layout: PrefillLayout | None = None, bucketed: bool = False
) -> PrefillStep:
    """A step of shape `key` (in `layout`, default its own sizes) that touches no KV: token ids 0,
    slots -1, block tables 0 (warm-up)."""
    rows, width, finishing = key
    qsl, seq_lens, ctx_lens = [0], [], []
    for start, n in rows:
        qsl.append(qsl[-1] + n)
        seq_lens.append(start + n)
        ctx_lens.append(start)
    last_idx = [qsl[r + 1] - 1 for r in finishing]
    n_tok = qsl[-1]
    layout = layout or PrefillLayout(n_tok, len(rows), len(last_idx), width)
    pos = np.concatenate([np.arange(a, a + n, dtype=np.int64) for a, n in rows])
    tokens = (np.zeros(n_tok, np.int64), pos, np.full(n_tok, -1, np.int64))
    tables = np.zeros((len(rows), width), np.int64)
    packed = pack_prefill(tokens, qsl, seq_lens, ctx_lens, last_idx, tables, layout)
    step_key: PrefillKey | BucketKey = ("bucket", layout.tokens) if bucketed else key
    return PrefillStep(step_key, qsl, seq_lens, ctx_lens, last_idx, packed, layout, bucketed)


class ModelRunner:
    """Static metadata buffers, prefill and decode forwards and their CUDA graphs for one model and
    one KV pool (module docstring). `arm` is the current arm's state (the engine switches it);
    `all_arms()` lists every arm state, whose graphs a static-buffer growth drops; `busy()` says
    whether the engine has requests (warm-ups and synthetic batches need it idle). `frozen` forbids
    captures (a missing graph runs eagerly, counted); `eager_ops` replaces the arm's ops in eager
    steps and `row_tile` makes prefill row-invariant (both set by a replay, rltbench.engine.replay)."""

    def __init__(
        self,
        model: torch.nn.Module,
        kv: Tensor,
        config: EngineConfig,
        max_model_len: int,
        arm: ArmState,
        all_arms: Callable[[], Iterable[ArmState]],
        busy: Callable[[], bool],
    ) -> None:
        self.model, self.kv, self.config = model, kv, config
        self.device = kv.device
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // config.block_size)
        self.arm = arm
        self._all_arms = all_arms
        self._busy = busy
        # a model with an exit gate (Ouro with a threshold) reports each token's exit depth; read once,
        # because the captured graphs include the gate or not
        self.track_exit_depths = getattr(model, "exit_threshold", None) is not None
        # Ouro's compute-saving exit: decode steps run loop by loop and stop once every row has exited
        # (rltbench.engine.exit_stop); prefill steps run every loop. The engine switches modes.
        self.stop_at_exit = self.track_exit_depths and bool(getattr(model.config, "stop_at_exit", False))

        # ---- decode graphs and static metadata ------------------------------------------------
        self.use_graphs = bool(config.use_cuda_graph) and self.device.type == "cuda"
        if config.graph_batch_sizes is not None:
            buckets = sorted(set(config.graph_batch_sizes))
        else:
            buckets = [b for b in DEFAULT_BUCKETS if b < config.max_num_seqs]
            buckets += [b for b in DEFAULT_BUCKETS if b >= config.max_num_seqs][:1]
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
        self.use_prefill_graphs = self.use_graphs and config.prefill_graphs and prefill_replay_safe(model)
        # bucketed prefill graphs: the token counts and the fixed row count of their layouts
        self.prefill_rows = max(1, min(config.max_num_seqs, config.max_num_batched_tokens))
        # a step holds at most the token budget, and at most prefill_rows prompts of max_model_len
        max_step = min(config.max_num_batched_tokens, self.prefill_rows * max_model_len)
        self.prefill_buckets: list[int] | None = (
            prefill_buckets(max_step) if self.use_prefill_graphs and config.prefill_buckets else None
        )
        self._pf_dev = torch.zeros(self._prefill_buffer_elems(), dtype=torch.int64, device=self.device)
        self._pf_warned = False
        # frozen: no graph is captured (a missing decode bucket or prefill shape runs eagerly and is
        # counted), so a timed window never pays a capture; see `Engine.freeze`
        self.frozen = False
        self.eager_ops: Any = None  # replay: the ops eager steps use instead of the arm's
        self.row_tile: int | None = None  # row-invariant prefill: tokens per forward

    def _prefill_buffer_elems(self) -> int:
        """Int64 elements of the largest prefill step's packed metadata (ids, positions, slots per
        token; qsl, seq_lens, ctx_lens, last_idx per row; block tables), allocated once: growing the
        buffer later drops every captured prefill graph, which a measured window must never pay."""
        rows = self.prefill_rows
        tokens = self.prefill_buckets[-1] if self.prefill_buckets else self.config.max_num_batched_tokens
        need = 3 * tokens + 4 * rows + 1 + rows * self.max_blocks_per_seq
        return max(MIN_PREFILL_BUFFER, 1 << (need - 1).bit_length())

    def require_idle(self, what: str, hint: str = "") -> None:
        """Raise RuntimeError unless no request is live and no synthetic decode batch is open."""
        if self._busy() or self._bench_active:
            raise RuntimeError(f"{what} needs an idle engine{hint}")

    def _mode_kwargs(self) -> dict[str, bool]:
        """The exit mode a model forward runs in (Ouro with a threshold only: the compute-saving
        exit computes the exit loop by loop, in prefill too)."""
        return {"stepwise": self.stop_at_exit} if self.track_exit_depths else {}

    # ---- graph geometry ---------------------------------------------------------------------------
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

    # ---- step output ------------------------------------------------------------------------------
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

    # ---- prefill ----------------------------------------------------------------------------------
    def prefill_layout(self, batch: PrefillBatch) -> tuple[PrefillStep, list[Sequence]]:
        """Host work of a prefill step: its key and packed int64 metadata (no device work), plus the
        sequences whose prompt completes (they get a token). Bucketed (`self.prefill_buckets`): the
        key is the token-count bucket and the metadata is padded to its layout; otherwise the key is
        the step's exact shape."""
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
        layout = self.bucket_layout(qsl[-1], len(rows))
        bucketed = layout is not None
        if layout is None:
            layout = PrefillLayout(qsl[-1], len(rows), len(last_idx), width)
        bt = np.zeros((len(batch.chunks), width), dtype=np.int64)  # pack_prefill pads it to the layout
        for i, (seq, _) in enumerate(batch.chunks):
            assert seq.block_arr is not None
            k = min(width, len(seq.block_arr))
            bt[i, :k] = seq.block_arr[:k]
        tokens = (np.concatenate(ids), np.concatenate(pos), np.concatenate(slots))
        packed = pack_prefill(tokens, qsl, seq_lens, ctx_lens, last_idx, bt, layout)
        key: PrefillKey | BucketKey = (
            ("bucket", layout.tokens) if bucketed else prefill_key(rows, width, finishing)
        )
        return PrefillStep(key, qsl, seq_lens, ctx_lens, last_idx, packed, layout, bucketed), done

    def bucket_layout(self, n_tok: int, n_rows: int) -> PrefillLayout | None:
        """The layout of the smallest bucket that holds a step of `n_tok` tokens in `n_rows` rows
        (None: prefill is not bucketed, or no bucket holds the step: it keeps its exact shape)."""
        if not self.prefill_buckets or n_rows > self.prefill_rows:
            return None
        b = next((b for b in self.prefill_buckets if b >= n_tok), None)
        return None if b is None else self._layout_of_bucket(b)

    def run_prefill(self, step: PrefillStep) -> tuple[list[int], list[int] | None]:
        """Upload the step's metadata into the static buffer, then replay its graph, capture it (a
        bucket at its first sighting, an exact shape at its second) or run eagerly; returns the sampled
        ids of the finishing rows (and their exit depths, see `_to_host`)."""
        arm = self.arm
        c = arm.counters
        if self.row_tile is not None:
            return self._to_host(self._prefill_tiled(step, self.eager_ops or arm.ops, self.row_tile))
        self.upload_prefill(step.packed)
        entry = None
        if self.use_prefill_graphs:
            entry = arm.prefill.get(step.key)
            if entry is None and not self.frozen:
                pg = arm.prefill  # a bucket is captured at its first sighting, an exact shape at its second
                wanted = step.key not in pg.bad if step.bucketed else pg.should_capture(step.key)
                entry = self.capture_prefill(step) if wanted else None
        if entry is None:
            c["prefill_eager"] += 1
            out = self.prefill_forward(step, self.eager_ops or arm.ops)
        else:
            graph, out = entry
            graph.replay()
            c["prefill_graph_replays"] += 1
        return self._to_host(out, len(step.last_idx))

    def upload_prefill(self, packed: np.ndarray) -> None:
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
        self.arm.counters["buffer_growths"] += 1
        for arm in self._all_arms():
            arm.prefill.clear()

    def prefill_forward(self, step: PrefillStep, ops: Any) -> Tensor | None:
        """The device work of a prefill step, reading only the static buffer and host values fixed by
        the step's key (captured as-is into the prefill graphs); returns the argmax ids of the
        finishing rows (int64), None when no row finishes."""
        lay = step.layout
        parts = self._pf_dev[: step.packed.size].split(lay.splits())
        t_ids, t_pos, t_slots, qsl, seq, ctx_lens, t_last, bt = parts
        t_bt = bt.view(lay.rows, lay.width).to(torch.int32)
        if step.bucketed:  # attention reads the rows on the device: nothing here depends on the shape
            ctx = PagedAttentionContext(
                self.kv, t_slots, t_bt, seq.to(torch.int32), qsl.to(torch.int32), ctx_lens.to(torch.int32),
                varlen=True,
            )
        else:
            plan = prefill_plan_from_host(
                t_bt, step.qsl, step.ctx_lens, step.seq_lens, self.config.block_size, step.n_tok
            )
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
        if not lay.finishing:
            return None
        return self._with_depths(self.model.compute_logits(hidden[t_last]).argmax(-1), t_last)

    def _prefill_tiled(self, step: PrefillStep, ops: Any, tile: int) -> Tensor | None:
        """The row-invariant prefill step (`rltbench.engine.replay.row_invariant`): forwards of `tile`
        one-query rows with the full block-table width and attention length, so every kernel sees one
        shape; the head runs on whole tiles too. Returns what `prefill_forward` returns."""
        n, nb, w, p = step.n_tok, step.nb, step.layout.width, step.packed
        width, bs = self.max_blocks_per_seq, self.config.block_size
        rows_of = np.repeat(np.arange(nb), np.diff(step.qsl))
        t = step.layout.tokens  # a bucketed step's tokens are padded to its bucket
        ids, pos, slots = p[:n], p[t : t + n], p[2 * t : 2 * t + n]
        tables = p[p.size - step.layout.rows * w :].reshape(step.layout.rows, w)[:nb]
        outs = []
        for t in token_tiles(ids, pos, slots, rows_of, tables, step.last_idx, tile, width):
            self.arm.counters["row_invariant_tiles"] += 1
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

    def capture_prefill(self, step: PrefillStep) -> tuple[Any, Tensor | None] | None:
        """Capture the current arm's prefill graph for `step.key` (its metadata is in the static buffer:
        the warm-up runs write the same KV slots that the replay then writes again). Any failure marks
        the key uncapturable (logged once per runner) and returns None: the step runs eagerly."""
        arm = self.arm
        try:
            entry = self._capture_graph(lambda ops: self.prefill_forward(step, ops))
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

    # ---- decode -----------------------------------------------------------------------------------
    def run_decode(self, seqs: list[Sequence]) -> tuple[list[int], list[int] | None]:
        """One decode token for each of `seqs`: fill and upload their metadata rows, then replay the
        (bucket, context class) graph or run eagerly; returns the sampled ids (and exit depths)."""
        b = len(seqs)
        c = self.arm.counters
        hist = c["batch_size_hist"]
        hist[b] = hist.get(b, 0) + 1
        c["decode_tokens"] += b
        bucket = self.graph_bucket(b) if self.use_graphs else None
        rows = bucket or b
        if rows > self._meta_rows:  # eager batch larger than the static buffers
            self._grow_meta(rows)
        max_len = self._fill_decode_rows(seqs, rows)
        self._upload(rows)
        entry = self.decode_graph(bucket, self.len_class(max_len)) if bucket is not None else None
        loops: int | None = None
        if entry is not None:
            graph, out = entry
            loops = graph.replay()  # loops run (a compute-saving step); None for a plain graph
            c["graph_replays"] += 1
        else:
            out, loops = self._decode_eager(rows, self.eager_ops or self.arm.ops, self.eager_len(max_len))
            if self.use_graphs:
                c["eager_fallbacks"] += 1
        if loops is not None:
            hist = c["decode_loops_hist"]
            hist[loops] = hist.get(loops, 0) + 1
        return self._to_host(out, b)

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

    def _decode_eager(self, rows: int, ops: Any, len_class: int) -> tuple[Tensor, int | None]:
        """One eager decode of the rows in the static buffers; (output, loops run: None unless the
        compute-saving exit stops early)."""
        if self.stop_at_exit:
            return exit_stop.run_eagerly(self._staged_decode(rows, ops, len_class))
        return self._decode_forward(rows, ops, len_class), None

    def _upload(self, rows: int) -> None:
        self._meta_dev[:rows].copy_(self._meta_host[:rows], non_blocking=True)

    def _grow_meta(self, rows: int) -> None:
        """Bigger static buffers for eager decode beyond the largest bucket; drops captured graphs
        (they point at the old buffers) - only reached when max_num_seqs exceeds every bucket."""
        pin = self.device.type == "cuda"
        self._meta_host = torch.zeros(rows, _BT + self.max_blocks_per_seq, dtype=torch.int32, pin_memory=pin)
        self._meta_np = self._meta_host.numpy()
        self._meta_dev = torch.zeros(self._meta_host.shape, dtype=torch.int32, device=self.device)
        self._meta_rows = rows
        self._decode_key = None
        self.arm.counters["buffer_growths"] += 1
        for arm in self._all_arms():
            arm.graphs.clear()

    # ---- CUDA graphs ------------------------------------------------------------------------------
    def decode_graph(self, bucket: int, len_class: int) -> tuple[Any, Tensor] | None:
        """The current arm's decode graph of (bucket, class) and its output tensor: captured lazily
        (counted) unless frozen, where a missing graph means an eager step (None, counted as a frozen
        miss). With the compute-saving exit an `exit_stop.StagedDecodeGraphs`."""
        g = self.arm.graphs.get((bucket, len_class))
        if g is None:
            if self.frozen:
                self.arm.counters["frozen_graph_misses"] += 1
                return None
            g = self._capture(bucket, len_class)
        return g

    def _capture(self, bucket: int, len_class: int) -> tuple[Any, Tensor]:
        """Capture the current arm's decode step for `bucket` rows of context class `len_class` (with
        the compute-saving exit, one graph per loop and one for the finish: `exit_stop.capture`).
        Replays read the static buffers, so the metadata present now does not matter (a lazy
        capture's warm runs rewrite the same new-token slots the replay then writes again)."""
        arm = self.arm
        graph: Any
        if self.stop_at_exit:
            graph, out = exit_stop.capture(lambda ops: self._staged_decode(bucket, ops, len_class),
                                           arm.warm_ops, arm.ops, self._graph_pool, new_graph, self.device)
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
        arm = self.arm
        with torch.no_grad():
            fn(arm.warm_ops)
            fn(arm.ops)
            torch.cuda.synchronize(self.device)
            graph = new_graph()
            with torch.cuda.graph(graph, pool=self._graph_pool):
                out = fn(arm.ops)
            if hasattr(graph, "instantiate"):
                graph.instantiate()
            torch.cuda.synchronize(self.device)
        return graph, out

    # ---- warm-up: every capture and first-time cost before a measurement, on an idle engine -------
    def warmup(self, batch_sizes: Iterable[int] | None = None, max_context: int | None = None) -> None:
        """Capture the current arm's decode graphs for the buckets of `batch_sizes` (default all) and
        every context class up to `max_context` tokens (default max_model_len; pass the workload's
        prompt + output length to capture fewer). Largest first, one shared memory pool. The padding
        metadata written here (seq_len 0, slot -1) makes the capture runs touch no KV."""
        if not self.use_graphs:
            return
        self.require_idle("warmup")
        wanted = sorted(
            {self.graph_bucket(b) or -1 for b in (batch_sizes or self.buckets)} - {-1}, reverse=True
        )
        classes = sorted(self.len_classes(max_context), reverse=True)
        self._meta_np[:, _ID:_BT] = (0, 0, -1, 0)
        self._decode_key = None
        self._upload(self._meta_rows)
        for b in wanted:
            for cls in classes:
                if (b, cls) not in self.arm.graphs:
                    self._capture(b, cls)

    def warmup_prefill(self, prompt_len: int, max_rows: int | None = None) -> int:
        """Capture the current arm's prefill graphs for steps of 1..max_rows whole prompts of
        `prompt_len` tokens (default: as many as one step's token budget and max_num_seqs admit): the
        steps of a burst of equal-length prompts, so a measured burst never pays a capture. Bucketed,
        these are the buckets such steps fall in. Synthetic metadata (slots -1: no KV is written;
        block tables 0), like the decode warm-up. Returns the number of graphs captured."""
        if not self.use_prefill_graphs or prompt_len < 1:
            return 0
        self.require_idle("warmup_prefill")
        cfg = self.config
        fit = min(cfg.max_num_seqs, cfg.max_num_batched_tokens // prompt_len)
        rows = fit if max_rows is None else min(max_rows, fit)
        width = -(-prompt_len // cfg.block_size)
        keys = [prefill_key([(0, prompt_len)] * r, width, range(r)) for r in range(1, rows + 1)]
        return sum(self._warm_prefill_key(k) for k in keys)

    def warmup_prefill_buckets(self) -> int:
        """Capture the current arm's graph of every prefill bucket (largest first, so the shared pool
        grows once), so no measured step pays a capture whatever its shape. The synthetic step of a
        bucket is as many rows of at most max_model_len tokens as fill it (positions stay inside the
        model's context), padded to the bucket. Returns the number captured (0 when prefill is not
        bucketed)."""
        if not self.prefill_buckets:
            return 0
        self.require_idle("warmup_prefill_buckets")
        bs, most = self.config.block_size, self.max_model_len
        captured = 0
        for b in reversed(self.prefill_buckets):
            layout = self._layout_of_bucket(b)
            n = min(b, layout.rows * most)
            rows = [(0, min(most, n - i)) for i in range(0, n, most)]
            key = prefill_key(rows, -(-rows[0][1] // bs), range(len(rows)))
            captured += self._warm_step(synthetic_prefill(key, layout, bucketed=True))
        return captured

    def _layout_of_bucket(self, tokens: int) -> PrefillLayout:
        rows = self.prefill_rows
        return PrefillLayout(tokens, rows, min(rows, tokens), self.max_blocks_per_seq)

    def _warm_prefill_key(self, key: PrefillKey) -> int:
        """Capture the graph a step of shape `key` replays (its bucket's, or its own) unless held or
        known bad; 1 if a graph was captured."""
        layout = self.bucket_layout(sum(n for _, n in key[0]), len(key[0]))
        return self._warm_step(synthetic_prefill(key, layout, bucketed=layout is not None))

    def _warm_step(self, step: PrefillStep) -> int:
        pg = self.arm.prefill
        if step.key in pg.graphs or step.key in pg.bad:
            return 0
        self.upload_prefill(step.packed)
        pg.should_capture(step.key)  # counts as seen: an evicted warm shape recaptures on its next step
        return int(self.capture_prefill(step) is not None)

    def warmup_prefill_steps(self) -> None:
        """What any later prefill step would otherwise pay: bucketed, every bucket's graph; otherwise
        (eager steps) the largest eager step (`warmup_eager_prefill`)."""
        if self.prefill_buckets:
            self.warmup_prefill_buckets()
        else:
            self.warmup_eager_prefill()

    def warmup_eager_prefill(self) -> None:
        """Run one synthetic eager prefill step of the largest size a step can have (the token budget,
        capped by the context), touching no KV: the caching allocator grows to its peak and cuBLAS
        meets the largest shape here, not inside a timed window that runs such a step eagerly."""
        self.require_idle("warmup_eager_prefill")
        n = min(self.config.max_num_batched_tokens, self.max_model_len)
        key = prefill_key([(0, n)], -(-n // self.config.block_size), [0])
        step = synthetic_prefill(key)
        self.upload_prefill(step.packed)
        with torch.no_grad():
            self.prefill_forward(step, self.arm.ops)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ---- synthetic decode batches: the decode-step benchmark (rltbench.bench.decode_benchmark) ----
    @property
    def synthetic_decode_active(self) -> bool:
        """A synthetic decode batch holds the static decode buffers (the engine serves no request)."""
        return self._bench_active

    def open_synthetic_decode(self, tables: Seq[Seq[int]], context_len: int, rows: int) -> None:
        """Hold the static decode buffers for one fake sequence per block table in `tables`, each with
        `context_len` cached tokens decoding position `context_len`, padded to `rows` rows, and upload
        their metadata. Until `close_synthetic_decode` the engine serves no request."""
        if self._busy() or self._bench_active:
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
            m[i, _ID] = (i * 7919 + 1) % int(self.model.config.vocab_size)
            m[i, _POS] = context_len
            m[i, _SLOT] = t[context_len // bs] * bs + context_len % bs
            m[i, _SEQ] = context_len + 1
        self._upload(rows)

    def decode_eager(self, rows: int, len_class: int) -> Tensor:
        """One eager decode of the rows in the static buffers with the current arm's ops."""
        with torch.no_grad():
            return self._decode_eager(rows, self.arm.ops, len_class)[0]

    def close_synthetic_decode(self) -> None:
        """Hand the static decode buffers back to request serving."""
        self._bench_active = False
        self._decode_key = None
