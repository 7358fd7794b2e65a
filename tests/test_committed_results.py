"""Every committed results directory under results/gpu/ carries its provenance: a manifest.json whose
git sha resolves in this repository and whose status is final (complete, interrupted or failed, never
"running": a run that ended without saying how cannot be quoted).

Needs the repository's git history; skipped in a copy of the tree without it (a GPU box)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.git_tracked import ROOT, tracked_dirs

FINAL = ("complete", "interrupted", "failed")


def _resolves(sha: str, repo: Path) -> bool:
    done = subprocess.run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=repo, capture_output=True)
    return done.returncode == 0


def provenance_problems(run_dir: Path, repo: Path = ROOT) -> list[str]:
    """What is wrong with one results directory's provenance (empty: nothing)."""
    mf = run_dir / "manifest.json"
    if not mf.is_file():
        return [f"{run_dir.name}: no manifest.json"]
    try:
        manifest = json.loads(mf.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return [f"{run_dir.name}: unreadable manifest.json ({exc})"]
    problems = []
    status = manifest.get("status")
    if status not in FINAL:
        problems.append(f"{run_dir.name}: status {status!r}, not one of {', '.join(FINAL)}")
    sha = (manifest.get("provenance") or {}).get("git_sha")
    if not isinstance(sha, str) or not sha:
        problems.append(f"{run_dir.name}: no provenance.git_sha")
    elif not _resolves(sha, repo):
        problems.append(f"{run_dir.name}: git sha {sha} does not resolve in this repository")
    return problems


@pytest.fixture(scope="module")
def git_history() -> None:
    done = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], cwd=ROOT, capture_output=True)
    if done.returncode != 0:
        pytest.skip("no git history here (a copy of the tree): shas cannot be resolved")


def test_every_committed_result_dir_has_final_status_and_resolvable_sha(git_history: None) -> None:
    dirs = tracked_dirs("results/gpu")  # a run of the user's own here is not committed
    assert dirs, "no results/gpu directories found"
    problems = [msg for d in dirs for msg in provenance_problems(d)]
    assert not problems, "\n".join(problems)


def test_checker_flags_each_kind_of_problem(git_history: None, tmp_path: Path) -> None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    head = done.stdout.strip()

    def run(name: str, manifest: dict | None) -> Path:
        d = tmp_path / name
        d.mkdir()
        if manifest is not None:
            (d / "manifest.json").write_text(json.dumps(manifest))
        return d

    good = run("good", {"status": "complete", "provenance": {"git_sha": head}})
    assert provenance_problems(good) == []
    assert provenance_problems(run("none", None)) == ["none: no manifest.json"]
    running = provenance_problems(run("running", {"status": "running", "provenance": {"git_sha": head}}))
    assert running == ["running: status 'running', not one of complete, interrupted, failed"]
    bad = provenance_problems(run("bad", {"status": "failed", "provenance": {"git_sha": "7867a65b"}}))
    assert bad == ["bad: git sha 7867a65b does not resolve in this repository"]
    assert provenance_problems(run("nosha", {"status": "interrupted", "provenance": {}})) == [
        "nosha: no provenance.git_sha"]
