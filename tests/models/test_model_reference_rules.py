"""Fidelity at the edges of the published modeling code: Ouro's exit rule with a saturated gate (the
released threshold 1.0 included) and Huginn's untied LM head.

Why these tests: both models match the reference code in their layers, but two readings of a
checkpoint differ from it only in corner cases a random model never reaches. Ouro's reference exits at
the first loop whose cumulative exit probability, in the model dtype, reaches the threshold (>=), so
in bf16 a saturated gate exits early even at 1.0; a Huginn checkpoint saved with
`tie_embeddings: false` has a head of its own. Each test builds the corner case on purpose and checks
rltbench against a small re-statement of the reference rule written here.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from models_testutil import random_prompt, run_prefill
from safetensors.torch import load_file, save_file

from rltbench.arms import ArmSpec
from rltbench.errors import UsageError
from rltbench.models import OuroForCausalLM, build_model, load_model, save_hf_checkpoint
from rltbench.models.configs import exit_rule
from rltbench.runtime import ModelSource

# (gate bias, gate weight std) per dtype: the gate saturates (sigmoid rounds to 1, or the probability left
# rounds away in the CDF) for some tokens after loop 0, for others after loop 1, for the rest not at all
SATURATED = {torch.bfloat16: (4.5, 0.6), torch.float32: (13.0, 1.2)}


def reference_exit(gates: list[torch.Tensor], threshold: float) -> torch.Tensor:
    """The reference's exit rule, re-stated in its own layout ([batch, seq, loops]): exit pdf from the
    gate logits, cumulative sum, the first loop whose CDF >= threshold, else the last. All in the gates'
    dtype. `gates`: one [1, S, 1] logit tensor per loop; returns the loop per token, [S]."""
    remaining = torch.ones_like(gates[0].squeeze(-1))
    pdf = []
    for i, gate in enumerate(gates):
        lam = torch.sigmoid(gate.squeeze(-1))
        if i < len(gates) - 1:
            pdf.append(lam * remaining)
            remaining = remaining * (1.0 - lam)
        else:
            pdf.append(remaining)
    stacked = torch.stack(pdf, dim=2)
    mask = torch.cumsum(stacked, dim=2) >= threshold
    steps = torch.argmax(mask.float(), dim=2)
    steps[~mask.any(dim=2)] = stacked.shape[2] - 1
    return steps[0]


def _saturated_checkpoint(dtype: torch.dtype, tmp_path, threshold: float = 1.0):
    """An ouro-tiny checkpoint (3 loops) whose config.json says `early_exit_threshold: threshold`, with a
    strongly biased exit gate."""
    model = build_model("ouro-tiny", dtype=dtype, seed=41, early_exit_threshold=threshold)
    bias, std = SATURATED[dtype]
    with torch.no_grad():
        gen = torch.Generator().manual_seed(41)
        model.exit_gate_weight.copy_(torch.randn(model.exit_gate_weight.shape, generator=gen) * std)
        model.exit_gate_bias.fill_(bias)
    return save_hf_checkpoint(model, tmp_path / "ckpt")


def _per_loop_hidden(model: OuroForCausalLM, prompt: list[int], ops) -> list[torch.Tensor]:
    """Each loop's output (after the per-loop final norm): the same weights run with 1, 2, ... loops and
    no gate, so nothing of the exit rule under test is involved."""
    out = []
    for loops in range(1, model.config.num_loops + 1):
        cfg = dataclasses.replace(model.config, num_loops=loops, early_exit_threshold=None)
        other = OuroForCausalLM(cfg, dtype=model.dtype)
        other.load_state_dict(model.state_dict())
        out.append(run_prefill(other, [prompt], ops)[0])
    return out


def _prefill(model: OuroForCausalLM, prompt: list[int], ops, stepwise: bool) -> torch.Tensor:
    """One forward over the whole prompt on the model's device (every loop runs in both modes)."""
    dev = model.device
    cache = model.new_kv_cache(max_seqs=1, max_len=len(prompt))
    cache.begin([0] * len(prompt), list(range(len(prompt))))
    ids = torch.tensor(prompt, device=dev)
    return model.forward(ids, torch.arange(len(prompt), device=dev), cache, ops, stepwise=stepwise)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_saturated_gate_exits_as_the_reference(dtype, tmp_path, ref_ops):
    """The checkpoint's threshold 1.0 is read as the reference reads it: tokens whose gate saturates
    exit early, with the reference's exit depths, hidden states and argmaxes."""
    model, _ = load_model(_saturated_checkpoint(dtype, tmp_path), device="cpu", tokenizer=False)
    assert model.dtype == dtype and model.exit_threshold == 1.0  # the checkpoint's value is the default
    prompt = random_prompt(37, seed=41)
    out, _ = run_prefill(model, [prompt], ref_ops)
    depths = model.last_exit_depths
    hs = _per_loop_hidden(model, prompt, ref_ops)
    gates = [F.linear(h, model.exit_gate_weight, model.exit_gate_bias).unsqueeze(0) for h in hs]
    want = reference_exit(gates, 1.0)
    assert torch.equal(depths, want)
    assert set(depths.tolist()) == {0, 1, 2}, "the gate should saturate after loop 0, loop 1, or never"
    chosen = torch.stack(hs, dim=1)[torch.arange(len(prompt)), want]
    assert torch.equal(out, chosen)
    ref_argmax = F.linear(chosen, model.lm_head).argmax(-1)
    assert torch.equal(model.compute_logits(out).argmax(-1), ref_argmax)
    # the compute-saving exit's loop-by-loop CDF picks the same loops (every loop runs here)
    stepwise = _prefill(model, prompt, ref_ops, stepwise=True)
    assert torch.equal(model.last_exit_depths, want) and torch.equal(stepwise, out)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype, bias, std", [(torch.bfloat16, 2.0, 0.6), (torch.float32, 6.0, 1.0)],
                         ids=["bf16", "fp32"])
def test_compute_saving_exit_takes_the_reference_loops(dtype, bias, std, device, ref_ops):
    """The compute-saving exit decides loop by loop; its CDF must be the reference's cumsum, not a running
    sum rounded after every loop (with 5 loops and threshold 1.0 such a sum picks other loops for about
    one token in six on the CPU). Every loop runs in both forwards here, so any difference is the
    rule's; on CUDA the cumsum is a parallel scan, whose prefixes must not depend on the later loops."""
    model = build_model("ouro-tiny", device=device, dtype=dtype, seed=41, early_exit_threshold=1.0,
                        num_loops=5)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(41)
        model.exit_gate_weight.copy_(torch.randn(model.exit_gate_weight.shape, generator=gen) * std)
        model.exit_gate_bias.fill_(bias)
    prompt = random_prompt(120, seed=41)
    out = _prefill(model, prompt, ref_ops, stepwise=False)
    want = model.last_exit_depths.clone()
    assert len(set(want.tolist())) >= 3, "the gate should spread the tokens over the loops"
    stepwise = _prefill(model, prompt, ref_ops, stepwise=True)
    assert torch.equal(model.last_exit_depths, want) and torch.equal(stepwise, out)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_never_exit_reads_the_threshold_as_the_last_loop(dtype, tmp_path, ref_ops):
    """`never_exit` (vLLM's reading of 1.0): the gate is not evaluated, every token takes the last loop,
    and the output says which reading ran."""
    ckpt = _saturated_checkpoint(dtype, tmp_path)
    model, _ = load_model(ckpt, device="cpu", tokenizer=False, never_exit=True)
    assert model.exit_threshold is None and model.config.early_exit_threshold == 1.0
    prompt = random_prompt(37, seed=41)
    out, _ = run_prefill(model, [prompt], ref_ops)
    assert model.last_exit_depths.tolist() == [2] * len(prompt)
    assert torch.equal(out, _per_loop_hidden(model, prompt, ref_ops)[-1])
    assert "--never-exit" in exit_rule(model.config, "bfloat16")
    gated = dataclasses.replace(model.config, never_exit=False)
    assert "exit threshold 1.0" in exit_rule(gated, "bfloat16") and "bfloat16" in exit_rule(gated, "bfloat16")
    with pytest.raises(UsageError, match="--never-exit ignores"):
        load_model(ckpt, device="cpu", tokenizer=False, never_exit=True, stop_at_exit=True)


def test_model_source_threshold_options(tmp_path):
    """The command-line readings: --exit-threshold takes (0, 1], 1.0 included; --never-exit is an Ouro
    option that replaces the threshold, not one given beside it."""
    ckpt = str(_saturated_checkpoint(torch.float32, tmp_path))
    assert ModelSource("ouro-tiny", weights=ckpt).config().gate_threshold == 1.0
    assert ModelSource("ouro-tiny", weights=ckpt, never_exit=True).config().gate_threshold is None
    assert ModelSource("ouro-tiny", exit_threshold=1.0).config().gate_threshold == 1.0
    bad_options = ((dict(exit_threshold=float("nan")), "must lie in"),
                   (dict(exit_threshold=0.0), "must lie in"),
                   (dict(exit_threshold=0.5, never_exit=True), "give one"))
    for bad, match in bad_options:
        with pytest.raises(UsageError, match=match):
            ModelSource("ouro-tiny", **bad).config()
    with pytest.raises(UsageError, match="Ouro option"):
        ModelSource("huginn-tiny", never_exit=True).config()


def test_exact_arm_keeps_the_torch_arms_exits_with_a_saturated_gate(tmp_path):
    """bf16, threshold 1.0, a saturated gate: the exact arm (fused kernels run eagerly) picks the same
    loops and hidden states bit for bit, so exit depths stay part of identity."""
    kernels = pytest.importorskip("rltbench.kernels")
    model, _ = load_model(_saturated_checkpoint(torch.bfloat16, tmp_path), device="cpu", tokenizer=False)
    prompt = random_prompt(12, seed=43)
    outs = []
    for spec in (ArmSpec.torch(), ArmSpec(norm="exact", rope="exact", act="exact", scope="all")):
        hidden, _ = run_prefill(model, [prompt], kernels.make_ops(spec))
        outs.append((hidden, model.last_exit_depths.clone()))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert int(outs[0][1].min()) < 2


def _untied_huginn_checkpoint(tmp_path):
    """A huginn-tiny checkpoint edited by hand as `tie_embeddings: false` would write it: config.json
    says so and `lm_head.weight` holds a head of its own (not `wte`). Returns (dir, that head)."""
    ckpt = save_hf_checkpoint(build_model("huginn-tiny", seed=44), tmp_path / "huginn")
    config = json.loads((ckpt / "config.json").read_text())
    config["tie_embeddings"] = config["tie_word_embeddings"] = False
    (ckpt / "config.json").write_text(json.dumps(config))
    sd = load_file(str(ckpt / "model.safetensors"))
    head = torch.randn(sd["transformer.wte.weight"].shape, generator=torch.Generator().manual_seed(45)) * 0.02
    sd["lm_head.weight"] = head
    save_file(sd, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    return ckpt, head


def test_huginn_untied_head_is_used(tmp_path, ref_ops):
    ckpt, head = _untied_huginn_checkpoint(tmp_path)
    model, _ = load_model(ckpt, device="cpu", tokenizer=False)
    assert not model.config.tie_embeddings and torch.equal(model.head_weight(), head)
    prompt = random_prompt(20, seed=44)
    hidden, _ = run_prefill(model, [prompt], ref_ops)
    logits = model.compute_logits(hidden)
    assert torch.equal(logits, F.linear(hidden, head).float())
    tied_argmax = F.linear(hidden, model.wte).argmax(-1)
    assert not torch.equal(logits.argmax(-1), tied_argmax)  # the wte head would answer differently
    again, _ = load_model(save_hf_checkpoint(model, tmp_path / "again"), device="cpu", tokenizer=False)
    assert not again.config.tie_embeddings and torch.equal(again.head_weight(), head)


def test_huginn_tied_checkpoint_keeps_wte_and_untied_needs_its_head(tmp_path):
    """A tied checkpoint's stored `lm_head.weight` is ignored (the reference ties it to wte); an untied
    one without `lm_head.weight` is refused in one line, not run with wte."""
    ckpt, head = _untied_huginn_checkpoint(tmp_path)
    config = json.loads((ckpt / "config.json").read_text())
    config["tie_embeddings"] = config["tie_word_embeddings"] = True
    (ckpt / "config.json").write_text(json.dumps(config))
    tied, _ = load_model(ckpt, device="cpu", tokenizer=False)
    assert tied.head_weight() is tied.wte and not torch.equal(tied.wte, head)
    config["tie_embeddings"] = config["tie_word_embeddings"] = False
    (ckpt / "config.json").write_text(json.dumps(config))
    sd = load_file(str(ckpt / "model.safetensors"))
    del sd["lm_head.weight"]
    save_file(sd, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UsageError, match="missing tensor 'lm_head.weight'"):
        load_model(ckpt, device="cpu", tokenizer=False)
