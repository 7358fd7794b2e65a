"""The in-process backend: drives `rltbench.engine.Engine` directly, one process hosting every arm.

Why one process: at C=128 with 512/128 tokens an Ouro-1.4B KV cache needs ~60 GiB; two arms with
their own pools would not fit on one 80 GB GPU (and must not silently shrink C), so the engine keeps
one model and one KV pool and switches the arm's ops and CUDA-graph set with `set_arm` (the pool and
prefix cache are reset between arms).

The client side is simulated on the engine's step loop: a request is "sent" at its scheduled time
(cell start + arrival offset; a later turn of a conversation, think time after its previous turn's
last token: backends.base.SendOrder) and admitted at the next step boundary, so host time spent in a step
counts as queueing, as it would for a request waiting at a real server. A request with `stop` strings
(the quality gate) is aborted at the step whose tokens complete one, decoded with the backend's
codec, so it costs no decode step after its stop.

A scheduled arm may be a *variant*: an engine arm under one prefix-cache setting or one exit mode
(`EngineVariant`), so the cache on and off, or every loop and the compute-saving exit, are scheduled,
interleaved and compared like kernel arms while sharing one model and one pool
(`prefix_cache_variants` and `exit_mode_variants` name them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rltbench.backends.base import (
    CellProgress,
    CellResult,
    DeadlineReached,
    Request,
    SendOrder,
    Timeouts,
    finalize,
    new_record,
)
from rltbench.bench.warmth import frozen_window
from rltbench.engine.schedule import Schedule
from rltbench.engine.types import SamplingParams
from rltbench.errors import UsageError
from rltbench.options import comma_list

CACHE_ON_SUFFIX = "+cache"
STOP_SUFFIX = "+stop"


@dataclass(frozen=True)
class EngineVariant:
    """A scheduled arm as the engine runs it: kernel arm `engine_arm` with the prefix cache on or off,
    and, where the run varies it, Ouro's compute-saving exit on or off (None: the engine's own mode)."""

    engine_arm: str
    prefix_caching: bool
    stop_at_exit: bool | None = None


def prefix_cache_variants(arms: Sequence[str], settings: Sequence[bool]) -> dict[str, EngineVariant]:
    """The scheduled arms of `arms` x prefix-cache `settings`, in that order. With one setting the
    arms keep their names; with the cache off and on, the cache-off run keeps the name (it is the
    baseline: `torch` stays the reference) and the cache-on run of arm A is `A+cache`. A/A copies
    (`torch#2`) run under the first setting only: they measure the reference's own noise floor."""
    return _variants(arms, settings, CACHE_ON_SUFFIX, lambda arm, on: EngineVariant(arm, on))


def exit_mode_variants(arms: Sequence[str], modes: Sequence[bool],
                       prefix_caching: bool) -> dict[str, EngineVariant]:
    """The scheduled arms of `arms` x exit `modes` (False: every loop, True: the compute-saving exit),
    named as `prefix_cache_variants` names them: an arm run every loop keeps its name (`torch` stays
    the reference), its compute-saving run is `A+stop`; A/A copies run in the first mode only."""
    return _variants(arms, modes, STOP_SUFFIX, lambda arm, stop: EngineVariant(arm, prefix_caching, stop))


def _variants(arms: Sequence[str], settings: Sequence[bool], suffix: str,
              variant: Callable[[str, bool], EngineVariant]) -> dict[str, EngineVariant]:
    """`arms` x the two values of one setting, in schedule order; the True run of arm A is named
    A + `suffix` when both values are scheduled."""
    out: dict[str, EngineVariant] = {}
    both = len(set(settings)) > 1
    for k, on in enumerate(settings):
        for arm in arms:
            base, sep, copy = arm.partition("#")
            if k > 0 and sep:
                continue
            name = f"{base}{suffix}{sep}{copy}" if both and on else arm
            out[name] = variant(arm, on)
    return out


def parse_exit_modes(text: str) -> tuple[bool, ...]:
    """`--exit-mode all`, `stop`, `all,stop` or `stop,all` -> the modes in schedule order (True: stop)."""
    words = comma_list(text, "--exit-mode", "all,stop")
    if any(w not in ("all", "stop") for w in words) or len(set(words)) != len(words):
        raise UsageError(f"--exit-mode {text!r}: expected all, stop, or both (all,stop)")
    return tuple(w == "stop" for w in words)


def parse_prefix_cache(text: str) -> tuple[bool, ...]:
    """`--prefix-cache on`, `off`, `off,on` or `on,off` -> the settings in schedule order."""
    words = comma_list(text, "--prefix-cache", "off,on")
    if any(w not in ("on", "off") for w in words) or len(set(words)) != len(words):
        raise UsageError(f"--prefix-cache {text!r}: expected on, off, or both (off,on)")
    return tuple(w == "on" for w in words)


def _stop_tail_len(stops: Sequence[str]) -> int:
    """Tokens to decode to see a stop string: one of L characters spans at most 4L byte-level tokens."""
    return 4 * max((len(s) for s in stops), default=0) + 4


class EngineBackend:
    """Runs cells on an in-process Engine (all arms in one process, one GPU)."""

    name = "engine"
    hosting = (
        "one process, one model, one KV pool; the engine switches each arm's ops and CUDA-graph set "
        "(set_arm), resetting the pool and prefix cache between arms, because two KV pools of an "
        "Ouro-1.4B C=128 burst (~60 GiB each) would not fit on one GPU"
    )
    supports_replay = True

    def __init__(self, engine: Any, arms: Sequence[str] = (), codec: Any = None,
                 variants: Mapping[str, EngineVariant] | None = None):
        self.engine = engine
        self.arms = list(arms)
        self.codec = codec  # decodes tails for `stop` strings (text requests of the quality gate)
        self.variants = dict(variants or {})  # scheduled arm -> engine arm and prefix-cache setting
        self.last_replay_depths: dict[int, list[int]] = {}  # request index -> exit depths (exit gate)

    def warmup(self, arm: str, requests: Sequence[Request], timeouts: Timeouts) -> None:
        """Everything a timed cell of `arm` could otherwise pay for, done untimed: decode graphs for
        every bucket and context class, the prefill graphs (every token-count bucket, which serves
        any step shape; with exact-shape prefill the burst's shapes and the largest eager prefill
        step, for the allocator and cuBLAS), then a small burst through the real step loop. Timed
        cells then run frozen (no capture)."""
        eng = self.engine
        self._select(arm)
        eng.runner.warmup()
        lens = {len(r.prompt) for r in requests}
        if len(lens) == 1:
            eng.runner.warmup_prefill(lens.pop())
        eng.runner.warmup_prefill_steps()
        if requests:
            self.run_cell(arm, "warmup", requests, timeouts.without_deadline(), timed=False)

    def replay(self, arm: str, schedule: Schedule, requests: dict[str, Request],
               row_invariant_tile: int | None = None) -> dict[int, list[int]]:
        """Run `arm` untimed through `schedule` (recorded on another arm's timed cell of `requests`):
        request index -> generated ids. Eager steps run the arm's kernels (scope forced to all) on
        a GPU, so prefill is compared too; on CPU they would run in the Triton interpreter, so eager
        steps keep the arm's own ops there. `row_invariant_tile`: prefill steps run row-invariant
        (`rltbench.engine.replay.row_invariant`)."""
        eng = self.engine
        self._select(arm)
        fused = eng.fused_ops if eng.device.type == "cuda" else None
        out = eng.replay(
            schedule,
            {rid: list(r.prompt) for rid, r in requests.items()},
            {rid: r.output_len for rid, r in requests.items()},
            eager_ops=fused,
            row_invariant_tile=row_invariant_tile,
        )
        depths = getattr(eng, "last_replay_depths", None) or {}
        self.last_replay_depths = {requests[rid].index: d for rid, d in depths.items()}
        return {requests[rid].index: toks for rid, toks in out.items()}

    def _select(self, arm: str) -> None:
        """Make the engine run scheduled arm `arm`: its engine arm, and a variant's prefix-cache setting."""
        v = self.variants.get(arm)
        if v is not None and v.stop_at_exit is not None:
            self.engine.set_stop_at_exit(v.stop_at_exit)
        self.engine.set_arm(v.engine_arm if v else arm)
        if v is not None:
            self.engine.set_prefix_caching(v.prefix_caching)

    def stats(self, arm: str | None = None) -> dict[str, Any]:
        """The engine's counters for `arm` (the engine keeps counters per engine arm and exit mode,
        shared by its prefix-cache variants; switching needs it idle)."""
        try:
            if arm is not None:
                v = self.variants.get(arm)
                mode = None if v is None else v.stop_at_exit
                if (getattr(self.engine, "arm", arm) != (v.engine_arm if v else arm)
                        or (mode is not None and getattr(self.engine, "stop_at_exit", mode) != mode)):
                    self._select(arm)
            return dict(self.engine.stats())
        except Exception:  # stats are informative only
            return {}

    def run_cell(
        self,
        arm: str,
        tag: str,
        requests: Sequence[Request],
        timeouts: Timeouts,
        reset_prefix_cache: bool = True,
        progress: CellProgress | None = None,
        on_step: Callable[[], None] | None = None,
        timed: bool = True,
        max_concurrency: int | None = None,
    ) -> CellResult:
        """Serve `requests` (sent at cell start + arrival; with `max_concurrency`, held back by the
        client while that many are in flight): one record per request.

        A timed cell runs on a frozen engine (no graph capture); its result also holds the schedule
        it ran (for replays on other arms), its requests by id and its cold work, and so does the
        result a `DeadlineReached` carries when the deadline cuts it."""
        eng = self.engine
        self._select(arm)
        if reset_prefix_cache:
            eng.reset_prefix_cache()
        by_id = {f"{arm}/{tag}/{r.index}": r for r in requests}
        if not timed:
            return CellResult(self._serve(arm, tag, requests, timeouts, progress, on_step, max_concurrency),
                              requests=by_id)
        window: dict[str, Any] = {}
        try:
            with frozen_window(eng) as window:
                records = self._serve(arm, tag, requests, timeouts, progress, on_step, max_concurrency)
        except DeadlineReached as exc:
            exc.result = CellResult(exc.records, window.get("schedule"), window.get("cold_work", {}), by_id)
            raise
        return CellResult(records, window.get("schedule"), window.get("cold_work", {}), by_id)

    def _params(self, req: Request) -> SamplingParams:
        return SamplingParams(max_tokens=req.output_len, ignore_eos=req.ignore_eos,
                              stop_token_ids=tuple(req.stop_token_ids))

    def _stopped(self, req: Request, rec: dict[str, Any], new: int) -> bool:
        """Whether the tokens so far complete one of the request's stop strings."""
        if not req.stop or self.codec is None:
            return False
        tail = self.codec.decode(rec["token_ids"][-(_stop_tail_len(req.stop) + new):])
        return any(s in tail for s in req.stop)

    def _serve(
        self,
        arm: str,
        tag: str,
        requests: Sequence[Request],
        timeouts: Timeouts,
        progress: CellProgress | None,
        on_step: Callable[[], None] | None,
        max_concurrency: int | None = None,
    ) -> list[dict[str, Any]]:
        eng = self.engine
        reqs: dict[str, Request] = {}
        recs: dict[str, dict[str, Any]] = {}
        order: list[str] = []
        live: set[str] = set()
        prog = progress or CellProgress()
        prog.total, prog.start = len(requests), time.perf_counter()
        sends = SendOrder(requests, prog.start)
        full_at = -float("inf")  # the last check that found max_concurrency requests in flight

        def ended(rids: Sequence[str], at: float) -> None:  # later turns wait for these
            for rid in rids:
                sends.ended(reqs[rid].index, at)

        try:
            while True:
                now = time.perf_counter()
                while max_concurrency is None or len(live) < max_concurrency:
                    due = sends.pop(now)
                    if due is None:
                        break
                    req, at = due
                    rid = f"{arm}/{tag}/{req.index}"
                    rec = recs[rid] = new_record(req, rid, at)
                    if at <= full_at:  # held back by the client until a slot freed
                        rec["send"] = now
                    reqs[rid] = req
                    order.append(rid)
                    try:
                        eng.add_request(rid, list(req.prompt), self._params(req))
                        live.add(rid)
                    except ValueError as exc:  # EngineRequestError: bad request, the rest goes on
                        rec["status"], rec["error"] = "error", str(exc)
                        prog.done += 1
                        prog.errors += 1
                        ended([rid], now)
                if max_concurrency is not None and len(live) >= max_concurrency:
                    full_at = now
                if timeouts.deadline_passed(now):
                    self._abort_all(live, recs, "global deadline reached")
                    for req in sends.unsent_requests():
                        rid = f"{arm}/{tag}/{req.index}"
                        recs[rid] = new_record(req, rid, prog.start + req.arrival)
                        recs[rid].update(status="timeout", error="global deadline reached (not sent)")
                        order.append(rid)
                    raise DeadlineReached([finalize(recs[r]) for r in order])
                if not live:
                    nxt = sends.next_time()
                    if nxt is None:  # nothing left, or only turns whose previous turn can never end
                        break
                    wait = nxt - time.perf_counter()
                    if timeouts.deadline is not None:
                        wait = min(wait, timeouts.deadline - time.perf_counter())
                    if wait > 0:
                        time.sleep(min(wait, 0.05))
                    continue
                try:
                    events = eng.step()
                except Exception as exc:  # an engine failure fails the in-flight requests, not the run
                    failed = list(live)
                    self._abort_all(live, recs, f"engine step failed: {type(exc).__name__}: {exc}", "error")
                    prog.errors += len(failed)
                    prog.done += len(failed)
                    ended(failed, time.perf_counter())
                    continue
                for ev in events:
                    rec = recs.get(ev.request_id)
                    if rec is None or ev.request_id not in live:
                        continue
                    if rec["first"] is None:
                        rec["first"] = ev.time
                        prog.ttfts.append(ev.time - rec["send"])
                    rec["last"] = ev.time
                    rec["token_ids"].extend(int(t) for t in ev.token_ids)
                    depths = getattr(ev, "exit_depths", None)
                    if depths is not None:
                        rec.setdefault("exit_depths", []).extend(int(d) for d in depths)
                    rec["event_times"].append(ev.time)
                    rec["event_tokens"].append(len(ev.token_ids))
                    hit = getattr(ev, "prefix_hit_tokens", None)
                    if hit is not None:
                        rec["prefix_hit_tokens"] = int(hit)
                    prog.tokens += len(ev.token_ids)
                    if ev.finished:
                        rec["finish_reason"] = ev.finish_reason
                    elif self._stopped(reqs[ev.request_id], rec, len(ev.token_ids)):
                        eng.abort_request(ev.request_id)
                        rec["finish_reason"] = "stop_str"
                    else:
                        continue
                    live.discard(ev.request_id)
                    finalize(rec)
                    prog.done += 1
                    prog.errors += rec["status"] != "ok"
                    ended([ev.request_id], ev.time)
                ended(self._check_timeouts(live, recs, timeouts, prog), time.perf_counter())
                if on_step is not None:
                    on_step()
        except KeyboardInterrupt:
            self._abort_all(live, recs, "interrupted")
            raise
        return [finalize(recs[r]) for r in order]

    def _check_timeouts(
        self, live: set[str], recs: dict[str, dict[str, Any]], timeouts: Timeouts, prog: CellProgress
    ) -> list[str]:
        """Abort the live requests past a timeout; returns their ids."""
        now = time.perf_counter()
        timed_out = []
        for rid in list(live):
            rec = recs[rid]
            if rec["first"] is None and now - rec["send"] > timeouts.first_token:
                why = f"no first token after {timeouts.first_token:g}s"
            elif rec["last"] is not None and now - rec["last"] > timeouts.stall:
                why = f"no token for {timeouts.stall:g}s"
            else:
                continue
            self._abort(rid, live, rec, why, "timeout")
            prog.done += 1
            prog.errors += 1
            timed_out.append(rid)
        return timed_out

    def _abort(self, rid: str, live: set[str], rec: dict[str, Any], why: str, status: str) -> None:
        try:
            self.engine.abort_request(rid)
        except Exception:  # already finished or unknown: nothing left to free
            pass
        live.discard(rid)
        rec["status"], rec["error"] = status, why

    def _abort_all(
        self, live: set[str], recs: dict[str, dict[str, Any]], why: str, status: str = "timeout"
    ) -> None:
        for rid in list(live):
            self._abort(rid, live, recs[rid], why, status)
