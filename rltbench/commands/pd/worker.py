"""One rank of `rltbench pd`, started by the command as `python -m rltbench.commands.pd.worker
--rank R --spec JSON`: join the process group, build the model and engine, check that both ranks
hold the same model, then rank 0 drives the run (driver.py) and rank 1 serves decode cells. A lost
link exits with code 3 in one line (rltbench.disagg.rank.exit_on_link_loss).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch

from rltbench.commands.pd import driver
from rltbench.disagg.rank import ROLES, connect, exit_on_link_loss, fingerprint
from rltbench.errors import UsageError


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
