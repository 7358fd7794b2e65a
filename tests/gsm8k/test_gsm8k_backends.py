"""Generation plumbing with fakes: stop handling, truncation, the lm-eval LM class, flag parsing."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rltbench.backends.base import Timeouts, parse_servers
from rltbench.backends.engine import EngineBackend
from rltbench.commands.gsm8k.cli import arm_names, check_choices
from rltbench.commands.gsm8k.generation import Generation, QuestionCodec, cut_at_stop
from rltbench.errors import UsageError
from rltbench.textcodec import TextCodec, train_fallback_tokenizer


@dataclass
class _Ev:
    request_id: str
    token_ids: list[int]
    time: float
    finished: bool
    finish_reason: str | None = None


class FakeEngine:
    """Emits a scripted token stream per request, one token per step, honouring stop ids."""

    def __init__(self, script: dict[int, list[int]]):
        self.script = script
        self.live: dict[str, tuple[list[int], int, object]] = {}
        self.added: list[tuple[str, list[int], object]] = []
        self.aborted: list[str] = []

    def set_arm(self, name) -> None:
        assert not self.live

    def reset_prefix_cache(self) -> None:
        pass

    def add_request(self, rid, ids, params) -> None:
        idx = int(rid.rsplit("/", 1)[1])
        self.added.append((rid, list(ids), params))
        self.live[rid] = (self.script[idx], 0, params)

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def abort_request(self, rid) -> None:
        self.aborted.append(rid)
        self.live.pop(rid)

    def step(self):
        events = []
        for rid, (toks, pos, params) in list(self.live.items()):
            tok = toks[pos]
            pos += 1
            stop = tok in params.stop_token_ids
            done = stop or pos >= params.max_tokens or pos >= len(toks)
            events.append(_Ev(rid, [tok], 0.0, done, ("stop" if stop else "length") if done else None))
            if done:
                self.live.pop(rid)
            else:
                self.live[rid] = (toks, pos, params)
        return events


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    texts = ["Q: how many apples?\nA: The answer is 12.\n\n"] * 50
    return TextCodec(train_fallback_tokenizer(texts, model_vocab=300), "test")


def test_cut_at_stop() -> None:
    assert cut_at_stop("abc Q: def", ["Q:", "</s>"]) == ("abc ", True)
    assert cut_at_stop("abc </s> Q:", ["Q:", "</s>"]) == ("abc ", True)
    assert cut_at_stop("abc", ["Q:", ""]) == ("abc", False)


def test_engine_backend_stops_truncates_and_counts(codec: TextCodec) -> None:
    answer = codec.encode(" The answer is 12.\n\nQ: how many apples?")
    plain = codec.encode(" The answer is 12. more text that never stops")
    eos = 7
    script = {0: answer, 1: plain, 2: codec.encode(" 12") + [eos] + codec.encode(" tail")}
    eng = FakeEngine(script)
    be = EngineBackend(eng, ["torch"], codec)
    questions = QuestionCodec(codec, model_eos=(eos,), max_context=64)
    long_prompt = "Q: how many apples? " * 40
    until = [["Q:"], ["Q:"], ["Q:"]]
    reqs, truncated = questions.requests(["Q: a\nA:", long_prompt, "Q: c\nA:"], until, [40, 5, 40])
    recs = be.run_cell("torch", "chunk0", reqs, Timeouts(float("inf"), float("inf")), timed=False).records
    gens = questions.generations("torch", reqs, truncated, recs, until)
    assert gens[0].text == " The answer is 12.\n\n" and gens[0].finish_reason == "stop_str"
    assert "torch/chunk0/0" in eng.aborted  # aborted as soon as the stop string appeared, not run to the end
    assert gens[0].num_tokens < len(answer)
    assert gens[1].num_tokens == 5 and gens[1].finish_reason == "length"
    assert gens[1].truncated_prompt and gens[1].prompt_tokens == 64 - 5
    assert eng.added[1][1] == codec.encode(long_prompt)[-(64 - 5) :]  # left truncation keeps the end
    assert gens[2].finish_reason == "stop" and gens[2].token_ids[-1] == eos and gens[2].text == " 12"
    assert all(eos in p.stop_token_ids for _, _, p in eng.added)
    assert sum(g.truncated_prompt for g in gens) == 1


def test_lm_records_by_doc_id() -> None:
    from rltbench.commands.gsm8k.lm import RltbenchLM

    class Backend:
        arm = "x"

        def generate(self, prompts, until, max_gen_toks):
            assert until == [["Q:"], ["Q:", "</s>"]] and max_gen_toks == [9, 4]
            return [Generation(text=p.upper(), num_tokens=len(p), token_ids=[1] * len(p)) for p in prompts]

    @dataclass
    class Req:
        args: tuple
        doc_id: int

    lm = RltbenchLM(Backend(), max_gen_toks=9)
    out = lm.generate_until(
        [Req(("ab", {"until": "Q:"}), 5), Req(("cde", {"until": ["Q:", "</s>"], "max_gen_toks": 4}), 2)]
    )
    assert out == ["AB", "CDE"] and lm.records[5].num_tokens == 2 and lm.records[2].num_tokens == 3
    with pytest.raises(NotImplementedError):
        lm.loglikelihood([])


def test_flag_parsing() -> None:
    assert list(arm_names("exact,torch", "engine", {})) == ["torch", "exact"]
    assert list(arm_names(None, "engine", {})) == ["torch", "exact", "approx"]
    urls = parse_servers(["torch=http://a:1", "approx=http://b:2/v1"])
    assert urls == {"torch": "http://a:1", "approx": "http://b:2"}
    assert parse_servers(["x=https://h/v1/completions/"]) == {"x": "https://h"}
    assert list(arm_names(None, "openai", urls)) == ["torch", "approx"]
    # the reference named twice is the A/A arm (the throughput noise floor)
    assert list(arm_names("torch,exact,torch", "engine", {})) == ["torch", "exact", "torch#2"]
    assert arm_names("torch,x=norm:exact", "engine", {}, {"scope": "all"})["x"].norm == "exact"
    for bad in (
        lambda: arm_names("exact", "engine", {}),
        lambda: arm_names("torch,torch,torch", "engine", {}),
        lambda: arm_names("torch,exact,exact", "engine", {}),
        lambda: arm_names(None, "openai", {}),
        lambda: parse_servers(["nourl"]),
        lambda: parse_servers(["a=localhost:8000"]),
        lambda: parse_servers(["a=http://h:1", "a=http://h:2"]),
        lambda: arm_names("torch,exact", "openai", urls),
        lambda: arm_names(None, "engine", urls),
        lambda: check_choices("mmlu", "engine", "strict-match"),
        lambda: check_choices("gsm8k_cot", "vllm", "strict-match"),
        lambda: check_choices("gsm8k_cot", "engine", "loose"),
    ):
        with pytest.raises(UsageError):
            bad()
    assert parse_servers(["a=http://h:8/", "b=http://h:9/v1", "c=http://h:7/v1/completions"]) == {
        "a": "http://h:8", "b": "http://h:9", "c": "http://h:7"}
