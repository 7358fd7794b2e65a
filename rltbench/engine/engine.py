"""The Engine: one model, one paged KV pool, one set of CUDA graphs per kernel arm.

This module holds the requests (admission, abort, events, `generate`), the step loop and arm
switching; the rest is composed from the engine's other modules:

- `scheduler.py` picks each step's batch: a prefill batch (chunked) or a decode batch;
- `runner.py` (`ModelRunner`) runs it on the device: static metadata buffers, the prefill and decode
  forwards, CUDA-graph capture and replay, warm-up, synthetic batches for benchmarks; the current
  arm's ops, graph sets and counters are an `arm_state.ArmState`;
- `replay.py` records schedules and replays them on another arm, and the row-invariant prefill mode;
- `disagg.py` holds prefilled requests' KV for export and imports KV from another engine.

See docs/engine.md for the design and why arms share one pool.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from collections.abc import Sequence as Seq
from typing import Any

import torch
from torch import Tensor

from rltbench.engine import disagg, kv_transfer, replay
from rltbench.engine.arm_state import ArmState, arm_states
from rltbench.engine.block_manager import BlockManager, block_hashes
from rltbench.engine.kv_capacity import engine_layout, pool_blocks
from rltbench.engine.paged_context import allocate_kv_pool
from rltbench.engine.runner import ModelRunner
from rltbench.engine.schedule import ABORT, Schedule, StepRecord
from rltbench.engine.scheduler import DecodeBatch, PrefillBatch, Scheduler, Sequence
from rltbench.engine.types import EngineConfig, EngineRequestError, RequestOutput, SamplingParams, TokenEvent
from rltbench.errors import UsageError


class Engine:
    """Serving engine (API: docs/DESIGN.md section 3). `runner` is its `ModelRunner`."""

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
        self.last_replay_depths: dict[str, list[int]] = {}
        self.eos_token_ids = frozenset(int(t) for t in (getattr(mc, "eos_token_ids", None) or ()))
        self._arms = arm_states(arms, cfg.prefill_graph_cap)

        # ---- KV pool ------------------------------------------------------------------------
        bs, layout = cfg.block_size, engine_layout(mc, self.dtype)
        self.num_blocks = n = pool_blocks(cfg, layout, self.device)
        self.kv_bytes_per_token = layout.bytes_per_token
        self.kv = allocate_kv_pool(layout.planes, n, bs, layout.kv_heads, layout.head_dim, self.dtype,
                                   self.device)
        max_pos = int(mc.max_position_embeddings)
        if cfg.max_model_len is not None and cfg.max_model_len > max_pos:
            raise UsageError(f"max_model_len {cfg.max_model_len} exceeds the model's context {max_pos}")
        self.max_model_len = min(cfg.max_model_len or max_pos, n * bs)
        self.blocks = BlockManager(n, bs, cfg.enable_prefix_caching)
        self.scheduler = Scheduler(self.blocks, cfg.max_num_seqs, cfg.max_num_batched_tokens,
                                   cfg.max_prefill_seqs)
        self._live: dict[str, Sequence] = {}
        self._seq_counter = 0
        self.held = disagg.HeldRequests(self.kv, self.blocks, self.scheduler)  # prefilled for export
        self._recording: Schedule | None = None

        # ---- the device side: static buffers, forwards, graphs -------------------------------------
        self.runner = ModelRunner(model, self.kv, cfg, self.max_model_len, next(iter(self._arms.values())),
                                  self._all_arm_states, self.scheduler.has_unfinished)
        # the arm states of each exit mode: a graph captures one mode's work, so each mode keeps its own
        # graph sets and counters (the other mode's are made on the first switch)
        self._arm_sets: dict[bool, dict[str, ArmState]] = {self.runner.stop_at_exit: self._arms}

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

    # ---- arms and modes -------------------------------------------------------------------------
    @property
    def arm(self) -> str:
        return self.runner.arm.name

    @property
    def arm_names(self) -> list[str]:
        return list(self._arms)

    @property
    def ops(self) -> Any:
        return self.runner.arm.ops

    @property
    def use_graphs(self) -> bool:
        """Whether steps run as CUDA graphs (`use_cuda_graph` on a CUDA device; commands report it)."""
        return self.runner.use_graphs

    @property
    def fused_ops(self) -> Any:
        """The current arm's ops with its kernels on outside CUDA graphs too (scope "all"): what a
        replay's eager steps use, so prefill steps compare the kernels and not the reference ops."""
        return self.runner.arm.warm_ops

    def set_arm(self, name: str) -> None:
        """Switch ops and graph set. The KV pool and prefix cache are reset: arms never share cache
        contents (each arm must compute its own KV; docs/engine.md)."""
        if name not in self._arms:
            raise UsageError(f"unknown arm {name!r}; this engine has {list(self._arms)}")
        self.runner.require_idle("set_arm", " (finish or abort requests, release benchmarks)")
        self.runner.arm = self._arms[name]
        self.reset_prefix_cache()

    @property
    def stop_at_exit(self) -> bool:
        """Whether decode steps run Ouro's compute-saving exit (rltbench.engine.exit_stop)."""
        return self.runner.stop_at_exit

    def set_stop_at_exit(self, enabled: bool) -> None:
        """Turn Ouro's compute-saving exit on or off on an idle engine, so one engine, one pool and one
        model serve both modes of a load interleaved (`e2e --exit-mode all,stop`). Each mode has its
        own graph sets and counters per arm (a graph holds one mode's work); the prefix cache is
        emptied, because a cached block's generated tokens hold one mode's K/V."""
        enabled = bool(enabled)
        if enabled == self.stop_at_exit:
            return
        if enabled and not self.runner.track_exit_depths:
            raise UsageError("the compute-saving exit needs an Ouro model with an exit threshold "
                             "(--exit-threshold)")
        self.runner.require_idle("set_stop_at_exit")
        states = self._arm_sets.get(enabled)
        if states is None:
            cap = self.config.prefill_graph_cap
            states = self._arm_sets[enabled] = {n: ArmState(n, a.ops, a.warm_ops, cap)
                                                for n, a in self._arms.items()}
        self._arms, self.runner.arm = states, states[self.arm]
        self.runner.stop_at_exit = enabled
        self.reset_prefix_cache()

    def _all_arm_states(self) -> list[ArmState]:
        return [a for states in self._arm_sets.values() for a in states.values()]

    def reset_prefix_cache(self) -> None:
        self.blocks.reset_prefix_cache()

    @property
    def prefix_caching(self) -> bool:
        """Whether admitted requests may reuse cached prompt blocks (now; see `set_prefix_caching`)."""
        return self.blocks.enable_prefix_caching

    def set_prefix_caching(self, enabled: bool) -> None:
        """Turn the prefix cache on or off on an idle engine (the cache is emptied), so one engine, one
        pool and one graph set serve a load with the cache on and off alike: the two settings then
        differ in nothing else."""
        if enabled == self.prefix_caching:
            return
        self.runner.require_idle("set_prefix_caching")
        if enabled:
            self._check_prefix_cache_safe()
        self.reset_prefix_cache()
        self.blocks.enable_prefix_caching = enabled

    def freeze(self, frozen: bool = True) -> None:
        """Forbid (or allow again) graph captures: a frozen engine replays the graphs it holds and runs
        everything else eagerly, counted. Timed windows run frozen after a warm-up that covered
        their shapes (`runner.warmup`, `warmup_prefill`, `warmup_prefill_steps`), so none pays a
        capture."""
        self.runner.frozen = frozen

    # ---- requests -----------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_ids: Seq[int] | Tensor,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> Sequence:
        """Queue a request; raises EngineRequestError (nothing allocated) for bad input. Returns the
        engine's state of the request (replay and KV import adjust it; other callers ignore it)."""
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
        return seq

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
            seq = self.add_request(rid, p, sp)
            outs[rid] = RequestOutput(rid, list(seq.prompt), arrival_time=seq.arrival_time)
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

    # ---- stepping -----------------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        """Run one scheduled batch; returns one event per request that produced a token."""
        if self.runner.synthetic_decode_active:
            raise RuntimeError("a decode benchmark holds the engine's buffers; release() it first")
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        return self.run_batch(batch)

    def run_batch(self, batch: PrefillBatch | DecodeBatch) -> list[TokenEvent]:
        """Run one batch (the scheduler's, or a replayed schedule's) and emit its tokens."""
        if self._recording is not None:
            self._recording.steps.append(replay.step_record(batch))
        c = self.runner.arm.counters
        c["steps"] += 1
        with torch.no_grad():
            if isinstance(batch, PrefillBatch):
                c["prefill_steps"] += 1
                c["prefill_tokens"] += batch.num_tokens
                step, done = self.runner.prefill_layout(batch)
                tokens, depths = self.runner.run_prefill(step)
                for seq, n in batch.chunks:
                    seq.num_computed += n
                    self.scheduler.register_computed_blocks(seq)
                return self._emit(done, tokens, depths)
            c["decode_steps"] += 1
            return self._emit(batch.seqs, *self.runner.run_decode(batch.seqs))

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
                    self.held.hold(seq)
                else:
                    self.scheduler.finish(seq)
                del self._live[seq.request_id]
            events.append(
                TokenEvent(seq.request_id, [tok], now, done, seq.finish_reason, seq.prefix_hit_tokens,
                           None if depths is None else [depths[i]])
            )
        return events

    # ---- schedules: record one arm's batches, replay them on another (replay.py) ----------------
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
        """Run the current arm through exactly the batches of `schedule` (`replay.replay_schedule`
        documents the arguments) and return each request's generated ids; with an exit gate their
        exit depths land in `last_replay_depths`."""
        self.last_replay_depths = {}
        out, self.last_replay_depths = replay.replay_schedule(
            self, schedule, prompts, max_tokens, eager_ops, row_invariant_tile
        )
        return out

    # ---- counters -------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters of the current arm plus pool, prefix-cache and ops stats."""
        arm = self.runner.arm
        c = arm.counters
        s = dict(c)
        s["batch_size_hist"] = dict(sorted(c["batch_size_hist"].items()))
        s["decode_loops_hist"] = dict(sorted(c["decode_loops_hist"].items()))
        s["stop_at_exit"] = self.stop_at_exit
        sch = self.scheduler
        s.update(
            arm=arm.name,
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
            graphs_captured=[list(k) for k in sorted(arm.graphs)],
            use_cuda_graph=self.use_graphs,
            prefill_graphs=self.runner.use_prefill_graphs,
            prefill_graphs_held=len(arm.prefill.graphs),
            ops=arm.ops_stats(),
        )
        return s

    def reset_stats(self) -> None:
        """Zero the current arm's counters and the prefix-cache hit accounting."""
        self.runner.arm.reset_counters()
        self.scheduler.prefix_hit_tokens = self.scheduler.prefix_query_tokens = 0
        self.scheduler.prefix_hit_requests = 0

    def cold_counters(self) -> dict[str, int]:
        """Graph captures (decode, prefill) and static-buffer growths of every arm so far: work that
        must never happen inside a timed window (rltbench.bench.warmth counts their growth)."""
        keys = ("graph_captures", "prefill_graph_captures", "buffer_growths")
        return {k: sum(int(a.counters[k]) for a in self._all_arm_states()) for k in keys}

    # ---- prefill/decode disaggregation (disagg.py, docs/pd.md) ----------------------------------
    def add_prefill_request(
        self, request_id: str, prompt_ids: Seq[int] | Tensor, arrival_time: float | None = None
    ) -> None:
        """Queue a request that stops after its prompt: the step that completes the prompt samples its
        first token (a finished event, reason "length"), then its blocks stay held (`held`), neither
        freed nor decoded, until `held.release`. Its blocks are sized for the prompt alone."""
        seq = self.add_request(request_id, prompt_ids, SamplingParams(max_tokens=1, ignore_eos=True),
                               arrival_time)
        seq.hold_kv = True

    def blocks_to_import(self, prompt_len: int, max_tokens: int) -> int:
        """KV blocks `import_prefilled` allocates for such a request (`disagg.blocks_to_import`)."""
        return disagg.blocks_to_import(prompt_len, max_tokens, self.max_model_len, self.config.block_size)

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
        `add_request`, allocate its blocks, scatter `packed` (from `held.export` on an engine of the
        same KV geometry) into them and emit `first_token`, the token that engine sampled. Raises
        EngineRequestError, with nothing left allocated, for bad input, a size mismatch or no room.
        Not recorded in a schedule: the first token belongs to the prefill engine's schedule."""
        seq = self.add_request(request_id, prompt_ids, params, arrival_time)
        try:
            disagg.check_first_token(first_token, self.vocab_size)
            if not self.scheduler.admit(seq):
                raise EngineRequestError(
                    f"no room: {self.blocks_to_import(seq.prompt_len, params.max_tokens)} blocks needed, "
                    f"{self.blocks.num_free_blocks} free, {len(self.scheduler.running)} running "
                    f"of max_num_seqs {self.config.max_num_seqs}"
                )
            disagg.scatter_prompt(self.kv, seq, packed, self.config.block_size)
        except (EngineRequestError, kv_transfer.TransferError) as exc:
            del self._live[request_id]
            self.scheduler.finish(seq)
            raise EngineRequestError(f"request {request_id!r}: {exc}") from None
        seq.num_computed = seq.prompt_len
        self.scheduler.register_computed_blocks(seq)
        return self._emit([seq], [int(first_token)])[0]
