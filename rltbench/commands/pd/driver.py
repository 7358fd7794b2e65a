"""What each rank of `rltbench pd` does once connected.

Rank 0 (prefill, on the first device) owns the run: one engine that serves both the colocated cells
(prefill and decode on this one device: the e2e in-process engine) and the prefill half of the pd
cells. Modes `colocated`, `pd` and, for the noise floor, `colocated#2` are interleaved A B C, C B A
per (repetition, concurrency) like e2e arms, on the same prompts. After every pd cell the colocated
engine replays the pd cell's exact batches (the prefill engine's prefill steps, then the decode
engine's decode steps): its tokens must equal the pd tokens bit for bit, which is the identity
verdict (free-running colocated cells batch differently, so their tokens are compared for
information only). Rank 1 (decode) serves the cells rank 0 sends it.

Before any measured cell: each rank's warm-up (graphs, prefill shapes, a small burst), a link probe
(one request's payload sent `probe_reps` times on the idle link: pack, wire and unpack times), and
an untimed pd burst that fills the transfer budget (NCCL connection setup, staging buffers).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from rltbench import runtime
from rltbench.arms import is_exact, parse_arms
from rltbench.backends.base import Request, Timeouts
from rltbench.backends.engine import EngineBackend
from rltbench.bench.workload import Cell, burst_prompts, schedule, warmup_prompts
from rltbench.disagg.link import NO_MULTICAST_ENV, PAYLOAD_TRAILER, Link
from rltbench.disagg.sides import DecodeSide, PrefillCell, PrefillSide
from rltbench.engine import Engine, EngineConfig
from rltbench.engine.kv_transfer import KVGeometry, TransferError, pack_blocks, unpack_blocks
from rltbench.engine.schedule import Schedule, first_divergence
from rltbench.errors import UsageError
from rltbench.models.configs import dtype_from_name
from rltbench.results import RunDir
from rltbench.results.serving import cell_summary, fmt_ms
from rltbench.results.serving_stats import REPLAY_FILE

COLOCATED, PD = "colocated", "pd"
PROBE_SEQ0 = 1 << 27  # message numbers of the link probe, far from the requests'


def modes(aa: bool) -> list[str]:
    """The run's modes, the reference first; `colocated#2` is the A/A mode (noise floor)."""
    return [COLOCATED, PD, f"{COLOCATED}#2"] if aa else [COLOCATED, PD]


def model_source(spec: dict[str, Any]) -> runtime.ModelSource:
    """The model of the spec: preset with seeded random weights or a checkpoint, KV layout override."""
    return runtime.ModelSource(spec["model"], spec["weights"], spec["seed"], spec.get("kv_layout"))


def build_model(spec: dict[str, Any], device: torch.device) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The model of the spec on `device` (random weights are drawn on the device: equal on every
    CUDA device, so both ranks hold the same model)."""
    model, _tok = runtime.load(model_source(spec), str(device), dtype_from_name(spec["dtype"]))
    return model, {"random_weights": bool(getattr(model, "random_weights", spec["weights"] == "random"))}


def blocks_needed(spec: dict[str, Any]) -> int:
    """Blocks of one pool: the largest burst with every request holding prompt + output."""
    per_req = math.ceil((spec["input_len"] + spec["output_len"]) / spec["block_size"])
    return max(spec["concurrency"]) * per_req


def build_engine(model: torch.nn.Module, spec: dict[str, Any]) -> Engine:
    """One rank's engine: the spec's kernel arm, a pool sized for the largest burst (never from free
    memory: two ranks may share one GPU), no prefix cache (bursts of fresh prompts)."""
    ecfg = EngineConfig(
        num_blocks=blocks_needed(spec),
        block_size=spec["block_size"],
        max_num_seqs=max(spec["concurrency"]),
        max_num_batched_tokens=spec["max_num_batched_tokens"],
        enable_prefix_caching=False,
        use_cuda_graph=not spec["enforce_eager"],
        max_model_len=spec["input_len"] + spec["output_len"],
        prefill_graphs=spec["prefill_graphs"],
    )
    return runtime.build_engine(model, parse_arms(spec["arm"]), ecfg, need_blocks=ecfg.num_blocks)


def handshake(link: Link, spec: dict[str, Any], engine: Engine, weights: str) -> None:
    """Both ranks must hold the same model, arm and KV geometry: rank 0 sends its facts, rank 1
    compares and answers; a difference stops both before any work."""
    geo = KVGeometry.of_pool(engine.kv)
    mine = {
        "model": spec["model"],
        "arm": engine.arm,
        "weights": weights,
        "geometry": [geo.planes, geo.block_size, geo.heads, geo.head_dim, str(geo.dtype)],
    }
    t = spec["init_timeout"]
    if link.rank == 0:
        link.send_json(mine, t)
        answer = link.recv_json(t, "the decode side's handshake")
    else:
        theirs = link.recv_json(t, "the prefill side's handshake")
        diff = sorted(k for k in mine if mine[k] != theirs.get(k))
        shown = {k: (theirs.get(k), mine[k]) for k in diff}
        answer = {"ok": not diff, "error": f"the prefill and decode ranks differ in {shown}"}
        link.send_json(answer, t)
    if not answer["ok"]:
        raise UsageError(answer["error"])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def probe_link(link: Link, engine: Engine, spec: dict[str, Any]) -> dict[str, Any] | None:
    """One request's payload (input_len tokens of every plane) moved `probe_reps` + 1 times over the
    idle link; the first move (connection setup) is reported apart. Rank 0 times pack and wire (post
    to completion), rank 1 unpack; both ranks call it, rank 0 returns the figures."""
    geo = KVGeometry.of_pool(engine.kv)
    blocks = list(range(geo.blocks_for(spec["input_len"])))
    nbytes = len(blocks) * geo.bytes_per_block
    reps = spec["probe_reps"] + 1
    dev, t = engine.device, spec["control_timeout"]
    if link.rank == 1:
        unpack = []
        for k in range(reps):
            buf = link.recv_payload(PROBE_SEQ0 + k, nbytes).wait()
            _sync(dev)
            t0 = time.perf_counter()
            unpack_blocks(engine.kv, blocks, buf)
            _sync(dev)
            unpack.append(time.perf_counter() - t0)
        link.send_json({"unpack_s": unpack}, t)
        return None
    pack, wire = [], []
    for k in range(reps):
        _sync(dev)
        t0 = time.perf_counter()
        packed = pack_blocks(engine.kv, blocks, PAYLOAD_TRAILER)
        _sync(dev)
        t1 = time.perf_counter()
        link.send_payload(PROBE_SEQ0 + k, packed).wait()
        t2 = time.perf_counter()
        pack.append(t1 - t0)
        wire.append(t2 - t1)
    unpack = link.recv_json(t, "the link probe's unpack times")["unpack_s"]
    return {
        "bytes": nbytes,
        "blocks": len(blocks),
        "tokens": spec["input_len"],
        "transport": link.transport,
        "first": {"pack_s": pack[0], "wire_s": wire[0], "unpack_s": unpack[0]},
        "pack_s": pack[1:],
        "wire_s": wire[1:],
        "unpack_s": unpack[1:],
    }


def run_decode_rank(spec: dict[str, Any], link: Link, engine: Engine) -> int:
    """Rank 1: warm the decode graphs, take part in the link probe, serve cells until told to stop."""
    engine.runner.warmup(max_context=spec["input_len"] + spec["output_len"])
    probe_link(link, engine, spec)
    side = DecodeSide(engine, link, spec["header_timeout"], spec["control_timeout"])
    side.serve(spec["idle_timeout"])
    final = {
        "stats": engine.stats(),
        "all_blocks_free": engine.blocks.check_all_free(),
        "env": multicast_env(),
    }
    link.send_json(final, spec["control_timeout"])
    return 0


def multicast_env() -> dict[str, str | None]:
    """This process's NVLink-multicast switches, for the manifest (they must read 0, 1, 1)."""
    return {k: os.environ.get(k) for k in NO_MULTICAST_ENV}


def _say(text: str) -> None:
    print(text, flush=True)


def _open_run(spec: dict[str, Any]) -> RunDir:
    """The run directory the command created, opened for writing (rank 0 is its only writer until
    it exits; the command finalises it afterwards)."""
    path = Path(spec["result_dir"])
    return RunDir(path, json.loads((path / "manifest.json").read_text()))


def _pd_warmup_requests(spec: dict[str, Any], config: Any, geo: KVGeometry) -> list[Request]:
    """Enough requests to fill the transfer budget (every staging buffer a measured cell can hold),
    at least `warmup_requests`, at most the largest burst; the burst's prompt length."""
    per_req = geo.blocks_for(spec["input_len"]) * geo.bytes_per_block
    n = max(spec["warmup_requests"], math.ceil(spec["budget_bytes"] / per_req) + 1)
    n = min(n, max(spec["concurrency"]))
    return warmup_prompts(config, n, spec["input_len"], min(spec["output_len"], 4), spec["seed"] + 1)


def identity_replay(
    backend: EngineBackend, arm: str, cell: PrefillCell, requests: list[Request], row: dict[str, Any]
) -> dict[str, Any]:
    """Replay the pd cell's batches (prefill steps of rank 0, then decode steps of rank 1) on the
    colocated engine and compare its tokens with the pd tokens; fills and returns `row`."""
    if any(r["status"] != "ok" for r in cell.records):
        row["skipped"] = "the pd cell has failed requests: its batches cannot be replayed"
        return row
    if cell.prefill_schedule is None or cell.decode_schedule is None:
        row["skipped"] = "a schedule is missing"
        return row
    combined = Schedule(cell.prefill_schedule.steps + cell.decode_schedule.steps, clean_start=True)
    by_rid = {r["request_id"]: r for r in cell.records}
    reqs = {rid: next(q for q in requests if q.index == r["request"]) for rid, r in by_rid.items()}
    t0 = time.perf_counter()
    try:
        got = backend.replay(arm, combined, reqs)
    except Exception as exc:  # reported, never taken for identity
        row["skipped"] = f"replay failed: {type(exc).__name__}: {exc}"
        return row
    divergences = []
    for r in cell.records:
        d = first_divergence(got.get(r["request"], []), r["token_ids"])
        if d is not None:
            have = got.get(r["request"], [])
            divergences.append(
                {
                    "request": r["request"],
                    "token_index": d,
                    "step": combined.step_of_token(r["request_id"], d),
                    "ref_token": r["token_ids"][d] if d < len(r["token_ids"]) else None,
                    "arm_token": have[d] if d < len(have) else None,
                }
            )
    row.update(
        seconds=time.perf_counter() - t0,
        compared=len(cell.records),
        identical=len(cell.records) - len(divergences),
        divergences=divergences,
        steps=combined.summary()["steps"],
    )
    return row


def run_prefill_rank(spec: dict[str, Any], link: Link, engine: Engine, facts: dict[str, Any]) -> int:
    """Rank 0: warm-ups, link probe, the interleaved cells, identity replays; rows into the run
    directory as they finish. Returns 1 when an exact arm's pd tokens differ from the colocated
    replay (a transfer or engine bug), else 0."""
    run = _open_run(spec)
    arm = engine.arm
    exact = is_exact(parse_arms(spec["arm"])[arm])
    config = engine.model.config
    geo = KVGeometry.of_pool(engine.kv)
    backend = EngineBackend(engine, [arm])
    timeouts = Timeouts(spec["ttft_timeout"], spec["stall_timeout"], spec.get("deadline"))
    prefill = PrefillSide(engine, link, spec["budget_bytes"], spec["control_timeout"])
    warm = warmup_prompts(
        config,
        min(spec["warmup_requests"], max(spec["concurrency"])),
        spec["input_len"],
        min(spec["output_len"], 4),
        spec["seed"],
    )
    _say(f"warm-up: colocated engine ({len(warm)} requests, graphs), then the link probe and a pd burst")
    backend.warmup(arm, warm, timeouts)
    probe = probe_link(link, engine, spec)
    run.write_json("link_probe.json", probe)
    wcell = prefill.run_cell("warmup", _pd_warmup_requests(spec, config, geo), timed=False)
    if wcell.link_error is not None:
        raise TransferError(wcell.link_error)
    warm_fail = [r["error"] for r in wcell.records if r["status"] != "ok"]
    run.update_manifest(warmup={"pd_requests": len(wcell.records), "failed": warm_fail[:3]})
    order = schedule(modes(spec["aa"]), [Cell(f"C={c}", c) for c in spec["concurrency"]], spec["repeats"])
    status, mismatch = "complete", False
    for n, (rep, cell, mode) in enumerate(order):
        if timeouts.deadline_passed():
            run.update_manifest(skipped_cells=len(order) - n, interrupted_by="global deadline (--deadline)")
            status = "interrupted"
            break
        reqs = burst_prompts(config, cell.C, spec["input_len"], spec["output_len"], spec["seed"], rep, cell.C)
        tag = f"{mode}/{cell.name}/r{rep}"
        meta: dict[str, Any] = {
            "arm": mode,
            "cell": cell.name,
            "C": cell.C,
            "rep": rep,
            "order": n,
            "workload": "burst",
            "started": time.time(),
        }
        if mode == PD:
            res = prefill.run_cell(tag, reqs)
            recs = res.records
            meta.update(
                cold_work=res.cold_work,
                decode=res.decode_info,
                link_error=res.link_error,
                payload_messages=link.sent["payload"],
            )
        else:
            result = backend.run_cell(arm, tag, reqs, timeouts)
            recs = result.records
            meta.update(cold_work=dict(result.cold_work), schedule=result.schedule.summary())
        meta["wall_s"] = time.time() - meta["started"]
        for r in recs:
            r.update(arm=mode, cell=cell.name, C=cell.C, rep=rep)
        run.extend_jsonl("requests.jsonl", recs)
        run.append_jsonl("cell_meta.jsonl", meta)
        s = cell_summary(recs)
        _say(
            f"cell {n + 1}/{len(order)} {mode} {cell.name} rep {rep}: {s['n_ok']}/{s['requests']} ok, "
            f"TTFT p50 {fmt_ms(s['ttft_p50'])} ms, TPOT p50 {fmt_ms(s['tpot_p50'])} ms"
        )
        if mode == PD:
            if res.link_error is not None:
                run.update_manifest(status="failed", link_error=res.link_error)
                raise TransferError(res.link_error)
            row = identity_replay(
                backend,
                arm,
                res,
                reqs,
                {"arm": PD, "cell": cell.name, "C": cell.C, "rep": rep, "ref": COLOCATED, "exact_arm": exact},
            )
            run.append_jsonl(REPLAY_FILE, row)
            bad = row.get("compared", 0) - row.get("identical", 0)
            mismatch |= exact and bad > 0
            _say(
                "  identity (colocated replay of the pd batches): "
                + (row["skipped"] if "skipped" in row else f"{row['identical']}/{row['compared']}")
            )
    link.send_json({"op": "stop"}, spec["control_timeout"])
    decode = link.recv_json(spec["control_timeout"], "the decode side's final stats")
    engine.reset_prefix_cache()
    run.update_manifest(
        status=status,
        engine_stats={"prefill": engine.stats(), "decode": decode.get("stats")},
        all_blocks_free={"prefill": engine.blocks.check_all_free(), "decode": decode.get("all_blocks_free")},
        messages=dict(link.sent),
        multicast_env={"prefill": multicast_env(), "decode": decode.get("env")},
        **facts,
    )
    return 1 if mismatch else 0
