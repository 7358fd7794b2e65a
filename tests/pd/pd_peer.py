"""One rank of a two-process pd burst (CPU over gloo by default; spec["devices"] and spec["backend"]
for GPUs), with optional faults, for tests/pd.

    python -m tests.pd.pd_peer '<spec json>'

Rank 0 prints one JSON line (per-request status, error and tokens, the colocated engine's tokens for
the same requests, the link's message counts, whether every block came back); rank 1 prints one
JSON line after the prefill side said stop. Faults (spec["faults"]: {request index k: fault}; the
message number of request k is k, requests being sent in index order):
  corrupt_header k   one word of request k's header flipped in transit
  wrong_size k       request k's header claims 8 more payload bytes than its blocks hold
  short_payload k    request k's payload is sent 8 bytes short of what the header announced
  lose_payload k     request k's payload goes out under another tag: it never arrives (timeouts)
  kill_prefill k     rank 0 is killed (SIGKILL) after request k was accepted, before its payload
  kill_decode k      rank 1 is killed (SIGKILL) after accepting request k
A rank that loses its peer ends through the worker's one-line exit (code 3).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import torch

from rltbench.bench.workload import burst_prompts
from rltbench.disagg.link import LinkBroken
from rltbench.disagg.rank import connect, exit_on_link_loss
from rltbench.disagg.sides import DecodeSide, PrefillSide
from rltbench.engine import Engine, EngineConfig, SamplingParams
from rltbench.engine.kv_transfer import TransferHeader
from rltbench.models import build_model


class FaultyPrefill(PrefillSide):
    def __init__(self, *args: Any, faults: dict[int, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.faults = faults

    def header_for(self, seq, req, first_token):
        h = super().header_for(seq, req, first_token)
        if self.faults.get(req.index) == "wrong_size":
            h = TransferHeader(**{**h.__dict__, "payload_bytes": h.payload_bytes + 8})
        return h

    def encode_header(self, header):
        t = super().encode_header(header)
        if self.faults.get(header.request) == "corrupt_header":
            t[5] += 1  # the prompt length, as a flipped bit in transit would change it
        return t

    def payload_for(self, rid):
        if self.faults.get(int(rid.rsplit("/", 1)[1])) == "kill_prefill":
            os.kill(os.getpid(), signal.SIGKILL)
        return super().payload_for(rid)

    def send_payload(self, seq, packed):
        if self.faults.get(seq) == "lose_payload":
            return self.link.send_payload(seq + 4096, packed)
        if self.faults.get(seq) == "short_payload":
            return self.link.send_payload(seq, packed[:-8])
        return super().send_payload(seq, packed)


class FaultyDecode(DecodeSide):
    def __init__(self, *args: Any, faults: dict[int, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.faults = faults

    def _on_header(self, seq, raw, *rest):
        out = super()._on_header(seq, raw, *rest)
        if self.faults.get(seq) == "kill_decode":
            os.kill(os.getpid(), signal.SIGKILL)
        return out


def engine_for(spec: dict[str, Any], device: torch.device) -> Engine:
    over = spec.get("overrides", {})
    model = build_model(spec["preset"], device=device, dtype=torch.float32, seed=0, **over)
    per = -(-(spec["input_len"] + spec["output_len"]) // 4)
    cfg = EngineConfig(
        block_size=4,
        num_blocks=spec["C"] * per,
        max_num_seqs=spec["C"],
        max_num_batched_tokens=spec.get("budget_tokens", 64),
        enable_prefix_caching=False,
        max_model_len=spec["input_len"] + spec["output_len"],
        use_cuda_graph=False,  # the transport is under test, not the graphs
    )
    return Engine(model.eval(), ["torch"], cfg)


def main() -> int:
    spec = json.loads(sys.argv[1])
    rank = spec["rank"]
    faults = {int(k): v for k, v in (spec.get("faults") or {}).items()}
    torch.set_num_threads(1)
    state: dict[str, Any] = {}

    def run() -> int:
        dev = torch.device((spec.get("devices") or ["cpu", "cpu"])[rank])
        backend = spec.get("backend", "gloo")
        link = state["link"] = connect(rank, "127.0.0.1", spec["port"], backend, dev, spec["timeout"], 60)
        eng = state["engine"] = engine_for(spec, dev)
        if rank == 1:
            side = FaultyDecode(eng, link, spec["timeout"] * 4, 60, faults=faults)
            cells = side.serve(120)
            print(
                json.dumps(
                    {
                        "rank": 1,
                        "cells": cells,
                        "all_free": eng.blocks.check_all_free(),
                        "sent": dict(link.sent),
                    }
                ),
                flush=True,
            )
            return 0
        cfg = eng.model.config
        reqs = burst_prompts(cfg, spec["C"], spec["input_len"], spec["output_len"], 0, 0, spec["C"])
        side = FaultyPrefill(eng, link, spec.get("budget", 1 << 30), 60, faults=faults)
        cell = side.run_cell("t", reqs, timed=False)
        if cell.link_error is None:
            link.send_json({"op": "stop"}, 60)
        want = eng.generate(
            [r.prompt for r in reqs], SamplingParams(max_tokens=spec["output_len"], ignore_eos=True)
        )
        print(
            json.dumps(
                {
                    "rank": 0,
                    "records": [
                        {k2: r[k2] for k2 in ("request", "status", "error", "token_ids", "pd")}
                        for r in cell.records
                    ],
                    "colocated": [o.token_ids for o in want],
                    "link_error": cell.link_error,
                    "sent": dict(link.sent),
                    "all_free": eng.blocks.check_all_free(),
                    "decode_all_free": cell.decode_info.get("all_blocks_free"),
                    "rejections": cell.decode_info.get("rejections"),
                }
            ),
            flush=True,
        )
        if cell.link_error is not None:
            raise LinkBroken(cell.link_error)
        return 0

    rc = exit_on_link_loss(("prefill", "decode")[rank], run, lambda: state.get("engine"))
    return state["link"].close(rc)


if __name__ == "__main__":
    sys.exit(main())
