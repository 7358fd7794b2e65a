"""The `rltbench pd` process: check every option, create the run directory, start the two ranks
(`python -m rltbench.commands.pd.worker`), supervise them, finalise the manifest and render.

Supervision: both ranks print their own progress; the last lines of each rank's stderr are kept for
the manifest. When one rank exits with an error the other gets the transfer timeout plus a margin
to notice and exit by itself (its link then reports the lost peer), then it is terminated: the
command never waits on a hung rank. Ctrl-C reaches both ranks (same process group); they are given
a few seconds, then terminated, and everything finished stays on disk.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rich.console import Console

from rltbench import runtime
from rltbench.arms import is_exact, parse_arms
from rltbench.bench.workload import fit_burst_lengths
from rltbench.commands.pd import report
from rltbench.disagg.link import NO_MULTICAST_ENV
from rltbench.engine.kv_transfer import KVGeometry
from rltbench.errors import UsageError
from rltbench.options import comma_list, parse_concurrency
from rltbench.results import RunDir

REPO_ROOT = Path(__file__).resolve().parents[3]
GRACE_S = 10.0  # beyond the transfer timeout, for a rank to notice that its peer is gone
ROLES = ("prefill", "decode")


def _parse_devices(text: str | None) -> list[str]:
    """'cuda:0,cuda:1' -> ['cuda:0', 'cuda:1'] (checked against this machine); None -> the default."""
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if text is None:
        return (
            ["cuda:0", "cuda:1"] if n_gpu >= 2 else (["cuda:0", "cuda:0"] if n_gpu == 1 else ["cpu", "cpu"])
        )
    parts = comma_list(text, "--devices", "cuda:0,cuda:1")
    if len(parts) != 2:
        raise UsageError(f"--devices {text}: give two devices, prefill then decode (e.g. cuda:0,cuda:1)")
    out = []
    for p in parts:
        if p == "cpu":
            out.append(p)
            continue
        kind, _, idx = p.partition(":")
        if kind != "cuda" or (idx and not idx.isdigit()):
            raise UsageError(f"--devices: {p!r} is not cpu or cuda:N")
        i = int(idx or 0)
        if i >= n_gpu:
            raise UsageError(f"--devices: {p} does not exist here ({n_gpu} CUDA device(s))")
        out.append(f"cuda:{i}")
    if (out[0] == "cpu") != (out[1] == "cpu"):
        raise UsageError(
            "--devices: both ranks on CPU or both on GPUs (random weights differ between "
            "CPU and CUDA, and the payload would change device on the way)"
        )
    return out


def _backend(choice: str, devices: list[str]) -> str:
    """The payload transport. NCCL refuses two ranks on one GPU and cannot move CPU tensors."""
    two_gpus = devices[0].startswith("cuda") and devices[0] != devices[1]
    if choice == "auto":
        return "nccl" if two_gpus and dist.is_nccl_available() else "gloo"
    if choice == "gloo":
        return choice
    if choice != "nccl":
        raise UsageError(f"--backend must be auto, nccl or gloo, not {choice!r}")
    if not two_gpus:
        raise UsageError(
            f"--backend nccl needs two different GPUs (NCCL rejects two ranks on one device "
            f"and CPU tensors); --devices is {','.join(devices)}: use --backend gloo"
        )
    if not dist.is_nccl_available():
        raise UsageError("--backend nccl: this torch has no NCCL")
    return choice


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check(opts: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every option checked before any work: (the spec both ranks get, facts for the manifest). The
    numbers were checked against their bounds when the command line was parsed (rltbench.options)."""
    concurrency = parse_concurrency(opts["concurrency"])
    arms = parse_arms(opts["arm"])
    if len(arms) != 1:
        raise UsageError(f"--arm: one kernel arm (both engines run it), got {', '.join(arms)}")
    ((arm_name, selection),) = arms.items()
    devices = _parse_devices(opts["devices"])
    backend = _backend(opts["backend"], devices)
    config = runtime.ModelSource(opts["model"], opts["weights"], opts["seed"], opts["kv_layout"]).config()
    input_len, output_len, note = fit_burst_lengths(opts["input_len"], opts["output_len"],
                                                    int(config.max_position_embeddings), opts["model"])
    opts = {**opts, "input_len": input_len, "output_len": output_len}
    dtype = runtime.resolve_dtype(opts["dtype"], devices[0])
    geo = KVGeometry(
        int(config.num_kv_planes), opts["block_size"], int(config.num_kv_heads), int(config.head_dim), dtype
    )
    pool_blocks = max(concurrency) * math.ceil((opts["input_len"] + opts["output_len"]) / opts["block_size"])
    pool_bytes = pool_blocks * geo.bytes_per_block
    if devices[0] == "cpu":
        runtime.check_cpu_kv_bytes(
            2 * pool_bytes,
            f"one pool per rank, each {pool_blocks} blocks of {geo.block_size} tokens, "
            f"{geo.planes} KV planes",
        )
    spec = {
        "model": opts["model"],
        "weights": opts["weights"],
        "kv_layout": opts["kv_layout"],
        "dtype": runtime.dtype_name(dtype),
        "devices": devices,
        "backend": backend,
        "addr": "127.0.0.1",
        "port": _free_port(),
        "arm": opts["arm"],
        "aa": opts["aa"],
        "concurrency": concurrency,
        "input_len": opts["input_len"],
        "output_len": opts["output_len"],
        "repeats": opts["repeats"],
        "seed": opts["seed"],
        "block_size": opts["block_size"],
        "max_num_batched_tokens": opts["max_num_batched_tokens"],
        "enforce_eager": opts["enforce_eager"],
        "prefill_graphs": opts["prefill_graphs"],
        "budget_bytes": int(opts["transfer_budget_gib"] * 2**30),
        "transfer_timeout": opts["transfer_timeout"],
        "ttft_timeout": opts["ttft_timeout"],
        "stall_timeout": opts["stall_timeout"],
        "deadline": opts["deadline"],
        # a rank waits this long for the other to build its model, or for a cell's records
        "init_timeout": 900.0,
        "control_timeout": 900.0,
        "header_timeout": opts["ttft_timeout"],
        "idle_timeout": 3600.0,
        "warmup_requests": opts["warmup_requests"],
        "probe_reps": opts["probe_reps"],
    }
    bytes_per_token = geo.bytes_per_block // geo.block_size
    facts = {
        "kernel_arm": arm_name,
        "arm_spec": selection.settings(),
        "exact_arm": is_exact(selection),
        "family": config.family,
        "kv_layout": getattr(config, "kv_layout", None),
        "num_kv_planes": geo.planes,
        "kv_bytes_per_token": bytes_per_token,
        "kv_bytes_per_block": geo.bytes_per_block,
        "pool_bytes_per_rank": pool_bytes,
        "random_weights": opts["weights"] == "random",
        "device": devices[0],
        "torch": torch.__version__,
        "notes": [note] if note else [],
    }
    return spec, facts


class _Rank:
    """One started rank: its process and the last lines of its stderr (passed through as they come)."""

    def __init__(self, rank: int, spec: dict[str, Any], env: dict[str, str]) -> None:
        self.rank = rank
        self.role = ROLES[rank]
        self.tail: deque[str] = deque(maxlen=20)
        cmd = [
            sys.executable,
            "-m",
            "rltbench.commands.pd.worker",
            "--rank",
            str(rank),
            "--spec",
            json.dumps(spec),
        ]
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=str(REPO_ROOT), stderr=subprocess.PIPE, text=True, bufsize=1
        )
        self._pump = threading.Thread(target=self._forward, daemon=True)
        self._pump.start()

    def _forward(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.tail.append(line.rstrip("\n"))
            sys.stderr.write(line)
            sys.stderr.flush()

    def stop(self) -> None:
        """Terminate (then kill) this rank if it still runs."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._pump.join(2)


def supervise(ranks: list[_Rank], grace_s: float) -> None:
    """Wait for both ranks; once one has failed, the other gets `grace_s` to end by itself."""
    failed_at = None
    while any(r.proc.poll() is None for r in ranks):
        codes = [r.proc.poll() for r in ranks]
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            for r in ranks:
                r.stop()
            break
        time.sleep(0.1)
    for r in ranks:
        r.stop()


def run(opts: dict[str, Any]) -> int:
    """Check, start, supervise, finalise, render. Returns the command's exit code (0 ok; 1 when an
    exact arm's pd tokens differ from the colocated replay; the failing rank's code otherwise)."""
    spec, facts = check(opts)
    config = {k: v for k, v in spec.items() if k not in ("addr", "port", "deadline")}
    config.update(facts, deadline_s=opts["deadline_s"], reference_arm="colocated")
    run_dir = RunDir.create("pd", result_dir=opts["result_dir"], argv=opts.get("argv"), config=config)
    spec["result_dir"] = str(run_dir.path)
    os.environ.update(NO_MULTICAST_ENV)  # this process starts the ranks: it carries the switches too
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    con = Console(stderr=True)
    con.print(
        f"pd: {spec['model']} on {','.join(spec['devices'])} ({spec['backend']}); results: {run_dir.path}",
        highlight=False,
        soft_wrap=True,
    )
    for note in facts["notes"]:
        con.print(f"[yellow]note: {note}[/]", highlight=False, soft_wrap=True)
    caption = report.no_verdict_caption(config)
    if caption:  # the ranks print timings cell by cell: say first what they are worth
        con.print(f"[yellow]note: {caption}; the timings below say nothing of a GPU[/]", highlight=False)
    ranks = [_Rank(r, spec, env) for r in (0, 1)]
    interrupted = False
    try:
        supervise(ranks, spec["transfer_timeout"] + GRACE_S)
    except KeyboardInterrupt:
        interrupted = True
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(r.proc.poll() is None for r in ranks):
            time.sleep(0.1)
        for r in ranks:
            r.stop()
    codes = [r.proc.returncode for r in ranks]
    final = RunDir(run_dir.path, json.loads((run_dir.path / "manifest.json").read_text()))
    if interrupted and final.stored_nothing():  # Ctrl-C before a rank stored a result: nothing to keep
        run_dir.manifest = final.manifest
        run_dir.discard()
        raise KeyboardInterrupt  # the CLI says so in one line
    status = final.manifest.get("status")
    if interrupted:
        status = "interrupted"
    elif status == "running":
        status = "complete" if codes == [0, 0] else "failed"
    final.update_manifest(
        status=status,
        ranks={r.role: {"exit_code": r.proc.returncode, "stderr_tail": list(r.tail)[-5:]} for r in ranks},
    )
    try:
        analysis = report.render(run_dir.path)
        if not interrupted:  # after Ctrl-C the CLI's one line names the run, table.md has the rest
            report.print_summary(con, analysis, run_dir.path)
    except Exception as exc:  # a report failure must not hide the measured data
        con.print(f"[red]report failed: {type(exc).__name__}: {exc}[/]", highlight=False)
    if interrupted:
        raise KeyboardInterrupt
    if codes[0] not in (0, None):
        return codes[0]
    return codes[1] if codes[1] not in (0, None) else 0
