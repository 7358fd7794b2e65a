"""The results layer: manifests with provenance, atomic writes, appends that survive interruption."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest

from rltbench.errors import UsageError
from rltbench.results import RunDir
from rltbench.results.rundir import default_run_path, read_jsonl


def test_create_writes_manifest_with_provenance(tmp_path: Path) -> None:
    RunDir.create("kernels", tmp_path / "run", argv=["rltbench", "kernels", "--tokens", "1"],
                        config={"arms": ["torch", "exact"], "selection": {"norm": "exact"}})
    mf = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert mf["command"] == "kernels"
    assert mf["status"] == "running"
    assert mf["config"]["arms"] == ["torch", "exact"]
    prov = mf["provenance"]
    assert prov["command_line"] == "rltbench kernels --tokens 1"
    for key in ("gpu", "driver", "cuda", "git_sha", "host", "date_utc", "versions"):
        assert key in prov
    assert prov["versions"]["torch"]
    assert prov["versions"]["python"]


def test_versions_fall_back_to_the_distribution_metadata() -> None:
    """A module without `__version__` (Liger-Kernel) is recorded by its distribution's version, the
    import name normalised as pip does (`liger_kernel` finds `liger-kernel`)."""
    from rltbench.results.provenance import distribution_version

    assert distribution_version("pytest") == pytest.__version__
    assert distribution_version("no_such_package_rltbench") == "unknown"


def test_round_trip_tables_json_jsonl(tmp_path: Path) -> None:
    run = RunDir.create("e2e", tmp_path / "r")
    df = pd.DataFrame({"arm": ["torch", "exact"], "ms": [1.5, float("nan")]})
    run.write_table("cases", df)
    back = RunDir.open(tmp_path / "r").read_table("cases")
    assert list(back["arm"]) == ["torch", "exact"]
    assert back["ms"][0] == 1.5 and (back["ms"][1] is None or math.isnan(back["ms"][1]))
    run.append_jsonl("requests.jsonl", {"id": 1})
    run.append_jsonl("requests.jsonl", {"id": 2})
    with open(run.file("requests.jsonl"), "a") as fh:  # a torn last line from a hard kill
        fh.write('{"id": 3, "tok')
    assert [r["id"] for r in run.read_jsonl("requests.jsonl")] == [1, 2]
    run.update_manifest(status="complete")
    mf = RunDir.open(tmp_path / "r").manifest
    assert mf["status"] == "complete"
    assert {"cases.csv", "cases.json", "requests.jsonl"} <= set(mf["files"])


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    run = RunDir.create("x", tmp_path / "r")
    run.write_json("a.json", {"v": [1, 2, 3]})
    run.write_markdown("table.md", "| a |\n|---|")
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["a.json", "manifest.json", "table.md"]


def test_text_and_adopted_gzipped_files_are_listed(tmp_path: Path) -> None:
    """A tool's CSV (write_text), a file another program wrote (adopt) and a raw report replaced by
    its .gz (adopt, gzipped) all end up in the manifest's files."""
    import gzip

    run = RunDir.create("ncu-norm", tmp_path / "r")
    run.write_text("metrics.csv", "a,b\n1,2\n")
    (run.path / "report.bin").write_bytes(b"\x00raw" * 100)
    (run.path / "plan.json").write_text("[]")
    run.adopt("plan.json")
    run.adopt("report.bin", gzipped=True)
    assert not (run.path / "report.bin").exists()
    assert gzip.decompress((run.path / "report.bin.gz").read_bytes()) == b"\x00raw" * 100
    files = json.loads((run.path / "manifest.json").read_text())["files"]
    assert files == ["metrics.csv", "plan.json", "report.bin.gz"]


def test_plot_saved_as_png(tmp_path: Path) -> None:
    from rltbench.results.plotting import figure

    run = RunDir.create("x", tmp_path / "r")
    fig, ax = figure()
    ax.plot([1, 2], [3, 4])
    path = run.save_plot("p.png", fig)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unwritable_result_dir_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    with pytest.raises(UsageError, match="cannot write results"):
        RunDir.create("kernels", blocker / "sub")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write read-only directories")
def test_read_only_dir_is_a_usage_error(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    with pytest.raises(UsageError):
        RunDir.create("kernels", ro / "x")


def test_open_rejects_non_run_dirs(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not an rltbench run directory"):
        RunDir.open(tmp_path)


def test_default_paths_are_unique(tmp_path: Path) -> None:
    a = default_run_path("kernels", tmp_path)
    a.mkdir()
    b = default_run_path("kernels", tmp_path)
    assert a != b and b.name.startswith("kernels-")


def test_the_suite_writes_no_run_into_the_checkout() -> None:
    """A command a test runs without --result-dir writes under a temporary directory (conftest.py),
    not results/ of the checkout, where a later run or test would find it."""
    checkout = Path(__file__).resolve().parent.parent
    assert checkout not in default_run_path("kernels").resolve().parents


def test_result_dir_holding_a_run_is_refused(tmp_path: Path) -> None:
    """A second run in the same --result-dir used to append to the first run's rows under a new manifest."""
    run = RunDir.create("kernels", tmp_path / "r")
    run.append_jsonl("rows.jsonl", {"id": 1})
    with pytest.raises(UsageError, match="already holds an rltbench run"):
        RunDir.create("kernels", tmp_path / "r")
    assert run.read_jsonl("rows.jsonl") == [{"id": 1}]
    stage = tmp_path / "stage"  # a directory with other files (e.g. a suite's stage.log) is fine
    stage.mkdir()
    (stage / "stage.log").write_text("log")
    RunDir.create("kernels", stage)


def test_atomic_files_get_the_umask_mode_not_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        run = RunDir.create("x", tmp_path / "r")
        run.write_json("a.json", {"v": 1})
        run.write_markdown("table.md", "x")
    finally:
        os.umask(old)
    for name in ("manifest.json", "a.json", "table.md"):
        assert (tmp_path / "r" / name).stat().st_mode & 0o777 == 0o644, name


def test_corrupt_raw_file_is_a_usage_error(tmp_path: Path) -> None:
    run = RunDir.create("x", tmp_path / "r")
    run.file("summary.json").write_text("{torn")
    with pytest.raises(UsageError, match="summary.json"):
        run.read_json("summary.json")
    with pytest.raises(UsageError, match="missing"):
        run.read_json("nope.json")


def test_extend_jsonl_writes_a_unit(tmp_path: Path) -> None:
    run = RunDir.create("x", tmp_path / "r")
    run.extend_jsonl("rows.jsonl", [])
    assert not run.file("rows.jsonl").exists()
    run.extend_jsonl("rows.jsonl", [{"a": 1}, {"a": 2}])
    run.extend_jsonl("rows.jsonl", [{"a": 3}])
    assert [r["a"] for r in run.read_jsonl("rows.jsonl")] == [1, 2, 3]
    assert "rows.jsonl" in RunDir.open(tmp_path / "r").manifest["files"]


def test_report_never_rewrites_a_stored_manifest(tmp_path: Path) -> None:
    """`rltbench report DIR` re-renders from the raw files; manifest.json (the run's provenance)
    stays byte for byte, even when the renderer writes a file the manifest does not list."""
    from rltbench.cli import main

    run = RunDir.create("kernels", tmp_path / "r", argv=["rltbench", "kernels"])
    run.write_json("summary.json", {"device": "cpu", "notes": []})
    run.update_manifest(status="complete")
    before = (tmp_path / "r" / "manifest.json").read_bytes()
    assert "table.md" not in json.loads(before)["files"]
    assert main(["report", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "table.md").is_file()
    assert (tmp_path / "r" / "manifest.json").read_bytes() == before
    opened = RunDir.open(tmp_path / "r")
    opened.write_markdown("extra.md", "x")  # files may be written; the manifest is not
    assert (tmp_path / "r" / "manifest.json").read_bytes() == before
    with pytest.raises(RuntimeError, match="not rewritten"):
        opened.update_manifest(status="running")
    assert (tmp_path / "r" / "manifest.json").read_bytes() == before


def test_read_jsonl_reads_a_packed_raw_file(tmp_path: Path) -> None:
    """A stored run may keep a bulky raw file gzip-compressed (python -m rltbench.results.compact): every
    reader gets the same records from `name.gz` as from `name`, and [] when neither exists."""
    rows = [{"a": 1}, {"b": [2, 3]}]
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_jsonl(tmp_path / "requests.jsonl") == rows
    from rltbench.results.compact import compact

    assert compact(tmp_path, 0) and not (tmp_path / "requests.jsonl").exists()
    assert read_jsonl(tmp_path / "requests.jsonl") == rows
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_read_json_reads_a_packed_table(tmp_path: Path) -> None:
    """compact packs a table's JSON records (beside its CSV), not other JSON files; RunDir.read_json
    and read_table read the packed records as they read the plain ones."""
    from rltbench.results.compact import compact

    run = RunDir.create("kernels", tmp_path / "r")
    df = pd.DataFrame([{"op": "silu_mul", "us": 1.5}, {"op": "rmsnorm", "us": 2.0}])
    run.write_table("cases", df)
    run.write_json("summary.json", {"status": "complete"})
    packed = {p.name for p, _, _ in compact(run.path, 0)}
    assert packed == {"cases.json"} and (run.path / "summary.json").is_file()
    assert run.read_table("cases").equals(df) and run.read_json("summary.json") == {"status": "complete"}
