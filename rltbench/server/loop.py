"""The one engine loop of `rltbench serve`: a thread that owns the engine; HTTP handlers talk to it
through a thread-safe inbox and per-request asyncio queues.

Why a thread: the engine is synchronous and not thread-safe, and a step blocks until its sampled ids
reach the host. One dedicated thread calls every engine method (warm-up included, so CUDA graphs are
captured and replayed on the same thread); the asyncio side only puts commands in the inbox. Between
two steps the thread applies every queued command (add, abort, stats), then runs one step and hands
all of that step's token events to the event loop in one `call_soon_threadsafe` call, so a C=128
decode step costs one cross-thread wake-up, not 128.

Request lifecycle (asyncio side): `submit` registers a queue and counts the request as live; the
queue then receives `TokenEvent`s and ends with a finished event or a `Failure` (refused by the
engine, engine error, server shutting down). `abort` (client gone, stop string found) drops the
queue at once and asks the engine thread to free the request's blocks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

STATS_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Failure:
    """The end of a request that did not finish normally; `status` is the HTTP status to report."""

    message: str
    status: int
    code: str


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt: list[int]
    params: Any


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Stats:
    future: concurrent.futures.Future


@dataclass(frozen=True)
class _Stop:
    reason: str


class EngineLoop:
    """Owns `engine` on one thread. `start` runs `warmup(engine)` there and returns once it is done
    (re-raising its error); `attach` names the asyncio loop that receives events; `stop` aborts every
    live request, ends the thread and returns the engine's final stats."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._inbox: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        # asyncio side: live request -> its queue; requests that got their first token
        self._queues: dict[str, asyncio.Queue] = {}
        self._started: set[str] = set()
        # engine-thread side
        self._live: set[str] = set()
        self.failed: str | None = None  # set once a step raised: the engine state is not trusted after
        self.final_stats: dict[str, Any] | None = None
        self.last_stats: dict[str, Any] = {}

    # ---- lifecycle (caller's thread) -------------------------------------------------------------
    def start(self, warmup: Callable[[Any], None] | None = None) -> None:
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._main, args=(warmup, ready), name="engine-loop", daemon=True
        )
        self._thread.start()
        ready.result()

    def attach(self, aloop: asyncio.AbstractEventLoop) -> None:
        self._aloop = aloop

    def stop(self, reason: str = "server shutting down", timeout: float | None = None) -> dict[str, Any]:
        """Abort every live request (their queues get a 503 Failure), end the thread; final stats."""
        if self._thread is not None and self._thread.is_alive():
            self._inbox.put(_Stop(reason))
            self._thread.join(timeout)
        return self.final_stats or {}

    # ---- asyncio side ---------------------------------------------------------------------------
    @property
    def num_live(self) -> int:
        return len(self._queues)

    @property
    def num_running(self) -> int:
        """Live requests that have produced a token (the others wait in the queue or in prefill)."""
        return len(self._started)

    def submit(self, request_id: str, prompt: list[int], params: Any) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = q
        self._inbox.put(_Add(request_id, prompt, params))
        return q

    def abort(self, request_id: str) -> None:
        """Forget the request now and free its blocks at the next step boundary (no-op if it ended)."""
        if self._queues.pop(request_id, None) is not None:
            self._started.discard(request_id)
            self._inbox.put(_Abort(request_id))

    async def stats(self) -> dict[str, Any]:
        """Fresh `engine.stats()` from the engine thread (after its current step); the last snapshot
        when the thread does not answer in time or has ended."""
        if self._thread is None or not self._thread.is_alive():
            return self.final_stats or self.last_stats
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(_Stats(fut))
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), STATS_TIMEOUT_S)
        except (asyncio.TimeoutError, RuntimeError):
            return self.last_stats

    def fail_remaining(self, failure: Failure) -> None:
        """On the event loop, after `stop`: end every queue still open (a request submitted while the
        thread was stopping never reached the engine, so nothing else would end it)."""
        self._deliver([(rid, failure) for rid in list(self._queues)])

    def _deliver(self, items: list[tuple[str, Any]]) -> None:
        """Runs on the event loop: route one step's items to their request queues."""
        for rid, item in items:
            q = self._queues.get(rid)
            if q is None:  # aborted meanwhile
                continue
            if isinstance(item, Failure) or item.finished:
                del self._queues[rid]
                self._started.discard(rid)
            else:
                self._started.add(rid)
            q.put_nowait(item)

    # ---- engine thread --------------------------------------------------------------------------
    def _post(self, items: list[tuple[str, Any]]) -> None:
        if items and self._aloop is not None:
            try:
                self._aloop.call_soon_threadsafe(self._deliver, items)
            except RuntimeError:  # event loop closed: nobody is waiting any more
                pass

    def _main(self, warmup: Callable[[Any], None] | None, ready: concurrent.futures.Future) -> None:
        try:
            if warmup is not None:
                warmup(self.engine)
            self.last_stats = self.engine.stats()
        except BaseException as exc:  # surfaced to start()'s caller
            ready.set_exception(exc)
            return
        ready.set_result(None)
        stop_reason = self._serve()
        self._abort_all(Failure(stop_reason, 503, "shutting_down"))
        try:
            self.final_stats = self.engine.stats()
        except Exception as exc:  # informative only
            self.final_stats = {"error": f"{type(exc).__name__}: {exc}"}

    def _serve(self) -> str:
        """Apply commands, step, deliver; returns the stop reason."""
        eng = self.engine
        while True:
            busy = bool(self._live) and self.failed is None
            try:
                cmd = self._inbox.get_nowait() if busy else self._inbox.get()
            except queue.Empty:
                cmd = None
            out: list[tuple[str, Any]] = []
            while cmd is not None:
                if isinstance(cmd, _Stop):
                    self._post(out)
                    return cmd.reason
                self._apply(cmd, out)
                try:
                    cmd = self._inbox.get_nowait()
                except queue.Empty:
                    cmd = None
            if self._live and self.failed is None:
                try:
                    events = eng.step()
                except Exception as exc:  # never a crash: fail the live requests, say why on /health
                    self.failed = f"engine step failed: {type(exc).__name__}: {exc}"
                    log.error("%s\n%s", self.failed, traceback.format_exc())
                    self._post(out)
                    self._abort_all(Failure(self.failed, 500, "engine_error"))
                    continue
                for ev in events:
                    if ev.request_id in self._live:
                        out.append((ev.request_id, ev))
                        if ev.finished:
                            self._live.discard(ev.request_id)
                if not events and not eng.has_unfinished():  # nothing left to step: never spin
                    self._post(out)
                    out = []
                    self._abort_all(Failure("the engine ended the request without a final token", 500,
                                            "engine_error"))
            self._post(out)

    def _apply(self, cmd: Any, out: list[tuple[str, Any]]) -> None:
        eng = self.engine
        if isinstance(cmd, _Add):
            if self.failed is not None:
                out.append(
                    (cmd.request_id, Failure(f"engine unavailable ({self.failed})", 500, "engine_error"))
                )
                return
            try:
                eng.add_request(cmd.request_id, cmd.prompt, cmd.params)
            except ValueError as exc:  # EngineRequestError: nothing was allocated
                out.append((cmd.request_id, Failure(str(exc), 400, "invalid_request")))
                return
            self._live.add(cmd.request_id)
        elif isinstance(cmd, _Abort):
            if cmd.request_id in self._live:
                self._live.discard(cmd.request_id)
                eng.abort_request(cmd.request_id)
        elif isinstance(cmd, _Stats):
            try:
                self.last_stats = eng.stats()
                cmd.future.set_result(self.last_stats)
            except Exception as exc:  # stats are informative: the caller falls back to the last ones
                cmd.future.set_exception(RuntimeError(str(exc)))

    def _abort_all(self, failure: Failure) -> None:
        out = []
        for rid in list(self._live):
            try:
                self.engine.abort_request(rid)
            except Exception:  # already gone: nothing left to free
                pass
            out.append((rid, failure))
        self._live.clear()
        self._post(out)
