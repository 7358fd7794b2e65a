"""Ouro exit gate: pdf/CDF and selection against hand-computed cases, and the model-level behaviour."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from models_testutil import random_prompt, run_prefill

from rltbench.models import OuroForCausalLM, build_model
from rltbench.models.ouro import exit_pdf, select_exit


def _logit(p):
    return math.log(p / (1 - p))


def test_exit_pdf_hand_computed():
    # lambdas 0.5, 0.25, 0.8, (last ignored): p = 0.5, 0.5*0.25=0.125, 0.375*0.8=0.3, rest 0.075
    lams = [0.5, 0.25, 0.8, 0.9]
    gates = [torch.tensor([[_logit(lam)]], dtype=torch.float64) for lam in lams]
    pdf = exit_pdf(gates)
    torch.testing.assert_close(pdf, torch.tensor([[0.5, 0.125, 0.3, 0.075]], dtype=torch.float64))
    assert abs(float(pdf.sum()) - 1.0) < 1e-12


def test_select_exit_hand_computed():
    pdf = torch.tensor([[0.5, 0.125, 0.3, 0.075],   # CDF 0.5 0.625 0.925 1.0
                        [0.1, 0.1, 0.1, 0.7],       # CDF 0.1 0.2 0.3 1.0
                        [0.9, 0.05, 0.05, 0.0]],    # CDF 0.9 0.95 1.0 1.0
                       dtype=torch.float64)
    assert select_exit(pdf, 0.5).tolist() == [0, 3, 0]
    assert select_exit(pdf, 0.6).tolist() == [1, 3, 0]
    assert select_exit(pdf, 0.92).tolist() == [2, 3, 1]
    assert select_exit(pdf, 1.0).tolist() == [3, 3, 2]  # a saturated CDF can reach 1.0 early
    assert select_exit(pdf, 1.5).tolist() == [3, 3, 3]  # never reached -> last loop


def _with_loops(model, loops):
    cfg = dataclasses.replace(model.config, num_loops=loops)
    other = OuroForCausalLM(cfg, dtype=model.dtype)
    other.load_state_dict(model.state_dict())
    return other


def test_threshold_selects_loop_hidden_state(ref_ops):
    model = build_model("ouro-tiny", seed=11)  # 3 loops
    prompt = random_prompt(6, seed=11)
    fixed, _ = run_prefill(model, [prompt], ref_ops)
    assert model.last_exit_depths.tolist() == [2] * 6
    loop0, _ = run_prefill(_with_loops(model, 1), [prompt], ref_ops)
    loop1, _ = run_prefill(_with_loops(model, 2), [prompt], ref_ops)
    assert not torch.allclose(loop0, fixed)
    with torch.no_grad():
        model.exit_gate_weight.zero_()
        model.exit_threshold = 0.5
        model.exit_gate_bias.fill_(10.0)  # lambda ~ 1: CDF ~ 1 after loop 0
        out, _ = run_prefill(model, [prompt], ref_ops)
        assert model.last_exit_depths.tolist() == [0] * 6
        assert torch.equal(out, loop0)
        model.exit_gate_bias.fill_(0.0)  # lambda 0.5: CDF 0.5, 0.75, 1 -> q=0.7 exits at loop 1
        model.exit_threshold = 0.7
        out, _ = run_prefill(model, [prompt], ref_ops)
        assert model.last_exit_depths.tolist() == [1] * 6
        assert torch.equal(out, loop1)
        model.exit_gate_bias.fill_(-10.0)  # lambda ~ 0: last loop
        out, _ = run_prefill(model, [prompt], ref_ops)
        assert model.last_exit_depths.tolist() == [2] * 6
        assert torch.equal(out, fixed)


def test_threshold_is_per_token(ref_ops):
    """Tokens whose gate fires exit early while the others go on; matches hand selection."""
    model = build_model("ouro-tiny", seed=12)
    prompt = random_prompt(8, seed=12)
    with torch.no_grad():
        model.exit_gate_weight.normal_(0, 3.0, generator=torch.Generator().manual_seed(12))
        model.exit_gate_bias.zero_()
    model.exit_threshold = 0.6
    out, _ = run_prefill(model, [prompt], ref_ops)
    depths = model.last_exit_depths
    per_loop = [run_prefill(_with_loops(model, t), [prompt], ref_ops)[0] for t in (1, 2, 3)]
    gates = [torch.nn.functional.linear(h, model.exit_gate_weight, model.exit_gate_bias) for h in per_loop]
    want = select_exit(exit_pdf(gates), 0.6)
    assert torch.equal(depths, want)
    assert len(set(depths.tolist())) > 1, "seeded gate should give mixed exit depths"
    for i, d in enumerate(depths.tolist()):
        assert torch.equal(out[i], per_loop[d][i])


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_gate_in_model_dtype(dtype, ref_ops):
    model = build_model("ouro-tiny", dtype=dtype, seed=13)
    model.exit_threshold = 0.5
    out, _ = run_prefill(model, [random_prompt(4, seed=13)], ref_ops)
    assert out.dtype == dtype and model.last_exit_depths.dtype == torch.int64
