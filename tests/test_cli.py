"""The console-script entry point: user errors are one line on stderr and exit code 2."""

from __future__ import annotations

import pytest

from rltbench.cli import main


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["gsm8k", "--gate", "abc"], "--gate"),
        (["e2e", "--bogus-flag"], "--bogus-flag"),
        (["kernels", "--tokens", "0"], "--tokens"),
        (["report", "/nonexistent/run"], "not an rltbench run directory"),
        (["profile", "--model", "nope", "--cpu"], "nope"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err


def test_help_exits_0(capsys) -> None:
    assert main(["--help"]) == 0
    assert "kernels" in capsys.readouterr().out


def test_unexpected_errors_are_not_masked(tmp_path, monkeypatch) -> None:
    """A command's own exception reaches the caller as itself, not as an error of the classifier."""
    import rltbench.cli as cli
    from rltbench.results import RunDir

    RunDir.create("kernels", tmp_path / "run").write_text("rows.jsonl", "")  # a run with a result file
    monkeypatch.setitem(cli.RENDERERS, "kernels", ("tests.test_cli", "_boom"))
    with pytest.raises(RuntimeError, match="the real error"):
        main(["report", str(tmp_path / "run")])


def _boom(path) -> None:
    raise RuntimeError("the real error")


def _interrupt(path) -> None:
    raise KeyboardInterrupt


def test_ctrl_c_says_results_were_kept_and_exits_130(tmp_path, monkeypatch, capsys) -> None:
    import rltbench.cli as cli
    from rltbench.results import RunDir

    RunDir.create("kernels", tmp_path / "run").write_text("rows.jsonl", "")
    monkeypatch.setitem(cli.RENDERERS, "kernels", ("tests.test_cli", "_interrupt"))
    assert main(["report", str(tmp_path / "run")]) == 130
    assert "interrupted" in capsys.readouterr().err
