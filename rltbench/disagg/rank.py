"""What every rank of a two-process prefill/decode run needs besides its own work: joining the
two-rank group (`connect`), the one-line exit on a lost link (`exit_on_link_loss`) and the model
fingerprint both ranks compare before any transfer (`fingerprint`).

A rank whose link to the other is lost (the peer exited, crashed or was killed; a transfer that could
not be abandoned timed out) prints one line saying so and whether every KV block came back, and
exits with code 3 at once, without waiting on the dead process group.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rltbench.disagg.link import NO_MULTICAST_ENV, Link, new_link_groups
from rltbench.engine.kv_transfer import TransferError

EXIT_LINK_LOST = 3
ROLES = ("prefill", "decode")


def connect(
    rank: int,
    addr: str,
    port: int,
    backend: str,
    device: torch.device,
    transfer_timeout_s: float,
    init_timeout_s: float,
) -> Link:
    """Join the two-rank group and return the link: the default group (gloo; its timeout bounds the
    rendezvous) only connects; the link's own groups carry control messages (gloo) and payloads
    (`backend`). NCCL's asynchronous error handling would abort the process on a lost peer before
    the link could say so in one line: it is off unless the environment sets it."""
    os.environ.update(NO_MULTICAST_ENV)
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=init_timeout_s),
    )
    ctrl, data = new_link_groups(backend)
    return Link(rank, ctrl, data, device, backend == "nccl", transfer_timeout_s)


def exit_on_link_loss(role: str, run: Callable[[], int], engine_of: Callable[[], Any]) -> int:
    """Run a rank; a lost link is one line on stderr and exit code 3 (os._exit: a dead process
    group's destructors could wait on the peer)."""
    try:
        return run()
    except TransferError as exc:
        engine = engine_of()
        if engine is None:
            blocks = "no engine was built"
        else:
            for rid in engine.held.request_ids:
                engine.held.release(rid)
            free = engine.blocks.check_all_free()
            blocks = (
                "every KV block returned"
                if free
                else (f"{engine.num_blocks - engine.blocks.num_free_blocks} KV blocks still held")
            )
        peer = ROLES[1 - ROLES.index(role)]
        print(
            f"pd {role}: link to the {peer} rank lost ({exc.reason}: {exc}); {blocks}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_LINK_LOST)


def fingerprint(model: torch.nn.Module, per_param: int = 256) -> str:
    """A digest of the bits of `per_param` evenly spaced values of every parameter: both ranks must
    run the same model, or the decode side would continue another model's KV. No reduction (its
    order could differ between devices) and no full copy of a large parameter."""
    h = hashlib.blake2b(digest_size=16)
    for p in model.parameters():
        flat = p.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // per_param)][:per_param]
        h.update(sample.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
