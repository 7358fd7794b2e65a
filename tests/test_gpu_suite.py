"""scripts/gpu_suite.py without a GPU: every stage directory ends with a manifest in a final status,
written for commands that write none (tests, memcheck) and finalised where a command left "running"."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from rltbench.results import RunDir

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_suite.py"


@pytest.fixture(scope="module")
def suite() -> dict:
    return runpy.run_path(str(SCRIPT))


def test_status_from_exit(suite) -> None:
    assert [suite["final_status"](rc) for rc in (0, 1, 2, "timeout")] == [
        "complete", "failed", "failed", "interrupted"]


def test_manifest_written_for_a_command_that_writes_none(suite, tmp_path: Path) -> None:
    d = tmp_path / "tests"
    d.mkdir()
    (d / "junit.xml").write_text("<testsuite/>")
    (d / "stage.log").write_text("1 passed")
    suite["finalize_manifest"](d, "tests", 420, ["python", "-m", "pytest", "tests"], 0)
    m = json.loads((d / "manifest.json").read_text())
    assert (m["command"], m["status"], m["exit_code"]) == ("tests", "complete", 0)
    assert m["files"] == ["junit.xml", "stage.log"] and m["config"] == {"stage": "tests", "time_limit_s": 420}
    assert m["provenance"]["command_line"] == "python -m pytest tests" and "git_sha" in m["provenance"]


def test_running_manifest_finalised_from_the_exit(suite, tmp_path: Path) -> None:
    killed = RunDir.create("tune", tmp_path / "tune", argv=["kernel_tune.py"])
    suite["finalize_manifest"](killed.path, "tune", 400, ["kernel_tune.py"], "timeout")
    m = json.loads((killed.path / "manifest.json").read_text())
    assert m["status"] == "interrupted" and m["status_corrected"]["was"] == "running"
    done = RunDir.create("kernels", tmp_path / "kernels", argv=["rltbench", "kernels"])
    done.update_manifest(status="complete")
    before = (done.path / "manifest.json").read_bytes()
    suite["finalize_manifest"](done.path, "kernels", 300, ["rltbench", "kernels"], 1)
    assert (done.path / "manifest.json").read_bytes() == before  # a final status is the command's own


def test_stage_files_and_suite_entry_name_no_machine_paths(suite, tmp_path: Path) -> None:
    """What a stage writes (its log here) and its suite.json entry lose the checkout's and the
    Python environment's paths (rltbench/results/portable.py) before they can be committed."""
    root = suite["ROOT"]
    cmd = [sys.executable, "-c", f"print({str(root / 'results' / 'gpu' / 'x')!r})"]
    entry = suite["run_stage"]("demo", 60, cmd, tmp_path)
    log = (tmp_path / "demo" / "stage.log").read_text()
    manifest = (tmp_path / "demo" / "manifest.json").read_text()
    assert log.strip() == "results/gpu/x" and str(root) not in manifest
    assert entry["rc"] == 0 and entry["command"][0].startswith(("<env>", "/usr"))


def test_serve_rate_stage_runs_the_cross_check_alone_within_its_limit(suite) -> None:
    """The open-loop cross-check against guidellm is its own stage (one 10-minute call): the serve
    script with only its rate step, the rates and request count named on the command line."""
    limit, cmd = suite["STAGES"]["serve-rate"]
    assert limit <= 480 and cmd[-2].endswith("scripts/serve_bench.sh") and cmd[-1].endswith("serve-rate")
    assert {"STEPS=rate", "RATES=2,4,8", "RATE_REQUESTS=80", "RATE_ARRIVALS=constant"} <= set(cmd)


def test_a_base_stage_runs_the_baseline_tree(suite, tmp_path: Path, monkeypatch) -> None:
    """`STAGE@base`: the stage's command from the unpacked baseline archive, its result directory
    renamed STAGE-base, the archive's commit (git get-tar-commit-id) in the provenance."""
    import subprocess

    root = SCRIPT.parent.parent
    git = ["git", "-C", str(root)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    archive = tmp_path / "base.tgz"
    subprocess.run([*git, "archive", "--format=tar.gz", "-o", str(archive), head, "pyproject.toml"],
                   check=True)
    run = suite["stage_run"]
    monkeypatch.setitem(run.__globals__, "BASE_ARCHIVE", archive)
    monkeypatch.setitem(run.__globals__, "BASE_ROOT", tmp_path / "tree")
    out, limit, cmd, cwd, env = run("profile@base")
    assert out == "profile-base" and cwd == tmp_path / "tree" and (cwd / "pyproject.toml").is_file()
    assert cmd[-2:] == ["--result-dir", str(suite["RESULTS"] / "profile-base")]
    assert env == {"RLTBENCH_GIT_SHA": head} and limit == suite["STAGES"]["profile"][0]
    assert run("profile")[0] == "profile" and run("profile")[3] == root
