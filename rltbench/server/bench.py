"""Measurement helpers around `rltbench serve` (used by scripts/serve_bench.sh on a GPU):

    python -m rltbench.server.bench wait URL              # until /health answers 200
    python -m rltbench.server.bench check URL             # every KV block free, none live
    python -m rltbench.server.bench scrape URL FILE.json  # /metrics as JSON (before/after)
    python -m rltbench.server.bench soak URL --out DIR    # N bursts, blocks checked after each
    python -m rltbench.server.bench compare --http RUN --inproc RUN [--peer GUIDELLM.json]
                                            [--scrapes DIR] --out table.md
    python -m rltbench.server.bench rate-compare --rlt RUN --peer GUIDELLM.json [--rlt-aa RUN2]
                                                 --out rate_check.md

Every number comes from raw files through `rltbench.results.serving.cell_summary`, the one metrics layer:
rltbench's e2e run directories (requests.jsonl) and guidellm's JSON report, whose per-request
timestamps are turned into the same records, so the peer's raw timings are also read with rltbench's
definitions beside the figures guidellm reports itself. `rate-compare` is the open-loop cross-check
(rltbench.results.peer_check): an `e2e --workload rate` run and guidellm's constant or Poisson rates,
and optionally the same e2e run again after guidellm (the A/A leg, which tells noise from a difference).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

from rltbench.backends.base import Timeouts
from rltbench.backends.openai import OpenAIBackend
from rltbench.bench.workload import burst_prompts
from rltbench.errors import UsageError
from rltbench.models import get_config
from rltbench.results.guidellm import read_report
from rltbench.results.peer_check import DIFFERS, check_lines, cross_check, run_rate_records, verdict_tally
from rltbench.results.rundir import read_jsonl
from rltbench.results.serving import cell_summary
from rltbench.results.tables import table
from rltbench.server.metrics import parse_text

SOAK_SETTLE_S = 5.0  # blocks are freed in the step that finishes a request; allow for a slow /metrics


# ---- server probes -------------------------------------------------------------------------------
def wait_ready(url: str, timeout_s: float) -> None:
    """Poll /health until it answers 200 (the server listens only once warm)."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > end:
            raise SystemExit(f"{url} not ready after {timeout_s:g} s")
        time.sleep(1.0)


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        return parse_text(resp.read().decode())


def pool_state(m: dict[str, float]) -> dict[str, Any]:
    """KV and request gauges of one scrape, and whether the server is back to empty."""
    state = {
        "kv_free": int(m["rltbench_kv_blocks_free"]),
        "kv_total": int(m["rltbench_kv_blocks_total"]),
        "running": int(m["rltbench_requests_running"]),
        "waiting": int(m["rltbench_requests_waiting"]),
    }
    state["blocks_returned"] = (
        state["kv_free"] == state["kv_total"] and state["running"] == 0 and state["waiting"] == 0
    )
    return state


# ---- soak: consecutive bursts ----------------------------------------------------------------------
def soak(
    url: str,
    model: str,
    bursts: int,
    concurrency: int,
    input_len: int,
    output_len: int,
    seed: int,
    out_dir: Path,
) -> int:
    """`bursts` bursts of `concurrency` requests through rltbench's OpenAI client; after each, /metrics
    must show every KV block free and no live request. Writes soak.jsonl and soak.md; 0 = all clean."""
    config = get_config(model)
    backend = OpenAIBackend({"served": url})
    timeouts = Timeouts(first_token=300.0, stall=120.0)
    backend.warmup("served", [], timeouts)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    before = scrape(url)
    for i in range(bursts):
        reqs = burst_prompts(config, concurrency, input_len, output_len, seed + 1000, i, concurrency)
        recs = backend.run_cell("served", f"soak/r{i}", reqs, timeouts).records
        summ = cell_summary(recs)
        end = time.monotonic() + SOAK_SETTLE_S
        while True:
            state = pool_state(scrape(url))
            if state["blocks_returned"] or time.monotonic() > end:
                break
            time.sleep(0.2)
        failed = [r for r in recs if r["status"] != "ok"]
        rows.append(
            {
                "burst": i,
                "requests": len(recs),
                "failed": len(failed),
                "errors": sorted({str(r.get("error"))[:120] for r in failed}),
                "ttft_p50_ms": _ms(summ["ttft_p50"]),
                "tpot_p50_ms": _ms(summ["tpot_p50"]),
                "output_tok_s": summ["output_tok_s"],
                **state,
            }
        )
        print(
            f"burst {i}: {len(recs) - len(failed)}/{len(recs)} ok, KV {state['kv_free']}/{state['kv_total']} "
            f"free, running {state['running']} waiting {state['waiting']}",
            flush=True,
        )
    after = scrape(url)
    (out_dir / "soak.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    clean = all(r["failed"] == 0 and r["blocks_returned"] for r in rows)
    key = 'rltbench_requests_total{status="ok"}'
    lines = [
        f"# {bursts} consecutive bursts of C={concurrency} ({input_len} in / {output_len} out) against {url}",
        "",
        f"Result: {'CLEAN' if clean else 'NOT CLEAN'}: {sum(r['failed'] for r in rows)} failed requests; "
        f"{sum(r['blocks_returned'] for r in rows)}/{bursts} bursts ended with every KV block free and "
        f"no live request; server-counted ok requests +{after.get(key, 0) - before.get(key, 0):.0f}.",
        "",
        *table(["burst", "ok", "failed", "KV free/total", "running", "waiting", "TTFT p50 ms", "TPOT p50 ms",
                "output tok/s"],
               [[r["burst"], r["requests"] - r["failed"], r["failed"], f"{r['kv_free']}/{r['kv_total']}",
                 r["running"], r["waiting"], _fmt(r["ttft_p50_ms"]), _fmt(r["tpot_p50_ms"]),
                 _fmt(r["output_tok_s"], 0)] for r in rows], "r"),
    ]
    (out_dir / "soak.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:3]))
    return 0 if clean else 1


# ---- comparison tables ---------------------------------------------------------------------------
def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3


def _fmt(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _pct(new: float | None, base: float | None) -> str:
    if new is None or not base:
        return "-"
    return f"{100.0 * (new - base) / base:+.1f}%"


def run_cells(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """rltbench e2e run -> {C: [cell_summary of each repetition]} (single-arm runs)."""
    recs = read_jsonl(Path(run_dir) / "requests.jsonl")
    groups: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        groups[(int(r["C"]), int(r["rep"]))].append(r)
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for (c, _rep), rs in sorted(groups.items()):
        out[c].append(cell_summary(rs))
    return dict(out)


def run_tokens(run_dir: Path) -> dict[tuple[int, int, int], list[int] | None]:
    recs = read_jsonl(Path(run_dir) / "requests.jsonl")
    return {(int(r["C"]), int(r["rep"]), int(r["request"])): r.get("token_ids") for r in recs}


def peer_cells(report_path: Path) -> dict[int, dict[str, Any]]:
    """guidellm JSON -> {C: {"rlt": cell_summary of its raw timestamps, "own": its reported medians}}.

    A concurrent@C benchmark limited to C requests is one burst of C (rltbench.results.guidellm reads
    the report); where a C ran twice, the benchmark with more requests is kept."""
    out: dict[int, dict[str, Any]] = {}
    for b in read_report(report_path):
        if b.strategy != "concurrent" or b.load is None:
            continue
        ok = [r for r in b.records if r["status"] == "ok"]
        cell = cell_summary(ok) if ok else {}
        prev = out.get(int(b.load))
        if prev is None or cell.get("requests", 0) > prev["rlt"].get("requests", 0):
            out[int(b.load)] = {"rlt": cell, "own": b.own}
    return out


def _median(cells: list[dict[str, Any]], key: str) -> float | None:
    vals = [c[key] for c in cells if c.get(key) is not None]
    return statistics.median(vals) if vals else None


def _span(cells: list[dict[str, Any]], key: str, scale: float = 1e3) -> tuple[float, float] | None:
    vals = [c[key] * scale for c in cells if c.get(key) is not None]
    return (min(vals), max(vals)) if vals else None


def device_note(run_dir: Path) -> str:
    """Where the numbers come from, and when they cannot mean anything."""
    cfg = json.loads((Path(run_dir) / "manifest.json").read_text()).get("config", {})
    device = str(cfg.get("device", "?"))
    note = f"Model {cfg.get('model', '?')}, {cfg.get('dtype', '?')} on {device}"
    if cfg.get("random_weights"):
        note += "; random weights (real shapes and timings, meaningless text)"
    if device == "cpu":
        note += (
            ". NOT A GPU RUN: CPU timings here reflect thread contention and Python overhead, not "
            "serving cost; this checks the pipeline, not the speed"
        )
    return note + "."


def overhead_table(http_dir: Path, inproc_dir: Path) -> list[str]:
    """HTTP path vs in-process engine, same load: per C the median over repetitions of each cell's p50,
    the repetitions' range, and 'within noise' where the two ranges overlap."""
    http, local = run_cells(http_dir), run_cells(inproc_dir)
    lines = [
        "## HTTP (rltbench serve + rltbench's OpenAI client) vs in-process engine, same burst load",
        "",
        "Per C: median over repetitions of the cell's p50 (TTFT, TPOT) or of its output tok/s; [min, max] "
        "over repetitions in brackets; overhead = HTTP - in-process. 'within noise' = the ranges overlap.",
        "",
    ]
    rows = []
    for c in sorted(set(http) & set(local)):
        for key, label, scale in (
            ("ttft_p50", "TTFT p50 ms", 1e3),
            ("tpot_p50", "TPOT p50 ms", 1e3),
            ("output_tok_s", "output tok/s", 1.0),
        ):
            a, b = _median(local[c], key), _median(http[c], key)
            ra, rb = _span(local[c], key, scale), _span(http[c], key, scale)
            if a is None or b is None or ra is None or rb is None:
                continue
            verdict = "within noise" if ra[0] <= rb[1] and rb[0] <= ra[1] else "differs"
            rows.append([c, label, f"{a * scale:.2f} [{ra[0]:.2f}, {ra[1]:.2f}]",
                         f"{b * scale:.2f} [{rb[0]:.2f}, {rb[1]:.2f}]", f"{(b - a) * scale:+.2f}", _pct(b, a),
                         verdict])
    lines += table(["C", "metric", "in-process", "HTTP", "overhead", "overhead %", "verdict"], rows,
                   ["r", "", "r", "r", "r", "r", ""])
    valid_http = all(cell["valid"] for cells in http.values() for cell in cells)
    valid_local = all(cell["valid"] for cells in local.values() for cell in cells)
    toks_h, toks_l = run_tokens(http_dir), run_tokens(inproc_dir)
    common = [k for k in toks_h if k in toks_l and toks_h[k] is not None and toks_l[k] is not None]
    same = sum(toks_h[k] == toks_l[k] for k in common)
    lines += [
        "",
        f"Cells valid (every request ok with its exact token count): HTTP {valid_http}, in-process "
        f"{valid_local}. Generated ids identical over HTTP and in-process: {same}/{len(common)} requests "
        "(greedy outputs need not be batch-invariant: requests reach the engine in another order over HTTP).",
    ]
    return lines


def peer_table(http_dir: Path, peer_path: Path) -> list[str]:
    """guidellm vs rltbench's own client, same server and load."""
    http, peer = run_cells(http_dir), peer_cells(peer_path)
    lines = [
        "## Peer client (guidellm) vs rltbench's client, same server, same burst load",
        "",
        "rltbench: its e2e client (median over repetitions of the cell p50; output tok/s = tokens / (last "
        "token - first send)). guidellm (rlt defs): guidellm's own per-request timestamps read with "
        "rltbench's definitions. guidellm (own): the medians guidellm reports; its ITL is rltbench's TPOT, "
        "its TPOT = (last token - sent) / N includes the first token; its output tok/s is the mean of its "
        "rate series.",
        "",
    ]
    out: list[list[Any]] = []
    for c in sorted(set(http) & set(peer)):
        p, own = peer[c]["rlt"], peer[c]["own"]
        rows = (
            ("TTFT p50 ms", _ms(_median(http[c], "ttft_p50")), _ms(p.get("ttft_p50")), own["ttft_ms"]),
            (
                "TPOT p50 ms (guidellm: ITL)",
                _ms(_median(http[c], "tpot_p50")),
                _ms(p.get("tpot_p50")),
                own["itl_ms"],
            ),
            ("guidellm TPOT (incl. TTFT) ms", None, None, own["tpot_ms"]),
            ("output tok/s", _median(http[c], "output_tok_s"), p.get("output_tok_s"), own["output_tok_s"]),
        )
        out += [[c, label, _fmt(rlt), _fmt(mine), _pct(mine, rlt), _fmt(theirs), _pct(theirs, rlt)]
                for label, rlt, mine, theirs in rows]
        if own["errored"] or own["incomplete"] or p.get("requests") != c:
            out.append([c, "requests", c, f"{p.get('requests')} ok", "",
                        f"{own['errored']} errored, {own['incomplete']} incomplete", ""])
    return lines + table(["C", "metric", "rltbench", "guidellm (rlt defs)", "diff", "guidellm (own)", "diff"],
                         out, ["r", "", "r", "r", "r", "r", "r"])


def server_view(scrapes: Path, clients: tuple[str, ...] = ("http", "peer")) -> list[str]:
    """The server's own mean TTFT and ITL while each client ran, from /metrics scraped before and after
    (metrics_<client>_before.json / _after.json): if the server's figures move with the client, the
    client slowed the server (it shares the CPU); if only the client's figures move, the difference is
    in the client's measurement."""
    rows = []
    for name in clients:
        a, b = scrapes / f"metrics_{name}_before.json", scrapes / f"metrics_{name}_after.json"
        if not (a.is_file() and b.is_file()):
            continue
        m0, m1 = json.loads(a.read_text()), json.loads(b.read_text())

        def delta(key: str, m0: dict[str, float] = m0, m1: dict[str, float] = m1) -> float:
            return m1.get(key, 0.0) - m0.get(key, 0.0)

        def mean_ms(hist: str) -> float | None:
            n = delta(f"rltbench_{hist}_count")
            return 1e3 * delta(f"rltbench_{hist}_sum") / n if n else None

        client = "rltbench e2e" if name == "http" else "guidellm"
        ok = delta('rltbench_requests_total{status="ok"}')
        ttft, itl = mean_ms("time_to_first_token_seconds"), mean_ms("inter_token_latency_seconds")
        tokens = delta("rltbench_generation_tokens_total")
        rows.append([client, f"{ok:.0f}", _fmt(ttft), _fmt(itl), f"{tokens:.0f}"])
    if not rows:
        return []
    return ["## The server's own view while each client ran (/metrics before and after)", "",
            *table(["client", "requests ok", "mean TTFT ms", "mean ITL ms", "generated tokens"], rows,
                   ["", "r", "r", "r", "r"])]


SAME_LOAD_KEYS = ("model", "arm_specs", "workload", "rate", "lengths", "seed", "input_len", "output_len")


def _same_load(cfg: dict[str, Any], cfg_aa: dict[str, Any]) -> None:
    """The A/A leg must be the same load on the same server, or its spread says nothing about noise."""
    for key in SAME_LOAD_KEYS:
        if cfg.get(key) != cfg_aa.get(key):
            raise UsageError(f"--rlt-aa: the run's {key} ({cfg_aa.get(key)!r}) is not --rlt's "
                             f"({cfg.get(key)!r}); the A/A leg reruns the same load")


def rate_check(rlt_dir: Path, peer_path: Path, rlt_aa_dir: Path | None = None) -> tuple[list[str], bool]:
    """The open-loop cross-check: (markdown lines, no figure differs). With `rlt_aa_dir` (rltbench's
    client run again after guidellm, same load) the A/A leg decides which differences are noise."""
    if not Path(peer_path).is_file():
        raise UsageError(f"--peer: {peer_path} is not a file (guidellm's JSON report)")
    ours, cfg = run_rate_records(rlt_dir)
    ours_aa = None
    if rlt_aa_dir is not None:
        ours_aa, cfg_aa = run_rate_records(rlt_aa_dir)
        _same_load(cfg, cfg_aa)
    rs = cfg.get("rate") or {}
    head, tail = float(rs.get("exclude_head", 0.1)), float(rs.get("exclude_tail", 0.1))
    rows = cross_check(ours, read_report(peer_path), head, tail, ours_aa)
    servers = ", ".join(f"{k}={v}" for k, v in (cfg.get("arm_specs") or {}).items())
    rates = rs.get("rates")
    rates = ", ".join(f"{r:g}" for r in rates) if isinstance(rates, list) else rates
    aa_note = ([] if ours_aa is None else
               ["A/A leg: rltbench's client ran the load twice, before and after guidellm (A, guidellm, "
                "A'); rltbench's column is the mean of A and A', diff = guidellm / mean - 1, "
                "A/A = A' / A - 1.", ""])
    lines = [f"## Open-loop rates: rltbench's client against guidellm, one server ({servers})", "",
             f"Load: {rs.get('arrivals', '?')} arrivals at {rates} requests/s, "
             f"{rs.get('num_prompts')} requests per rate, {(cfg.get('lengths') or {}).get('label', '?')}, "
             f"model {cfg.get('model', '?')}; the first {head:.0%} and last {tail:.0%} of each rate's "
             "requests by arrival left out of rltbench's definitions.", "", *aa_note, *check_lines(rows)]
    return lines, verdict_tally(rows)[DIFFERS] == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m rltbench.server.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wait", help="wait until URL/health answers 200")
    w.add_argument("url")
    w.add_argument("--timeout", type=float, default=600.0)
    k = sub.add_parser("check", help="exit 0 iff every KV block is free and no request is live")
    k.add_argument("url")
    g = sub.add_parser("scrape", help="write URL/metrics as JSON")
    g.add_argument("url")
    g.add_argument("file", type=Path)
    s = sub.add_parser("soak", help="consecutive bursts, KV blocks checked after each")
    s.add_argument("url")
    s.add_argument("--model", default="ouro-1.4b")
    s.add_argument("--bursts", type=int, default=10)
    s.add_argument("--concurrency", type=int, default=128)
    s.add_argument("--input-len", type=int, default=512)
    s.add_argument("--output-len", type=int, default=128)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare", help="HTTP vs in-process and peer vs rltbench tables")
    c.add_argument("--http", type=Path, required=True, help="rltbench e2e run dir (backend openai)")
    c.add_argument("--inproc", type=Path, help="rltbench e2e run dir (backend engine), same load")
    c.add_argument("--peer", type=Path, help="guidellm JSON report, same load")
    c.add_argument("--scrapes", type=Path, help="DIR of metrics_{http,peer}_{before,after}.json")
    c.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("rate-compare", help="open-loop cross-check: rltbench e2e rate run vs guidellm rates")
    r.add_argument("--rlt", type=Path, required=True, help="rltbench e2e --workload rate run dir")
    r.add_argument("--peer", type=Path, required=True, help="guidellm JSON report, constant or poisson rates")
    r.add_argument("--rlt-aa", type=Path, help="the same e2e rate run again, after guidellm (the A/A leg)")
    r.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "wait":
        wait_ready(args.url.rstrip("/"), args.timeout)
        return 0
    if args.cmd == "check":
        state = pool_state(scrape(args.url.rstrip("/")))
        print(json.dumps(state))
        return 0 if state["blocks_returned"] else 1
    if args.cmd == "scrape":
        args.file.write_text(json.dumps(scrape(args.url.rstrip("/")), indent=1))
        return 0
    if args.cmd == "soak":
        return soak(
            args.url.rstrip("/"),
            args.model,
            args.bursts,
            args.concurrency,
            args.input_len,
            args.output_len,
            args.seed,
            args.out,
        )
    if args.cmd == "rate-compare":
        try:
            lines, _none_differ = rate_check(args.rlt, args.peer, args.rlt_aa)
        except UsageError as exc:
            print(exc, file=sys.stderr)
            return exc.exit_code
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return 0
    lines = [device_note(args.inproc or args.http), ""]
    if args.inproc is not None:
        lines += overhead_table(args.http, args.inproc) + [""]
    if args.peer is not None:
        lines += peer_table(args.http, args.peer) + [""]
    if args.scrapes is not None:
        lines += server_view(args.scrapes) + [""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
