"""The arm contract: one ArmSpec, one grammar (`parse_arms`), the shared flags, no arm variables."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rltbench import native
from rltbench.arms import ARMS, ArmSpec, eager_kernel_arms, eager_reference_arms, is_exact, parse_arms
from rltbench.errors import UsageError


def test_named_arms_and_spec_properties() -> None:
    assert ARMS["exact"] == ArmSpec("exact", "exact", "exact", "graph") == ArmSpec.exact()
    assert ARMS["cuda"] == ArmSpec.cuda() and ARMS["torch"] == ArmSpec()
    assert ArmSpec.exact().to_dict() == {"norm": "exact", "rope": "exact", "act": "exact", "scope": "graph",
                                        "name": "exact"}
    assert ArmSpec("exact", "off", "approx").name == "norm:exact/rope:off/act:approx"
    assert is_exact(ArmSpec.cuda()) and is_exact(ArmSpec(norm="cuda", act="exact"))
    assert not is_exact(ArmSpec(norm="cuda", act="approx")) and not is_exact(ArmSpec.torch())
    with pytest.raises(UsageError, match="norm must be one of"):
        ArmSpec(norm="fast")


def test_parse_names_repeats_overrides_and_custom_arms() -> None:
    specs = parse_arms("torch,exact,approx,torch")
    assert list(specs) == ["torch", "exact", "approx", "torch#2"]  # the A/A arm
    over = parse_arms("torch,exact,c=norm:exact", {"scope": "all", "rope": "off", "norm": None})
    assert over["exact"] == ArmSpec("exact", "off", "exact", "all")
    assert over["torch"] == ArmSpec.torch() and over["c"] == ArmSpec(norm="exact")  # not overridden
    custom = parse_arms("fused=norm:exact/scope:all, x = act : approx")
    assert custom["fused"] == ArmSpec(norm="exact", scope="all") and custom["x"] == ArmSpec(act="approx")


@pytest.mark.parametrize("spec", list(ARMS.values()) + [ArmSpec("approx", "off", "exact", "all")])
def test_str_is_the_grammar(spec: ArmSpec) -> None:
    assert parse_arms(f"x={spec}", build_native=False)["x"] == spec


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("nope", "unknown arm 'nope'"),
        ("x=norm:fast", "norm must be one of"),
        ("x=norm", "setting:value pairs"),
        ("x=color:red", "unknown setting 'color'"),
        ("to#rch", "bad arm name"),
        ("norm=exact,rope=off", "NAME=norm:exact/rope:off"),  # the retired per-setting form
        ("torch,scope=all", "--scope"),
    ],
)
def test_bad_arm_strings_name_the_fix(text: str, needle: str) -> None:
    with pytest.raises(UsageError, match=needle):
        parse_arms(text)


def test_bad_override_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--scope: scope must be one of graph, all"):
        parse_arms("torch,exact", {"scope": "sometimes"})


def test_eager_arm_sets() -> None:
    specs = parse_arms("torch,exact,a=norm:approx/scope:all")
    assert eager_reference_arms(specs, graphs=False) == ["exact"] and eager_reference_arms(specs, True) == []
    assert eager_kernel_arms(specs) == {"a"}


def test_native_arm_is_built_while_parsing_or_refused() -> None:
    if native.unavailable_reason() is None:
        pytest.skip("the native arm can be built on this machine")
    with pytest.raises(UsageError, match="unavailable"):
        parse_arms("torch,custom=norm:cuda")
    assert parse_arms("torch,c=norm:cuda", build_native=False)["c"].norm == "cuda"


@pytest.mark.parametrize("var", ["RLTBENCH_NORM", "RLTBENCH_ROPE", "RLTBENCH_ACT", "RLTBENCH_SCOPE"])
def test_removed_arm_variables_exit_2_naming_the_flag(var: str, monkeypatch, tmp_path) -> None:
    from rltbench.cli import app

    monkeypatch.setenv(var, "approx")
    flag = "--" + var.split("_")[1].lower()
    out = tmp_path / "run"
    args = ["e2e", "--model", "ouro-tiny", "--device", "cpu", "--result-dir", str(out)]
    res = CliRunner().invoke(app, args)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and flag in lines[0], res.output
    assert not out.exists()
    servers = ["gsm8k", "--backend", "openai", "--arm", "torch=http://127.0.0.1:1", "--result-dir", str(out)]
    assert CliRunner().invoke(app, servers).exit_code == 2 and not out.exists()  # no arm parsed there


@pytest.mark.parametrize("command", ["kernels", "e2e", "profile", "gsm8k", "serve"])
def test_every_command_takes_the_shared_arm_flags(command: str) -> None:
    from rltbench.cli import app

    res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    for flag in ("--norm", "--rope", "--act", "--scope"):
        assert flag in res.output, (command, flag)
