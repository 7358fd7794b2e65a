"""The two halves of a disaggregated burst: the prefill side (rank 0) and the decode side (rank 1).

Per request, after the prefill engine sampled its first token and held its blocks:
  prefill -> decode   header (kv_transfer.TransferHeader: request, prompt length and digest, first
                      token, blocks, payload bytes, geometry)
  decode  -> prefill  reply: accept (the decode side has promised room and posted the payload
                      receive) or refuse with a reason (corrupt header, size or geometry mismatch,
                      unknown prompt, no room ever)
  prefill -> decode   payload: the request's blocks of every plane packed into one buffer (one
                      message), packed only now, so at most `budget_bytes` of KV are packed at once
then the prefill side frees its blocks and the decode side scatters the payload into blocks its
engine allocates (`Engine.import_prefilled`) and the request decodes from its first token on.

Both sides run their engine's step loop and poll the link between steps, so transfers overlap
prefill and decode compute. Failure handling: any failed, refused or timed-out transfer ends that
request on both sides (the prefill side frees its held blocks, the decode side never allocates or
frees what it allocated) with the reason in its record; a lost peer fails every unfinished request,
frees every block and ends the cell with `link_error` set. Nothing waits without a deadline.

The methods `header_for`, `encode_header`, `payload_for` and `send_payload` of PrefillSide are the
points where the failure tests substitute a corrupt header, a wrong size or a lost payload.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from rltbench.backends.base import Request, finalize, new_record
from rltbench.bench.warmth import frozen_window
from rltbench.disagg.link import ACCEPT, PAYLOAD_TRAILER, REASONS, REFUSE, Link, LinkBroken, Pending
from rltbench.engine.kv_transfer import (
    KIND_CANCEL,
    KIND_KV,
    HeaderError,
    KVGeometry,
    SizeMismatch,
    TransferError,
    TransferHeader,
)
from rltbench.engine.schedule import Schedule, StepRecord
from rltbench.engine.types import EngineRequestError, SamplingParams

IDLE_S = 0.0002  # sleep of a loop iteration that found nothing to do (keeps a core for the peer)


def request_id(arm: str, tag: str, index: int) -> str:
    """The id a request has on both engines (and in the colocated replay)."""
    return f"{arm}/{tag}/{index}"


@contextmanager
def cell_window(engine: Any, timed: bool) -> Iterator[dict[str, Any]]:
    """One side's window of a cell; yields a dict that holds `schedule` and `cold_work` once it
    closes. Timed: bench.warmth.frozen_window (no graph capture, cold work counted). Untimed (the pd
    warm-up, which may capture and compile): the schedule only, and no cold work."""
    if timed:
        with frozen_window(engine) as window:
            yield window
        return
    window: dict[str, Any] = {"cold_work": {}}
    engine.start_recording()
    try:
        yield window
    finally:
        window["schedule"] = engine.stop_recording()


def flat_cold_work(counts: dict[str, dict[str, int | None]]) -> dict[str, int | None]:
    """{"prefill": {...}, "decode": {...}} as one flat dict ("prefill.compiles": n, ...), the shape the
    cold-work check of results.serving.compute_cells reads."""
    return {f"{side}.{k}": v for side, c in counts.items() for k, v in (c or {}).items()}


@dataclass
class _Outgoing:
    """One request's transfer as the prefill side sees it."""

    index: int
    rid: str
    seq: int
    header: TransferHeader
    header_send: Pending
    reply: Pending
    payload: Pending | None = None
    packed: Tensor | None = None


@dataclass
class PrefillCell:
    """What a pd cell returns on the prefill side: one record per request (e2e fields plus `pd`
    timings, merged with the decode side's), both schedules, cold work, and the link error that
    ended it early, if any."""

    records: list[dict[str, Any]]
    prefill_schedule: Schedule | None
    decode_schedule: Schedule | None
    cold_work: dict[str, int | None]
    decode_info: dict[str, Any] = field(default_factory=dict)
    link_error: str | None = None


class _Side:
    """What both ranks hold: the engine, the link, the wait for a control message, the pool's KV
    geometry and the number of the next per-request message."""

    def __init__(self, engine: Any, link: Link, control_timeout_s: float) -> None:
        self.engine = engine
        self.link = link
        self.control_timeout_s = control_timeout_s
        self.geometry = KVGeometry.of_pool(engine.kv)
        self._seq = 0


class PrefillSide(_Side):
    """Rank 0 of a pd cell: prefill-only requests on `engine`, KV out through `link`."""

    def __init__(self, engine: Any, link: Link, budget_bytes: int, control_timeout_s: float) -> None:
        super().__init__(engine, link, control_timeout_s)
        self.budget_bytes = budget_bytes

    # ---- the substitution points of the failure tests ----------------------------------------------
    def header_for(self, seq: int, req: Request, first_token: int) -> TransferHeader:
        return TransferHeader.for_kv(seq, req.index, req.prompt, first_token, self.geometry)

    def encode_header(self, header: TransferHeader) -> Tensor:
        return header.encode()

    def payload_for(self, rid: str) -> Tensor:
        packed, _meta = self.engine.held.export(rid, extra_bytes=PAYLOAD_TRAILER)
        return packed

    def send_payload(self, seq: int, packed: Tensor) -> Pending:
        return self.link.send_payload(seq, packed)

    # ---- one cell --------------------------------------------------------------------------------
    def run_cell(self, tag: str, requests: list[Request], timed: bool = True) -> PrefillCell:
        """Serve `requests` (a burst: all sent at once) disaggregated; returns when every request has
        finished or failed on both sides, or the link broke."""
        eng, link = self.engine, self.link
        by_index = {r.index: r for r in requests}
        rids = {r.index: request_id(eng.arm, tag, r.index) for r in requests}
        link.send_json(
            {
                "op": "cell",
                "tag": tag,
                "timed": timed,
                "requests": [[r.index, rids[r.index], list(r.prompt), r.output_len] for r in requests],
            },
            self.control_timeout_s,
        )
        link.recv_json(self.control_timeout_s, "the decode side's ready")
        with cell_window(eng, timed) as window:
            t0 = time.perf_counter()
            recs = {i: new_record(r, rids[i], t0) for i, r in by_index.items()}
            for rec in recs.values():
                rec["pd"] = {}
            for i, r in by_index.items():
                eng.add_prefill_request(rids[i], r.prompt, arrival_time=t0)
            unresolved = set(by_index)
            ready: deque[int] = deque()
            out: list[_Outgoing] = []
            link_error = None
            try:
                while unresolved:
                    busy = False
                    if eng.has_unfinished():
                        busy = True
                        for i, tok, t in self._step(rids, recs, unresolved):
                            recs[i]["pd"].update(prefill_first=t, first_token=tok)
                            ready.append(i)
                    busy |= self._start_transfers(ready, out, by_index, recs)
                    busy |= self._advance(out, recs, unresolved)
                    if not busy:
                        time.sleep(IDLE_S)
            except TransferError as exc:  # a lost peer or a broken link: nothing more can move
                link_error = str(exc)
                self._fail_everything(rids, recs, unresolved, ready, out, exc)
        p_sched = window["schedule"]
        cold = {"prefill": window["cold_work"]}
        decode_info: dict[str, Any] = {}
        d_sched = None
        if link_error is None:
            try:
                decode_info = link.recv_json(self.control_timeout_s, "the decode side's records")
            except TransferError as exc:
                link_error = str(exc)
        if decode_info:
            d_sched = schedule_from_json(decode_info.get("schedule"))
            cold["decode"] = decode_info.get("cold_work") or {}
            self._merge(recs, decode_info.get("records") or {})
        for rec in recs.values():
            if link_error is not None and rec["status"] is None:
                rec["status"], rec["error"] = "error", f"link_broken: {link_error}"
            finalize(rec)
        return PrefillCell(
            [recs[i] for i in sorted(recs)],
            p_sched,
            d_sched,
            flat_cold_work(cold) if timed else {},
            {k: v for k, v in decode_info.items() if k not in ("records", "schedule")},
            link_error,
        )

    def _step(self, rids: dict[int, str], recs: dict[int, dict[str, Any]], unresolved: set[int]):
        """One prefill step: (index, first token, time) of each request whose prompt completed."""
        index_of = {rid: i for i, rid in rids.items()}
        try:
            events = self.engine.step()
        except Exception as exc:  # the requests still prefilling fail; the decode side is told
            why = f"prefill step failed: {type(exc).__name__}: {exc}"
            for i in sorted(unresolved):
                if self.engine.abort_request(rids[i]):
                    self._cancel(i, recs, unresolved, why)
            return []
        return [(index_of[ev.request_id], int(ev.token_ids[0]), ev.time) for ev in events]

    def _cancel(self, index: int, recs: dict[int, dict[str, Any]], unresolved: set[int], why: str) -> None:
        """A request that failed before its transfer: a cancel header keeps the decode side's count."""
        seq, self._seq = self._seq, self._seq + 1
        self.link.send_header(seq, self.encode_header(TransferHeader.cancel(seq, index))).wait()
        recs[index]["status"], recs[index]["error"] = "error", why
        unresolved.discard(index)

    def _in_flight_bytes(self, out: list[_Outgoing]) -> int:
        return sum(o.header.payload_bytes for o in out)

    def _start_transfers(
        self,
        ready: deque[int],
        out: list[_Outgoing],
        by_index: dict[int, Request],
        recs: dict[int, dict[str, Any]],
    ) -> bool:
        """Send headers of prefilled requests while the packed bytes in flight stay within the budget
        (one transfer always fits)."""
        started = False
        while ready:
            i = ready[0]
            req = by_index[i]
            seq = self._seq
            header = self.header_for(seq, req, recs[i]["pd"]["first_token"])
            if out and self._in_flight_bytes(out) + header.payload_bytes > self.budget_bytes:
                break
            ready.popleft()
            self._seq += 1
            reply = self.link.recv_reply(seq)
            send = self.link.send_header(seq, self.encode_header(header))
            recs[i]["pd"].update(
                header_sent=time.perf_counter(), seq=seq, bytes=header.payload_bytes, blocks=header.n_blocks
            )
            out.append(_Outgoing(i, recs[i]["request_id"], seq, header, send, reply))
            started = True
        return started

    def _advance(self, out: list[_Outgoing], recs: dict[int, dict[str, Any]], unresolved: set[int]) -> bool:
        """Poll every transfer in flight; returns whether any moved."""
        moved = False
        for o in list(out):
            pd = recs[o.index]["pd"]
            try:
                o.header_send.done()
                if o.payload is None:
                    if not o.reply.done():
                        continue
                    _seq, status, reason, nbytes = o.reply.result
                    moved = True
                    if status != ACCEPT:
                        why = REASONS[reason] if 0 <= reason < len(REASONS) else f"reason {reason}"
                        raise TransferError(f"refused by the decode side: {why}")
                    if nbytes != o.header.payload_bytes:
                        raise TransferError(
                            f"size_mismatch: the decode side posted {nbytes:,} bytes for a "
                            f"{o.header.payload_bytes:,}-byte payload"
                        )
                    pd["accepted"] = time.perf_counter()
                    o.packed = self.payload_for(o.rid)
                    pd["packed"] = time.perf_counter()
                    if o.packed.numel() != nbytes + PAYLOAD_TRAILER:
                        raise SizeMismatch(
                            f"packed {o.packed.numel() - PAYLOAD_TRAILER:,} KV bytes, announced {nbytes:,}"
                        )
                    o.payload = self.send_payload(o.seq, o.packed)
                    pd["payload_messages"] = pd.get("payload_messages", 0) + 1
                if o.payload.done():
                    moved = True
                    pd["sent"] = time.perf_counter()
                    self.engine.held.release(o.rid)
                    out.remove(o)
                    unresolved.discard(o.index)
            except TransferError as exc:
                moved = True
                self.engine.held.release(o.rid)
                out.remove(o)
                unresolved.discard(o.index)
                rec = recs[o.index]
                rec["status"], rec["error"] = "error", f"{exc.reason}: {exc}"
                if self.link.broken is not None:
                    raise LinkBroken(self.link.broken) from None
        return moved

    def _fail_everything(
        self,
        rids: dict[int, str],
        recs: dict[int, dict[str, Any]],
        unresolved: set[int],
        ready: deque[int],
        out: list[_Outgoing],
        exc: TransferError,
    ) -> None:
        """The link is gone: every unfinished request fails and every block comes back."""
        for i in sorted(unresolved):
            self.engine.abort_request(rids[i])
            self.engine.held.release(rids[i])
            if recs[i]["status"] is None:
                recs[i]["status"], recs[i]["error"] = "error", f"{exc.reason}: {exc}"
        unresolved.clear()
        ready.clear()
        out.clear()

    @staticmethod
    def _merge(recs: dict[int, dict[str, Any]], decoded: dict[str, Any]) -> None:
        """Take the decode side's tokens and times into the prefill side's records; a failure
        either side saw stays the request's status."""
        for key, d in decoded.items():
            rec = recs.get(int(key))
            if rec is None:
                continue
            rec["pd"].update(d.pop("pd", {}))
            if rec["status"] is not None:  # failed here first: keep that reason
                continue
            for k in ("first", "last", "token_ids", "event_times", "event_tokens", "status", "error"):
                rec[k] = d.get(k, rec[k])


def schedule_from_json(obj: dict[str, Any] | None) -> Schedule | None:
    """The inverse of `Schedule.to_json()` (request ids kept)."""
    if not obj:
        return None
    steps = [StepRecord(kind, tuple(tuple(r) for r in rows)) for kind, rows in obj["steps"]]
    return Schedule(steps, bool(obj.get("clean_start", True)))


@dataclass
class _Incoming:
    """One accepted request whose payload is on its way to the decode side."""

    index: int
    header: TransferHeader
    payload: Pending
    blocks: int


class DecodeSide(_Side):
    """Rank 1: takes cells from the prefill side and decodes the requests whose KV it receives."""

    def __init__(self, engine: Any, link: Link, header_timeout_s: float, control_timeout_s: float) -> None:
        super().__init__(engine, link, control_timeout_s)
        self.header_timeout_s = header_timeout_s

    def serve(self, idle_timeout_s: float) -> int:
        """Run cells until the prefill side says stop; returns the number of cells served."""
        cells = 0
        while True:
            msg = self.link.recv_json(idle_timeout_s, "the next cell")
            if msg.get("op") == "stop":
                return cells
            self.link.send_json(self.run_cell(msg), self.control_timeout_s)
            cells += 1

    def run_cell(self, msg: dict[str, Any]) -> dict[str, Any]:
        """One cell: receive, import and decode every request; the records go back to rank 0."""
        eng, link = self.engine, self.link
        reqs = {int(i): (rid, [int(t) for t in prompt], int(n)) for i, rid, prompt, n in msg["requests"]}
        timed = bool(msg.get("timed", True))
        with cell_window(eng, timed) as window:
            recs: dict[int, dict[str, Any]] = {}
            index_of = {rid: i for i, (rid, _p, _n) in reqs.items()}
            self._reserved = 0
            incoming: list[_Incoming] = []
            rejections: list[dict[str, Any]] = []
            seen, deferred = 0, None
            header = link.recv_header(self._seq, self.header_timeout_s) if reqs else None
            link.send_json({"op": "ready"}, self.control_timeout_s)
            link_error = None
            try:
                while seen < len(reqs) or incoming or deferred is not None or eng.has_unfinished():
                    busy = False
                    if deferred is None and header is not None and header.done():
                        busy = True
                        seq, self._seq, seen = self._seq, self._seq + 1, seen + 1
                        raw = header.result
                        header = (
                            link.recv_header(self._seq, self.header_timeout_s) if seen < len(reqs) else None
                        )
                        deferred = self._on_header(seq, raw, reqs, recs, incoming, rejections)
                    elif deferred is not None:
                        deferred = self._on_header(*deferred, reqs, recs, incoming, rejections)
                    busy |= self._receive(incoming, reqs, recs)
                    if eng.has_unfinished():
                        busy = True
                        self._decode(recs, index_of)
                    if not busy:
                        time.sleep(IDLE_S)
            except TransferError as exc:
                link_error = str(exc)
                for i, rec in recs.items():
                    if eng.abort_request(reqs[i][0]) and rec["status"] is None:
                        rec["status"], rec["error"] = "error", f"{exc.reason}: {exc}"
                for inc in incoming:
                    recs[inc.index].update(status="error", error=f"{exc.reason}: {exc}")
        sched, cold = window["schedule"], window["cold_work"]
        if link_error is not None:
            raise LinkBroken(link_error)
        return {
            "records": {str(i): finalize(r) for i, r in recs.items()},
            "schedule": sched.to_json(),
            "cold_work": cold,
            "rejections": rejections,
            "all_blocks_free": eng.blocks.check_all_free(),
        }

    def _new_record(self, index: int, reqs: dict[int, tuple[str, list[int], int]]) -> dict[str, Any]:
        rid, prompt, n = reqs[index]
        rec = new_record(Request(index, prompt, n), rid, 0.0)
        rec["pd"] = {"header_recv": time.perf_counter()}
        return rec

    def _on_header(
        self,
        seq: int,
        raw: Tensor,
        reqs: dict[int, tuple[str, list[int], int]],
        recs: dict[int, dict[str, Any]],
        incoming: list[_Incoming],
        rejections: list[dict[str, Any]],
    ) -> tuple[int, Tensor] | None:
        """Accept (post the payload receive, then reply), refuse, or defer (returned) a header."""
        eng = self.engine
        try:
            h = TransferHeader.decode(raw)
            if h.seq != seq:
                raise HeaderError(f"message {h.seq} arrived as message {seq}")
        except HeaderError as exc:
            rejections.append({"seq": seq, "reason": exc.reason, "error": str(exc)})
            self.link.send_reply(seq, REFUSE, exc.reason, 0)
            return None
        if h.kind == KIND_CANCEL and h.request in reqs and h.request not in recs:
            recs[h.request] = self._new_record(h.request, reqs)
            recs[h.request].update(status="error", error="cancelled by the prefill side")
            return None
        reason, why = "ok", ""
        if h.kind != KIND_KV or h.request not in reqs or h.request in recs:
            reason, why = "unknown_request", f"request {h.request} (kind {h.kind}) is not expected"
        else:
            _rid, prompt, n = reqs[h.request]
            try:
                h.check_kv(self.geometry, prompt, eng.vocab_size)
            except TransferError as exc:
                reason, why = exc.reason, str(exc)
        if reason == "ok":
            need = eng.blocks_to_import(h.prompt_len, reqs[h.request][2])
            if need > eng.num_blocks:
                reason, why = "no_room", f"{need} blocks needed, the pool has {eng.num_blocks}"
            elif (
                need > eng.blocks.num_free_blocks - self._reserved
                or len(eng.scheduler.running) + len(incoming) >= eng.config.max_num_seqs
            ):
                return seq, raw  # room comes back as requests finish
        if reason != "ok":
            if h.kind == KIND_KV and h.request in reqs and h.request not in recs:
                recs[h.request] = self._new_record(h.request, reqs)
                recs[h.request].update(status="error", error=f"{reason}: {why}")
            rejections.append({"seq": seq, "request": h.request, "reason": reason, "error": why})
            self.link.send_reply(seq, REFUSE, reason, 0)
            return None
        recs[h.request] = self._new_record(h.request, reqs)
        pending = self.link.recv_payload(seq, h.payload_bytes)
        self.link.send_reply(seq, ACCEPT, "ok", h.payload_bytes)
        self._reserved += need
        incoming.append(_Incoming(h.request, h, pending, need))
        return None

    def _receive(
        self,
        incoming: list[_Incoming],
        reqs: dict[int, tuple[str, list[int], int]],
        recs: dict[int, dict[str, Any]],
    ) -> bool:
        """Import every payload that arrived; a failed one ends its request (nothing allocated)."""
        moved = False
        for inc in list(incoming):
            rec = recs[inc.index]
            try:
                if not inc.payload.done():
                    continue
            except TransferError as exc:
                moved = True
                incoming.remove(inc)
                self._reserved -= inc.blocks
                rec["status"], rec["error"] = "error", f"{exc.reason}: {exc}"
                if self.link.broken is not None:
                    raise LinkBroken(self.link.broken) from None
                continue
            moved = True
            incoming.remove(inc)
            self._reserved -= inc.blocks
            rec["pd"]["payload_recv"] = time.perf_counter()
            rid, prompt, n = reqs[inc.index]
            try:
                ev = self.engine.import_prefilled(
                    rid,
                    prompt,
                    SamplingParams(max_tokens=n, ignore_eos=True),
                    inc.payload.result,
                    inc.header.first_token,
                )
            except EngineRequestError as exc:
                rec["status"], rec["error"] = "error", f"import_failed: {exc}"
                continue
            rec["pd"]["imported"] = ev.time
            self._record(rec, ev)
        return moved

    def _decode(self, recs: dict[int, dict[str, Any]], index_of: dict[str, int]) -> None:
        try:
            events = self.engine.step()
        except Exception as exc:  # the decoding requests fail, the cell goes on
            for rec in recs.values():
                if self.engine.abort_request(rec["request_id"]):
                    rec["status"], rec["error"] = "error", f"decode step failed: {type(exc).__name__}: {exc}"
            return
        for ev in events:
            self._record(recs[index_of[ev.request_id]], ev)

    @staticmethod
    def _record(rec: dict[str, Any], ev: Any) -> None:
        if rec["first"] is None:
            rec["first"] = ev.time
        rec["last"] = ev.time
        rec["token_ids"].extend(int(t) for t in ev.token_ids)
        rec["event_times"].append(ev.time)
        rec["event_tokens"].append(len(ev.token_ids))
