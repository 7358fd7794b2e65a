"""Bad input to a command is one line naming what is wrong and exit code 2, before any run directory
exists (the project's rule): the checks each command makes itself, through the console entry point.
tests/test_option_walk.py covers every declared numeric bound the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from rltbench.cli import main

# the valid start of each command line; a case's arguments follow it
BASE = {
    "kernels": ["kernels"],
    "carryover": ["kernels", "--diagnose", "carryover"],
    "profile": ["profile", "--device", "cpu"],
    "pd": ["pd", "--model", "ouro-tiny", "--devices", "cpu,cpu"],
}

CASES = [
    ("kernels", ["--ops", "rmsnorm,bogus"], "bogus"),
    ("kernels", ["--arms", "torch,fast"], "fast"),
    ("kernels", ["--dtypes", "bf16,int8"], "int8"),
    ("kernels", ["--mode", "warp"], "warp"),
    ("kernels", ["--scope", "sometimes"], "sometimes"),
    ("kernels", ["--tokens", "0"], "--tokens: 0 must be >= 1"),
    ("kernels", ["--tokens", "-4"], "--tokens: -4 must be >= 1"),
    ("kernels", ["--tokens", "1.5"], "1.5"),
    ("kernels", ["--tokens", "abc"], "abc"),
    ("kernels", ["--tokens", ","], "--tokens"),
    ("kernels", ["--widths", "x"], "x"),
    ("kernels", ["--repeats", "0"], "--repeats"),
    ("kernels", ["--ops", "rope_neox", "--widths", "100"], "100"),
    ("kernels", ["--diagnose", "nope"], "--diagnose: unknown value 'nope'"),
    ("carryover", ["--ops", "nope"], "unknown op 'nope'"),
    ("carryover", ["--dtypes", "int8"], "--dtypes 'int8'"),
    ("carryover", ["--positions", "2"], "--positions"),
    ("carryover", ["--trials", "1"], "--trials"),
    ("carryover", ["--tokens", "0"], "--tokens and --widths must be positive"),
    ("carryover", ["--tokens", "1,8"], "--tokens: --diagnose takes one value"),
    ("profile", ["--arms", "torch,fast"], "unknown arm"),
    ("profile", ["--batch", "0"], "--batch"),
    ("profile", ["--dtype", "int8"], "dtype"),
    ("profile", ["--model", "nope"], "nope"),
    ("profile", ["--weights", "/nonexistent/ckpt"], "not a checkpoint directory"),
    ("profile", ["--cpu", "--device", "cuda:1"], "--cpu is --device cpu"),
    ("pd", ["--backend", "nccl"], "needs two different GPUs"),
    ("pd", ["--devices", "cuda:0,cuda:1"], "does not exist here"),
    ("pd", ["--devices", "cpu"], "give two devices"),
    ("pd", ["--kv-layout", "compress"], "Huginn option"),
    ("pd", ["--arm", "torch,exact"], "one kernel arm"),
    ("pd", ["--input-len", "600"], "context of 512: use --input-len 384 or less"),
]


@pytest.mark.parametrize("command, args, needle", CASES)
def test_bad_input_is_one_line_and_exit_2_before_any_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str,
    args: list[str], needle: str,
) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # the one error line must not wrap
    out = tmp_path / "never"
    rc = main([*BASE[command], *args, "--result-dir", str(out)])
    captured = capsys.readouterr()
    lines = [ln for ln in (captured.out + captured.err).splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and needle in lines[0], lines
    assert "Traceback" not in captured.err
    assert not out.exists()
