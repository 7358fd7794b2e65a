"""Every command's defaults run on both tiny presets on the CPU: `capacity --models ouro-tiny` and
`prefill --models ouro-tiny` stopped on their own defaults (512 + 128 and 2048 + 4 tokens exceed the
512-token context) while e2e, pd and profile shrank to fit. A default that does not fit now shrinks
and says so on the console and in the manifest; a length the user gave must fit, and the error names
the flag and a value that works.

The full runs take from seconds (capacity) to minutes (e2e) on two cores: all but capacity's are
marked slow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rltbench.cli import main
from rltbench.errors import UsageError

TINY = ("ouro-tiny", "huginn-tiny")


def _slow(*commands: str) -> list:
    return [pytest.param(c, m, marks=pytest.mark.slow) for c in commands for m in TINY]


@pytest.mark.parametrize("command, model", [
    *[("capacity", m) for m in TINY],
    *_slow("prefill", "profile", "pd", "e2e"),
])
def test_defaults_run_on_a_tiny_preset(command: str, model: str, tmp_path: Path, capsys) -> None:
    flag = "--models" if command in ("capacity", "prefill") else "--model"
    run = tmp_path / "run"
    assert main([command, flag, model, "--result-dir", str(run)]) == 0
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    if command in ("capacity", "prefill"):  # the shortened default, said on the console and kept
        note = manifest["config"]["notes"][0]
        assert "do not fit" in note and f"note: {note}" in capsys.readouterr().out


def test_capacity_lengths_fit_the_shortest_context_and_a_given_one_must_fit() -> None:
    from rltbench.commands.capacity.plan import request_lengths

    assert request_lengths(["ouro-1.4b"], None, None) == (512, 128, None)
    inp, out, note = request_lengths(["ouro-1.4b", "ouro-tiny"], None, None)
    assert (inp, out) == (384, 128) and "ouro-tiny's context of 512" in note and "every model" in note
    assert request_lengths(["ouro-tiny"], 100, 20) == (100, 20, None)
    with pytest.raises(UsageError, match="use --input-len 384 or less"):
        request_lengths(["ouro-tiny"], 500, None)


def test_prefill_lengths_shorten_to_each_context_and_a_given_one_must_fit() -> None:
    from rltbench.commands.prefill.plan import prompt_lengths

    assert prompt_lengths(None, ["ouro-1.4b"], 4) == ({"ouro-1.4b": [2048]}, None)
    lengths, note = prompt_lengths(None, ["ouro-1.4b", "huginn-tiny"], 4)
    assert lengths == {"ouro-1.4b": [2048], "huginn-tiny": [508]}
    assert note and "508 for huginn-tiny (context 512)" in note and "ouro-1.4b" not in note
    assert prompt_lengths("12,max,12", ["ouro-tiny"], 4) == ({"ouro-tiny": [12, 508]}, None)
    with pytest.raises(UsageError, match="use --input-lens 508 or less"):
        prompt_lengths("600", ["ouro-tiny"], 4)
    with pytest.raises(UsageError, match="an empty item"):
        prompt_lengths("12,,max", ["ouro-tiny"], 4)


@pytest.mark.parametrize("argv, fix", [
    (["capacity", "--models", "ouro-tiny", "--input-len", "500"], "use --input-len 384 or less"),
    (["capacity", "--models", "ouro-tiny", "--output-len", "600"], "use --output-len 128 or less"),
    (["prefill", "--models", "ouro-tiny", "--input-lens", "2048"], "use --input-lens 508 or less"),
])
def test_a_given_length_that_does_not_fit_is_one_line_with_the_fix(argv, fix, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert main([*argv, "--device", "cpu", "--result-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fix in err
    assert not run.exists()
