"""Weight-bytes counting, the no-GPU error, a tiny CPU profile end to end, and re-rendering."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from rltbench.commands.profile import floors

FIX = Path(__file__).parent / "fixtures"


class Looped(torch.nn.Module):
    """A 2-layer block applied 3 times + an untied head: weights read = 3 x block + head + 1 row."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8, bias=False) for _ in range(2))
        self.head = torch.nn.Linear(8, 50, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        for _ in range(3):
            for b in self.blocks:
                h = torch.nn.functional.silu(b(h))
        return self.head(h)


def test_weight_bytes_count_loop_reuse() -> None:
    m = Looped()
    res = floors.count_weight_bytes(m, lambda: m(torch.tensor([3])))
    expected = 3 * 2 * 8 * 8 * 4 + 50 * 8 * 4 + 1 * 8 * 4
    assert res["bytes"] == expected
    assert res["param_bytes"] == (2 * 64 + 400 + 400) * 4
    assert floors.weight_floor_ms(2e9, 2000.0) == pytest.approx(1.0)
    assert floors.weight_floor_ms(1.0, float("nan")) != floors.weight_floor_ms(1.0, float("nan"))


def test_kv_bytes_floor_counts_every_plane_row_and_token() -> None:
    from rltbench.models.configs import get_config

    cfg = get_config("ouro-1.4b")
    kv = floors.kv_bytes_per_step(cfg, torch.bfloat16, batch=128, context=512)
    per_plane_token = 2 * cfg.num_kv_heads * cfg.head_dim * 2  # K and V, bf16
    assert kv["planes"] == cfg.num_kv_planes == 96
    assert kv["bytes"] == 128 * 512 * 96 * per_plane_token
    assert floors.floor_ms(kv["bytes"], 2000.0) == pytest.approx(kv["bytes"] / 2e12 * 1e3)
    assert floors.share_of_floor(1.0, 2000.0) == pytest.approx(0.5)  # 1 ms floor, 2 ms of kernels
    assert floors.share_of_floor(1.0, 0.0) != floors.share_of_floor(1.0, 0.0)  # nan: class absent


def _app() -> typer.Typer:
    """The CLI's app when it imports, else a wrapper with the same UsageError -> exit 2 rule."""
    try:
        from rltbench.cli import app

        return app
    except Exception:  # noqa: BLE001
        from rltbench.cli import _user_errors_exit_2  # pragma: no cover
        from rltbench.commands.profile.cli import profile_command

        app = typer.Typer()
        app.command("profile")(_user_errors_exit_2(profile_command))
        return app


def test_no_gpu_is_a_usage_error(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    args = ["profile", "--model", "ouro-tiny", "--device", "cuda", "--result-dir", str(tmp_path / "r")]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 2
    assert "--device cpu" in res.output and "Traceback" not in res.output


def test_cpu_profile_end_to_end_and_render(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = CliRunner().invoke(
        _app(),
        [
            "profile",
            "--cpu",
            "--model",
            "ouro-tiny",
            "--context",
            "16",
            "--iters",
            "2",
            "--steps",
            "2",
            "--arms",
            "torch,exact",
            "--result-dir",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())
    assert s["mode"] == "cpu" and set(s["arms"]) == {"torch", "exact"}
    t = s["arms"]["torch"]
    assert t["cpu_ops_per_step"] > 0 and len(t["wall_us"]) == 2
    by = {r["class"]: r["count"] for r in t["classes"]}
    assert by["gemm"] > 0 and by["norm"] > 0
    assert s["weight_bytes"]["bytes"] > s["weight_bytes"]["param_bytes"]  # looped: weights re-read
    table = (out / "table.md").read_text()
    assert "CPU mode" in table and (out / "breakdown.png").stat().st_size > 0
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    (out / "table.md").unlink()
    res = CliRunner().invoke(_app(), ["report", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "table.md").read_text() == table


def test_render_gpu_summary_from_fixture(tmp_path: Path) -> None:
    from rltbench.commands.profile.collect import summarize_trace
    from rltbench.commands.profile.graph_nodes import GraphCensus
    from rltbench.commands.profile.report import render
    from rltbench.results import RunDir

    trace = json.loads((FIX / "decode_trace.json").read_text())
    n = len(json.loads((FIX / "step_kernels.json").read_text())["step"])
    arms = {}
    for i, arm in enumerate(["torch", "exact"]):
        res, _ = summarize_trace(trace, GraphCensus(n, 0, 1), "fake", steps=2)
        res["replay_stats_us"] = {"median": 1000.0 * (2 - i), "p10": 900.0, "p90": 1100.0 * (2 - i)}
        arms[arm] = res
    run = RunDir.create("profile", result_dir=tmp_path / "g", argv=[], config={})
    run.write_json(
        "summary.json",
        {
            "mode": "gpu",
            "model": "fake",
            "batch": 1,
            "context": 512,
            "arms": arms,
            "weight_bytes": {"bytes": 3e9, "param_bytes": 1e9, "reuse": 3.0},
            "copy_bandwidth": {"gbps": 3000.0},
            "weight_floor_ms": 1.0,
            "kv_bytes": {"bytes": 6e8, "batch": 1, "context": 512, "planes": 96, "bytes_per_token": 393216},
            "kv_floor_ms": 0.2,
            "device_name": "fake",
        },
    )
    for a in arms.values():
        a["floor_shares"] = {"gemm": 0.5, "attention": 0.25}
    run.write_json("summary.json", {**json.loads((run.path / "summary.json").read_text()), "arms": arms})
    render(run.path)
    table = (run.path / "table.md").read_text()
    assert f"| torch | {n + 2} |" in table and "2.00x" in table and "GEMM floor" in table
    assert "KV-bytes floor" in table and "**0.200 ms/step**" in table
    assert "= 25.0% of floor" in table and "= 50.0% of floor" in table
    assert (run.path / "breakdown.png").is_file()
