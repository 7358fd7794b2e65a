"""`rltbench kernels` on a CUDA GPU: timings present and sane, kernels counted, graph outputs exact.

Run with `pytest --run-gpu tests/kernels/test_bench_gpu.py` (about 30 s on an H100/H200, most of it
Triton compilation).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import typer
from typer.testing import CliRunner


def _app() -> typer.Typer:
    from rltbench.commands.kernels.cli import kernels_command

    app = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
    app.command("kernels")(kernels_command)
    app.command("noop")(lambda: None)
    return app


@pytest.mark.gpu
def test_kernels_command_on_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    out = tmp_path / "gpu"
    args = ["kernels", "--ops", "rmsnorm,rope_neox,silu_mul", "--tokens", "1,128", "--dtypes", "bf16",
            "--arms", "torch,exact,approx",
            "--widths", "2048", "--repeats", "20", "--mode", "both", "--no-peer", "--result-dir", str(out)]
    res = CliRunner().invoke(_app(), args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines() if x.strip()]
    assert len(rows) == 3 * 2 * 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["copy"]["gbps"] > 500  # an H100/H200 copies at ~3 TB/s
    for r in rows:
        assert r["status"] == "ok", r
        for mode in ("graph", "eager"):
            assert r[f"{mode}_us_median"] > 0 and math.isfinite(r[f"{mode}_us_median"])
            assert r[f"{mode}_us_p10"] <= r[f"{mode}_us_median"] <= r[f"{mode}_us_p90"]
        assert r["graph_mismatches"] == 0 if r["arm"] in ("torch", "exact") else True
        kpc = r["graph_kernels_per_call"]
        assert kpc is not None and kpc >= 1
        if r["arm"] == "exact":
            limit = {"rmsnorm": 3, "rope_neox": 1, "silu_mul": 1}[r["op"]]
            assert kpc <= limit, r
        if r["arm"] == "approx":
            assert kpc == 1, r
        if r["arm"] == "torch":
            assert r["graph_speedup"] == pytest.approx(1.0)
            assert r["eager_kernels_per_call"] == kpc  # torch launches the same kernels either way
    assert (out / "latency_graph_bf16.png").exists() and (out / "speedup_graph_bf16.png").exists()


@pytest.mark.gpu
def test_approx_norm_headline_is_plain_and_pdl_is_labelled_beside_it(tmp_path, monkeypatch):
    """The approx norm with PDL 2 from 1024 rows (what the H200's tuned file asks at width 2048): the
    headline graph figure of the approx norm at T=1024 is the plain launch, the PDL figure sits in
    graph_pdl_* beside it (and in the table's PDL columns); torch and exact get no PDL figure."""
    from rltbench.kernels import pdl

    if not pdl.usable(torch.zeros(1, device="cuda"), False):
        pytest.skip("this GPU/Triton cannot launch with PDL")
    from rltbench import tuned

    out = tmp_path / "pdl"
    args = ["kernels", "--ops", "rmsnorm", "--tokens", "8,1024", "--dtypes", "bf16", "--widths", "2048",
            "--repeats", "20", "--mode", "graph", "--no-peer", "--result-dir", str(out)]
    with tuned.use({"norm_approx": {"pdl": 2, "pdl_min_rows": 1024}}):
        res = CliRunner().invoke(_app(), args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    rows = {(r["arm"], r["tokens"]): r for r in
            (json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines() if x.strip())}
    a = rows[("approx", 1024)]
    assert a["graph_pdl_mode"] == 2 and a["graph_pdl_us_median"] > 0 and a["graph_us_median"] > 0
    assert a["graph_pdl_mismatches"] == a["graph_mismatches"]
    for key in (("approx", 8), ("torch", 1024), ("exact", 1024)):
        assert rows[key].get("graph_pdl_us_median") is None, key
    table = (out / "table.md").read_text()
    assert "PDL % copy" in table
    print(f"approx T=1024: plain {a['graph_us_median']:.2f} us ({a['graph_pct_copy']:.1f}% copy), "
          f"PDL {a['graph_pdl_us_median']:.2f} us ({a['graph_pdl_pct_copy']:.1f}% copy)")
