"""One rank of `rltbench pd`, started by the command as `python -m rltbench.commands.pd.worker
--rank R --spec JSON`: join the process group, build the model and engine, check that both ranks
hold the same model, then rank 0 drives the run (driver.py) and rank 1 serves decode cells.

A rank whose link to the other is lost (the peer exited, crashed or was killed; a transfer that could
not be abandoned timed out) prints one line saying so and whether every KV block came back, and
exits with code 3 at once, without waiting on the dead process group.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rltbench.commands.pd import driver
from rltbench.commands.pd.link import NO_MULTICAST_ENV, Link, new_link_groups
from rltbench.engine.kv_transfer import TransferError
from rltbench.errors import UsageError

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rltbench.commands.pd.worker")
    ap.add_argument("--rank", type=int, choices=(0, 1), required=True)
    ap.add_argument("--spec", required=True, help="the run's spec as JSON (written by `rltbench pd`)")
    args = ap.parse_args(argv)
    spec = json.loads(args.spec)
    role = ROLES[args.rank]
    state: dict[str, Any] = {}

    def run() -> int:
        device = torch.device(spec["devices"][args.rank])
        link = state["link"] = connect(
            args.rank,
            spec["addr"],
            spec["port"],
            spec["backend"],
            device,
            spec["transfer_timeout"],
            spec["init_timeout"],
        )
        if device.type == "cpu":  # two ranks share the cores: do not oversubscribe them
            torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
        model, facts = driver.build_model(spec, device)
        state["engine"] = engine = driver.build_engine(model, spec)
        driver.handshake(link, spec, engine, fingerprint(model))
        if args.rank == 0:
            return driver.run_prefill_rank(spec, link, engine, facts)
        return driver.run_decode_rank(spec, link, engine)

    try:
        rc = exit_on_link_loss(role, run, lambda: state.get("engine"))
    except UsageError as exc:
        print(f"pd {role}: error: {exc}", file=sys.stderr, flush=True)
        rc = exc.exit_code
    except KeyboardInterrupt:
        rc = 130
    link = state.get("link")
    return link.close(rc) if link is not None else rc


if __name__ == "__main__":
    sys.exit(main())
