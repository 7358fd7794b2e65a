"""The link between the prefill rank (0) and the decode rank (1), over torch.distributed only.

Two channels:
- control (gloo, CPU tensors): JSON control messages, one int64 header per request (kv_transfer) and
  one int64 reply per header (accept with the byte count the receiver posted, or refuse with a
  reason). Every header, reply and payload of request message `seq` has its own tag, so a message
  that arrives late (after its receiver gave up on it) can never be matched by another one.
- data: the payload, one contiguous byte buffer per request. NCCL between two GPUs; gloo otherwise
  (CPU ranks, or two processes sharing one GPU, which NCCL refuses), staged through pinned host
  memory when the KV lives on a GPU.

Each payload carries a 16-byte trailer (its KV byte count and message number) in the same message;
the receiver posts the announced size and checks the trailer, because gloo completes a receive
whose message is shorter than the buffer without saying so.

Every wait has a deadline, enforced here: the link's groups have a gloo/NCCL timeout of days,
because gloo closes the whole connection when one operation hits its own timeout, which would turn
one late request into a lost peer. A gloo work only completes inside `Work.wait`, so each posted
gloo operation is waited on by a daemon thread and polled through an event; NCCL works are polled
with `is_completed()`. Past its deadline an operation is abandoned (a late message then lands in its
buffer, matched by its own tag, and nothing else). A lost peer (connection closed or reset) or any
other transport error breaks the link; a timeout breaks it only where the operation cannot be
abandoned: an NCCL operation (later ones queue behind it on its stream), a header (the message
numbers of both sides would part) or a control (JSON) message (fixed tags).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rltbench.engine.kv_transfer import HEADER_WORDS, SizeMismatch, TransferError

# Set in every process of the scenario before any process group exists: NVLink multicast (NVLS,
# symmetric-memory multicast) stays off.
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

TAG_JSON_LEN, TAG_JSON = 1, 2
_TAG_SPAN = 1 << 28
TAG_HEADER, TAG_REPLY, TAG_PAYLOAD = _TAG_SPAN, 2 * _TAG_SPAN, 3 * _TAG_SPAN
_NUMBERED_TAGS = {"header": TAG_HEADER, "reply": TAG_REPLY, "payload": TAG_PAYLOAD}
LINK_GROUP_TIMEOUT = timedelta(days=7)  # deadlines are this module's, not gloo's or NCCL's
PAYLOAD_TRAILER = 16  # int64 KV byte count, int64 message number

ACCEPT, REFUSE = 1, 2
REPLY_WORDS = 4  # seq, ACCEPT/REFUSE, reason code, accepted payload bytes
REASONS = (
    "ok",
    "header_corrupt",
    "size_mismatch",
    "prompt_mismatch",
    "unknown_request",
    "no_room",
    "import_failed",
    "transfer_failed",
)


class TransferTimeout(TransferError):
    """An operation did not complete before its deadline."""

    reason = "timeout"


class PeerGone(TransferError):
    """The other rank closed or reset the connection (it exited, crashed or was killed)."""

    reason = "peer_gone"


class LinkBroken(TransferError):
    """The link can carry no more messages (after a lost peer or an unabandonable timeout)."""

    reason = "link_broken"


def new_link_groups(backend: str) -> tuple[Any, Any]:
    """(control group, data group) of the two ranks, with the link's long timeout; the data group is
    the control group unless payloads travel over NCCL."""
    ctrl = dist.new_group([0, 1], backend="gloo", timeout=LINK_GROUP_TIMEOUT)
    data = dist.new_group([0, 1], backend="nccl", timeout=LINK_GROUP_TIMEOUT) if backend == "nccl" else ctrl
    return ctrl, data


def _first_line(exc: BaseException) -> str:
    """The message of a transport exception without gloo's source location and advice."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    text = text.splitlines()[0]
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text.split(". This is typically", 1)[0][:200]


def classify(exc: BaseException, what: str) -> TransferError:
    """A transport exception as a TransferError naming the operation."""
    if isinstance(exc, TransferError):
        return exc
    text = _first_line(exc)
    low = text.lower()
    if "timed out" in low or "timeout" in low:
        return TransferTimeout(f"{what}: {text}")
    if any(
        k in low
        for k in (
            "closed by peer",
            "reset by peer",
            "broken pipe",
            "connection refused",
            "remote process exited",
            "not connected",
        )
    ):
        return PeerGone(f"{what}: peer gone ({text})")
    return TransferError(f"{what}: {text}")


class Pending:
    """One posted isend/irecv: `done()` polls without blocking, `wait()` blocks; both raise a
    TransferError on failure or past the deadline. `on_done` makes the result (e.g. a received
    buffer checked and copied to its device) once the operation completed; a TransferError it raises
    (a size mismatch) fails this message only."""

    def __init__(
        self,
        link: Link,
        work: Any,
        what: str,
        timeout_s: float,
        threaded: bool,
        on_done: Callable[[], Any] | None = None,
        fatal_timeout: bool = False,
    ) -> None:
        self.link = link
        self.what = what
        self.timeout_s = timeout_s
        self.deadline = time.perf_counter() + timeout_s
        self.fatal_timeout = fatal_timeout
        self._work = work
        self._on_done = on_done
        self._complete = False
        self.result: Any = None
        self._error: BaseException | None = None
        self._event: threading.Event | None = None
        if threaded:
            self._event = threading.Event()
            threading.Thread(target=self._wait_in_thread, daemon=True, name=f"pd-{what}").start()

    def _wait_in_thread(self) -> None:
        try:
            self._work.wait()
        except BaseException as exc:  # reported by done(): a thread must not raise
            self._error = exc
        assert self._event is not None
        self._event.set()

    def done(self) -> bool:
        """True once complete; raises TransferError (the link marks itself broken where needed)."""
        if self._complete:
            return True
        try:
            if self._event is not None:
                finished = self._event.is_set()
                if finished and self._error is not None:
                    raise self._error
            else:
                finished = bool(self._work.is_completed())
                if finished:
                    self._work.wait()  # orders the current CUDA stream after the transfer; raises errors
            if not finished:
                if time.perf_counter() > self.deadline:
                    self.link.abandoned += 1
                    raise TransferTimeout(f"{self.what}: not complete after {self.timeout_s:g} s")
                return False
        except BaseException as exc:
            err = classify(exc, self.what)
            self.link.note_failure(err, self.fatal_timeout)
            raise err from None
        self._complete = True
        self.result = self._on_done() if self._on_done is not None else None
        return True

    def wait(self, poll_s: float = 0.0002) -> Any:
        """Block (polling) until complete; returns the result."""
        while not self.done():
            time.sleep(poll_s)
        return self.result


class Link:
    """The two ranks' channels; counts the messages it sends by kind (`sent`), so a test can check
    that a request's KV is one payload message."""

    def __init__(
        self,
        rank: int,
        ctrl_group: Any,
        data_group: Any,
        device: torch.device,
        nccl_data: bool,
        transfer_timeout_s: float,
    ) -> None:
        self.rank = rank
        self.peer = 1 - rank
        self.ctrl_group = ctrl_group
        self.data_group = data_group
        self.device = device
        self.nccl_data = nccl_data
        self.transfer_timeout_s = transfer_timeout_s
        self.sent: Counter[str] = Counter()
        self.broken: str | None = None
        self.abandoned = 0  # operations given up at their deadline, still posted in the transport
        self._stage_host = device.type == "cuda" and not nccl_data

    @property
    def transport(self) -> str:
        if self.nccl_data:
            return "nccl"
        return "gloo (host-staged)" if self._stage_host else "gloo"

    def close(self, rc: int) -> int:
        """End the process group after a clean run (rc 0 or 1); otherwise, or where the link is
        broken or holds abandoned operations (whose waits could block or abort the group's
        teardown), leave the process at once with `rc`."""
        if self.broken is not None or self.abandoned or rc not in (0, 1):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
        if dist.is_initialized():
            dist.destroy_process_group()
        return rc

    def note_failure(self, err: TransferError, fatal_timeout: bool) -> None:
        """Mark the link broken after a lost peer, a transport error or an unabandonable timeout."""
        if self.broken is None and (not isinstance(err, TransferTimeout) or fatal_timeout):
            self.broken = str(err)

    def _post(
        self,
        op: Callable[..., Any],
        tensor: Tensor,
        tag: int,
        what: str,
        timeout_s: float,
        data: bool = False,
        on_done: Callable[[], Any] | None = None,
        fatal_timeout: bool = False,
    ) -> Pending:
        if self.broken is not None:
            raise LinkBroken(f"{what}: the link is broken ({self.broken})")
        nccl = data and self.nccl_data
        group = self.data_group if data else self.ctrl_group
        try:
            work = op(tensor, self.peer, group=group, tag=tag)
        except Exception as exc:
            err = classify(exc, what)
            self.note_failure(err, True)
            raise err from None
        return Pending(
            self,
            work,
            what,
            timeout_s,
            threaded=not nccl,
            on_done=on_done,
            fatal_timeout=fatal_timeout or nccl,
        )

    def _post_numbered(self, op: Callable[..., Any], tensor: Tensor, kind: str, seq: int, timeout_s: float,
                       **kw: Any) -> Pending:
        """Post a per-request message: its tag is its kind's base plus its message number (within
        _TAG_SPAN), so messages of one kind match by number and kinds never cross; its errors name
        it "kind seq". `kw` as for _post."""
        tag = _NUMBERED_TAGS[kind] + seq % _TAG_SPAN
        return self._post(op, tensor, tag, f"{kind} {seq}", timeout_s, **kw)

    # ---- control messages (blocking) ------------------------------------------------------------
    def send_json(self, obj: Any, timeout_s: float) -> None:
        data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64)
        self.sent["json"] += 1
        self._post(dist.isend, size, TAG_JSON_LEN, "send control", timeout_s, fatal_timeout=True).wait()
        self._post(dist.isend, data, TAG_JSON, "send control", timeout_s, fatal_timeout=True).wait()

    def recv_json(self, timeout_s: float, what: str = "control message") -> Any:
        size = torch.zeros(1, dtype=torch.int64)
        self._post(dist.irecv, size, TAG_JSON_LEN, f"receive {what}", timeout_s, fatal_timeout=True).wait()
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        self._post(dist.irecv, data, TAG_JSON, f"receive {what}", timeout_s, fatal_timeout=True).wait()
        return json.loads(bytes(data.numpy()).decode())

    # ---- per-request messages (non-blocking) ----------------------------------------------------
    def send_header(self, seq: int, header: Tensor) -> Pending:
        self.sent["header"] += 1
        # a header the receiver never took leaves the message numbers of both sides out of step
        return self._post_numbered(dist.isend, header, "header", seq, self.transfer_timeout_s,
                                   fatal_timeout=True)

    def recv_header(self, seq: int, timeout_s: float) -> Pending:
        buf = torch.zeros(HEADER_WORDS, dtype=torch.int64)
        # a header that never comes leaves the sequence numbers of both sides out of step
        return self._post_numbered(dist.irecv, buf, "header", seq, timeout_s, on_done=lambda: buf,
                                   fatal_timeout=True)

    def send_reply(self, seq: int, status: int, reason: str, nbytes: int) -> Pending:
        self.sent["reply"] += 1
        t = torch.tensor([seq, status, REASONS.index(reason), nbytes], dtype=torch.int64)
        return self._post_numbered(dist.isend, t, "reply", seq, self.transfer_timeout_s)

    def recv_reply(self, seq: int) -> Pending:
        buf = torch.zeros(REPLY_WORDS, dtype=torch.int64)
        return self._post_numbered(dist.irecv, buf, "reply", seq, self.transfer_timeout_s,
                                   on_done=lambda: [int(x) for x in buf.tolist()])

    def send_payload(self, seq: int, packed: Tensor) -> Pending:
        """Post one request's packed KV: `packed` (uint8, on the KV's device) holds the KV bytes and
        PAYLOAD_TRAILER spare bytes (`pack_blocks(..., extra_bytes=PAYLOAD_TRAILER)`), where the
        trailer is written. One message whatever the model."""
        self.sent["payload"] += 1
        trailer = torch.tensor([packed.numel() - PAYLOAD_TRAILER, seq], dtype=torch.int64).view(torch.uint8)
        packed[-PAYLOAD_TRAILER:].copy_(trailer)
        buf = packed
        if self._stage_host:
            buf = torch.empty(packed.numel(), dtype=torch.uint8, pin_memory=True)
            buf.copy_(packed)
        return self._post_numbered(dist.isend, buf, "payload", seq, self.transfer_timeout_s, data=True)

    def recv_payload(self, seq: int, nbytes: int) -> Pending:
        """Post the receive of one payload of `nbytes` KV bytes; its result is those bytes on this
        rank's device, after the trailer proved the message was exactly that long (SizeMismatch)."""
        device = torch.device("cpu") if self._stage_host else self.device
        buf = torch.empty(
            nbytes + PAYLOAD_TRAILER, dtype=torch.uint8, device=device, pin_memory=self._stage_host
        )
        buf[nbytes:].fill_(0xFF)  # no message number is -1: a short message leaves this in place
        want = [nbytes, seq]

        def checked() -> Tensor:
            got = buf[nbytes:].to("cpu", copy=True).view(torch.int64).tolist()
            if got != want:
                raise SizeMismatch(
                    f"payload {seq}: the message is not the {nbytes:,} bytes announced "
                    f"(trailer {got}, expected {want})"
                )
            return buf[:nbytes].to(self.device)

        return self._post_numbered(dist.irecv, buf, "payload", seq, self.transfer_timeout_s, data=True,
                                   on_done=checked)
