"""Ctrl-C (or SIGTERM) before a command's first result: one line, and nothing left behind (or a
directory that `rltbench report` reads and says nothing finished). The interrupt is simulated where
each command starts its first unit of work, after its run directory exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rltbench.cli import main
from rltbench.results import RunDir

NOTHING_KEPT = "interrupted before any result was written"


def _ctrl_c(*_args: Any, **_kwargs: Any) -> Any:
    raise KeyboardInterrupt


class _StartedRank:
    """A rank that started and ended at once (the ranks are processes; none is needed here)."""

    def __init__(self, rank: int, spec: dict[str, Any], env: dict[str, str]) -> None:
        self.role = ("prefill", "decode")[rank]
        self.tail: list[str] = []
        self.proc = type("Proc", (), {"returncode": 130, "poll": lambda self: 130})()

    def stop(self) -> None:
        return None


WARMUP = "rltbench.backends.engine.EngineBackend.warmup"
# command line (small sizes) and what to replace, (target, stand-in): the first unit of work raising
COMMANDS = {
    "kernels": (["kernels", "--ops", "rmsnorm", "--widths", "8", "--dtypes", "fp32", "--tokens", "1",
                 "--arms", "torch", "--repeats", "1"],
                [("rltbench.bench.kernel_sweep.case_rows", _ctrl_c)]),
    "e2e": (["e2e", "--model", "ouro-tiny", "--arms", "torch", "--input-len", "4", "--output-len", "1",
             "--concurrency", "1", "--repeats", "1", "--device", "cpu"], [(WARMUP, _ctrl_c)]),
    "prefill": (["prefill", "--models", "huginn-tiny", "--input-lens", "12", "--concurrency", "2",
                 "--output-len", "2", "--repeats", "1", "--device", "cpu"], [(WARMUP, _ctrl_c)]),
    "profile": (["profile", "--model", "ouro-tiny", "--device", "cpu", "--context", "4", "--iters", "1",
                 "--steps", "1", "--arms", "torch"],
                [("rltbench.commands.profile.collect.profile_arm_cpu", _ctrl_c)]),
    "gsm8k": (["gsm8k", "--model", "ouro-tiny", "--arms", "torch", "--limit", "1", "--num-fewshot", "0",
               "--max-gen-toks", "1", "--device", "cpu"],
              [("rltbench.commands.gsm8k.evaluate.run_arm", _ctrl_c)]),
    "pd": (["pd", "--model", "ouro-tiny", "--devices", "cpu,cpu", "--input-len", "9", "--output-len", "4",
            "--repeats", "1"],
           [("rltbench.commands.pd.launch._Rank", _StartedRank),
            ("rltbench.commands.pd.launch.supervise", _ctrl_c)]),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_ctrl_c_before_the_first_result_is_one_line_and_leaves_nothing(command: str, tmp_path: Path,
                                                                        monkeypatch, capsys) -> None:
    argv, stand_ins = COMMANDS[command]
    for target, stand_in in stand_ins:
        monkeypatch.setattr(target, stand_in)
    run = tmp_path / "run"
    assert main([*argv, "--result-dir", str(run)]) == 130
    out, err = capsys.readouterr()
    assert "interrupt" not in out.lower() and "Traceback" not in out + err
    # the lines before it are the command's own progress (notes, "results: DIR"); the interrupt adds one
    said = [ln for ln in (out + err).splitlines() if "interrupt" in ln.lower()]
    assert said == [NOTHING_KEPT] and err.rstrip().endswith(NOTHING_KEPT)
    assert not run.exists()


def test_ctrl_c_with_results_kept_is_one_line_naming_the_run(tmp_path: Path, monkeypatch, capsys) -> None:
    """capacity stores its predicted rows first: a Ctrl-C before the first measured burst keeps them."""
    monkeypatch.setattr(WARMUP, _ctrl_c)
    run = tmp_path / "run"
    argv = ["capacity", "--models", "ouro-tiny", "--input-len", "16", "--output-len", "4", "--burst",
            "--memory-gib", "0.0005", "--device", "cpu", "--result-dir", str(run)]
    assert main(argv) == 130
    out, err = capsys.readouterr()
    said = [ln for ln in (out + err).splitlines() if "interrupt" in ln.lower()]
    assert said == [f"interrupted: finished results were kept in {run}"] and "interrupt" not in out
    assert RunDir.open(run).manifest["status"] == "interrupted"
    assert main(["report", str(run)]) == 0


def test_report_of_a_run_that_stored_nothing_says_nothing_finished(tmp_path: Path, capsys) -> None:
    """A run killed before its first result (SIGKILL, an older release) holds only its manifest:
    `report` said "no summary.json" and exited 2."""
    for command in ("kernels", "e2e", "prefill", "profile", "gsm8k", "pd", "capacity"):
        run = RunDir.create(command, tmp_path / command)
        run.update_manifest(status="interrupted")
        capsys.readouterr()
        assert main(["report", str(run.path)]) == 0, command
        out, err = capsys.readouterr()
        assert f"nothing finished: {run.path} (interrupted) holds no result" in err and not out, command
