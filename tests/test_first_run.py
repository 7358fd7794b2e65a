"""What a newcomer meets first: help at 80 columns, defaults that fit the tiny presets, one line on
Ctrl-C, no run directory for bad input, no speed verdict where timings mean nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rltbench.cli as cli
from rltbench.cli import main
from rltbench.errors import UsageError
from rltbench.results import RunDir

ROOT = Path(__file__).resolve().parents[1]


# -- the command line --------------------------------------------------------------------------
def test_top_level_help_imports_no_command_module() -> None:
    """`rltbench --help` imported torch, the engine and pandas first (seconds); a Ctrl-C in that
    second printed a 40-line traceback from the import."""
    code = ("import sys; from rltbench.cli import main; rc = main(['--help']); "
            "print(rc, sorted(m for m in ('torch', 'pandas', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "0 []", out.stdout + out.stderr


def test_command_summaries_are_the_docstrings_first_paragraph(capsys) -> None:
    assert main(["--help"]) == 0
    listing = " ".join(capsys.readouterr().out.split())
    for name, (module, function) in cli.COMMANDS.items():
        doc = cli._load(module, function).__doc__ or ""
        first = " ".join(doc.strip().split("\n\n")[0].split())
        assert cli.command_summary(module, function) == first, name
        assert f"{name} {first}" in listing


def test_ctrl_c_while_a_command_loads_is_one_line(monkeypatch, capsys) -> None:
    """The command's module (torch) loads after main() started, so Ctrl-C there is caught."""

    def interrupted(module: str, attr: str):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_load", interrupted)
    assert main(["kernels", "--help"]) == 130
    err = capsys.readouterr().err.strip()
    assert err == "interrupted before any result was written"


def _interrupted_after_a_run_started(result_dir: str = "") -> None:
    """A stand-in command: it made its run directory and stored a result, then the user pressed
    Ctrl-C."""
    RunDir.create("kernels", result_dir).write_text("rows.jsonl", "{}\n")
    raise KeyboardInterrupt


def _bad_input_found_late(result_dir: str = "") -> None:
    """A stand-in command: bad input (a corrupt file) found after the run directory was made."""
    RunDir.create("kernels", result_dir)
    raise UsageError("the weights file is corrupt")


def _terminated_after_a_run_started(result_dir: str = "") -> None:
    """A stand-in command: it made its run directory and stored a result, then a scheduler sent
    SIGTERM."""
    RunDir.create("kernels", result_dir).write_text("rows.jsonl", "{}\n")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the handler raises before this ends


def test_sigterm_ends_a_run_like_ctrl_c(tmp_path: Path, monkeypatch, capsys) -> None:
    """SIGTERM (`timeout`, a job scheduler) left the run 'running' with no word of what was kept."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip("this process already handles SIGTERM")
    monkeypatch.setitem(cli.COMMANDS, "stand-in", (__name__, "_terminated_after_a_run_started"))
    run = tmp_path / "run"
    assert main(["stand-in", "--result-dir", str(run)]) == 130
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # main() put the default back


def test_ctrl_c_names_the_kept_run_and_marks_it_interrupted(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(cli.COMMANDS, "stand-in", (__name__, "_interrupted_after_a_run_started"))
    run = tmp_path / "run"
    assert main(["stand-in", "--result-dir", str(run)]) == 130
    err = capsys.readouterr().err
    assert str(run) in " ".join(err.split()) and "Traceback" not in err
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"


def test_bad_input_found_after_the_run_directory_removes_it(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(cli.COMMANDS, "stand-in", (__name__, "_bad_input_found_late"))
    assert main(["stand-in", "--result-dir", str(tmp_path / "run")]) == 2
    assert "corrupt" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_help_at_80_columns_shows_every_option_name_whole(command: str, monkeypatch, capsys) -> None:
    """Rich's help panels cut long names at 80 columns (--trace-length-sca..., --no-prefill-gra...)."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    for param in [p for p in cli._command(command).params if not getattr(p, "hidden", False)]:
        for name in [*param.opts, *param.secondary_opts]:
            if name.startswith("--"):
                assert name in out, f"{command}: {name} cut or missing"
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 80


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_help_spells_dtypes_one_way(command: str, monkeypatch, capsys) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    for torch_name in ("bfloat16", "float16", "float32"):
        assert f"{torch_name}," not in out and f"({torch_name}" not in out, (command, torch_name)


# each run is tiny, so that a regression (the item skipped, the run done) fails fast
KERNELS = ["kernels", "--ops", "rmsnorm", "--widths", "8", "--dtypes", "fp32", "--arms", "torch",
           "--repeats", "1"]
E2E = ["e2e", "--model", "ouro-tiny", "--arms", "torch", "--input-len", "4", "--output-len", "1",
       "--repeats", "1"]


@pytest.mark.parametrize(
    "argv, needle",
    [
        ([*KERNELS, "--tokens", "1,,8"], "--tokens '1,,8': an empty item"),
        ([*KERNELS, "--ops", "rmsnorm,"], "--ops 'rmsnorm,': an empty item"),
        ([*E2E, "--concurrency", "1,,8"], "--concurrency '1,,8': an empty item"),
        ([*E2E, "--arms", "torch,,exact"], "an empty item"),
    ],
)
def test_an_empty_item_in_a_comma_list_is_refused(argv, needle, tmp_path, capsys) -> None:
    assert main([*argv, "--result-dir", str(tmp_path / "run")]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# -- defaults that fit every preset --------------------------------------------------------------
@pytest.mark.parametrize("model", ["ouro-tiny", "huginn-tiny"])
def test_e2e_defaults_fit_a_tiny_preset(model: str) -> None:
    """`e2e --model ouro-tiny` failed: 512 + 128 = 640 tokens exceed the 512-token context."""
    from rltbench import runtime
    from rltbench.commands.e2e.job import E2ESpec, resolve_defaults

    spec = resolve_defaults(E2ESpec(source=runtime.ModelSource(model), device="cpu"))
    assert spec.input_len + spec.output_len <= 512 and spec.input_len >= 256
    assert spec.concurrency == [1, 8]
    assert any("--input-len" in n for n in spec.notes)
    session = resolve_defaults(E2ESpec(source=runtime.ModelSource(model), device="cpu", workload="session"))
    assert session.trace == "mooncake-tiny" and any("mooncake-tiny" in n for n in session.notes)


def test_a_burst_length_the_user_gave_must_fit_and_the_error_says_what_works() -> None:
    from rltbench.bench.workload import fit_burst_lengths

    assert fit_burst_lengths(None, None, 4096, "m") == (512, 128, None)
    with pytest.raises(UsageError, match="use --input-len 384 or less"):
        fit_burst_lengths(500, None, 512, "ouro-tiny")
    with pytest.raises(UsageError, match="use --input-len 492 or less"):
        fit_burst_lengths(500, 20, 512, "ouro-tiny")
    with pytest.raises(UsageError, match="use --output-len 128 or less"):
        fit_burst_lengths(None, 600, 512, "ouro-tiny")


def test_session_on_a_tiny_model_names_the_small_trace(tmp_path: Path) -> None:
    from rltbench.bench.workload import materialize_session
    from rltbench.models import get_config

    rec = {"timestamp": 0, "input_length": 2000, "output_length": 10, "hash_ids": [1, 2, 3, 4]}
    with pytest.raises(UsageError, match="--trace mooncake-tiny"):
        materialize_session(get_config("ouro-tiny"), [rec], 0, max_model_len=512)


def test_profile_context_default_fits_the_model_and_a_given_one_names_the_flag() -> None:
    """`profile --model ouro-tiny --cpu` failed with 'max_model_len 731 exceeds the model's context'
    (an internal value) and left a failed run directory."""
    from rltbench.commands.profile.collect import fit_context

    assert fit_context(None, 65536, 3, 200, False, "m") == (512, None)
    ctx, note = fit_context(None, 512, 3, 200, True, "ouro-tiny")
    assert ctx == 512 - 219 and note and "--context 293" in note
    with pytest.raises(UsageError, match="use --context 293 or less"):
        fit_context(400, 512, 3, 200, True, "ouro-tiny")


def test_profile_too_large_a_context_leaves_no_run_directory(tmp_path: Path, capsys) -> None:
    argv = ["profile", "--model", "ouro-tiny", "--device", "cpu", "--context", "600"]
    assert main([*argv, "--result-dir", str(tmp_path / "run")]) == 2
    assert "--context" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_profile_corrupt_safetensors_leaves_no_run_directory(tmp_path: Path, capsys) -> None:
    from rltbench.models import build_model, save_hf_checkpoint

    ckpt = save_hf_checkpoint(build_model("ouro-tiny", seed=1), tmp_path / "ckpt")
    for f in ckpt.glob("*.safetensors"):
        f.write_bytes(b"not a safetensors file")
    argv = ["profile", "--weights", str(ckpt), "--device", "cpu", "--context", "4", "--iters", "1",
            "--steps", "1", "--arms", "torch", "--result-dir", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_profile_without_a_gpu_defaults_to_the_labelled_cpu_profile() -> None:
    import torch

    from rltbench.commands.profile.cli import profile_device

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    dev, note = profile_device("auto", False)
    assert dev == "cpu" and note and "CPU profile" in note


# -- profile: interrupt, CPU output --------------------------------------------------------------
def test_profile_ctrl_c_keeps_finished_arms_and_report_reads_them(tmp_path, monkeypatch, capsys) -> None:
    """Ctrl-C after the torch arm left only manifest.json, and `report` said no arm finished."""
    from rltbench.commands.profile import collect

    real = collect.profile_arm_cpu

    def arm_then_ctrl_c(eng, spec, arm, vocab):
        if arm != "torch":
            raise KeyboardInterrupt
        return real(eng, spec, arm, vocab)

    monkeypatch.setattr(collect, "profile_arm_cpu", arm_then_ctrl_c)
    run = tmp_path / "run"
    argv = ["profile", "--model", "ouro-tiny", "--device", "cpu", "--context", "4", "--iters", "1",
            "--steps", "1", "--arms", "torch,exact", "--result-dir", str(run)]
    assert main(argv) == 130
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"
    torch_arm = json.loads((run / "summary.json").read_text())["arms"]["torch"]
    assert all(row["class"] for row in torch_arm["top_kernels"])  # the CPU table's class column
    table = (run / "table.md").read_text()
    assert "no results for arm(s) exact" in table
    capsys.readouterr()
    assert main(["report", str(run)]) == 0


def _cpu_summary() -> dict:
    arm = {"kernels_per_step": 10.0, "agree": None, "wall_us": [1000.0, 1100.0, 900.0],
           "classes": [{"class": "norm", "count": 2.0, "time_us": 3.0}],
           "top_kernels": [{"name": "aten::mul", "class": "norm", "count": 2.0, "time_us": 3.0}]}
    return {"mode": "cpu", "model": "ouro-tiny", "batch": 1, "context": 4,
            "arms": {"torch": arm, "exact": arm}}


def test_cpu_profile_table_has_no_gpu_columns_and_no_speed_ratio() -> None:
    """The CPU table showed `vs torch 1.59x`, an all-n/a graph-nodes column and an empty class column."""
    from rltbench.commands.profile.report import table_markdown

    md = table_markdown(_cpu_summary())
    assert "vs torch" not in md and "graph nodes" not in md and "No speed verdict" in md
    assert "| `aten::mul` | norm |" in md


def test_profile_prints_no_profiler_usdt_lines(tmp_path: Path) -> None:
    """torch's profiler printed `USDT: ... profiler_start/stop` between the command's lines."""
    code = (
        "from rltbench import cli; cli._load('rltbench.errors', 'UsageError')\n"
        "import torch\n"
        "from torch.profiler import ProfilerActivity, profile\n"
        "with profile(activities=[ProfilerActivity.CPU]):\n"
        "    torch.ones(4) + 1\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True)
    assert "USDT" not in out.stderr + out.stdout


# -- no verdict where timings cannot carry one ---------------------------------------------------
def test_e2e_plots_say_cpu_and_random_weights() -> None:
    from rltbench.commands.e2e.report import plot_caveats

    a = {"summary": {"no_verdict": "CPU timings"}, "config": {"random_weights": True}}
    text = "; ".join(c for c in plot_caveats(a) if c)
    assert "no speed verdict: CPU timings" in text and "random weights" in text


def test_cpu_profile_plot_says_no_verdict() -> None:
    from rltbench.commands.profile.report import breakdown_figure

    fig = breakdown_figure(_cpu_summary())
    texts = " ".join(t.get_text() for t in fig.texts)
    assert "no speed verdict" in texts


def test_gsm8k_on_cpu_defaults_to_a_few_questions(tmp_path: Path, monkeypatch, capsys) -> None:
    """`gsm8k --model ouro-tiny` on CPU started all 1319 questions (hours); it takes 8 and says so."""
    import rltbench.commands.gsm8k.evaluate as ev
    from rltbench.textcodec import train_fallback_tokenizer

    limits: list[int | None] = []

    def stop(arm, lm, task, limit, *args, **kwargs):  # the questions are chosen by now; evaluating
        limits.append(limit)                            # them is not this test
        raise KeyboardInterrupt

    monkeypatch.setattr(ev, "run_arm", stop)
    tok = tmp_path / "tokenizer.json"
    train_fallback_tokenizer(["Q: 3 + 4? A: 7.\n"] * 20, model_vocab=256).save(str(tok))
    out = tmp_path / "run"
    argv = ["gsm8k", "--model", "ouro-tiny", "--arms", "torch", "--device", "cpu", "--tokenizer", str(tok),
            "--result-dir", str(out)]
    assert main(argv) == 130
    assert "--limit 8 on CPU" in " ".join(capsys.readouterr().out.split())
    assert limits == [8] and not out.exists()  # interrupted before its first result: nothing kept


def test_random_weights_line_calls_cpu_timings_meaningless() -> None:
    """The e2e/pd table header said '(token ids and timings are)' meaningful on CPU runs too."""
    from rltbench.results.serving_stats import no_verdict_reason, random_weights_line

    cpu = random_weights_line(no_verdict_reason({"device": "cpu"}))
    assert "timings are" not in cpu and "no verdict" in cpu
    assert "token ids and timings are" in random_weights_line(no_verdict_reason({"device": "cuda:0"}))
