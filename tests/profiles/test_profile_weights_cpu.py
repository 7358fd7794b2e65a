"""`rltbench profile --device cpu --weights DIR`: a checkpoint without tokenizer.json (the profile feeds token
ids, never text) must load, and the manifest must name the checkpoint's model, not the default preset."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from rltbench.cli import app
from rltbench.models import build_model, save_hf_checkpoint


def _profile(*args: str):
    base = "profile --device cpu --context 4 --iters 1 --steps 1 --arms torch".split()
    return CliRunner().invoke(app, [*base, *args])


def test_weights_without_tokenizer(tmp_path: Path) -> None:
    ckpt = save_hf_checkpoint(build_model("ouro-tiny", seed=5), tmp_path / "ckpt")
    assert not (ckpt / "tokenizer.json").exists()
    out = tmp_path / "run"
    res = _profile("--weights", str(ckpt), "--result-dir", str(out))
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["config"]["model"] == "ouro-tiny" and manifest["config"]["random_weights"] is False


def test_bad_checkpoint_config_is_refused_before_a_run_dir_exists(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "ouro", "hidden_size": "wide"}')
    res = _profile("--weights", str(ckpt), "--result-dir", str(tmp_path / "run"))
    assert res.exit_code == 2 and "hidden_size" in res.output
    assert not (tmp_path / "run").exists()
