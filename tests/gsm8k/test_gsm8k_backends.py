"""Generation plumbing with fakes: stop handling, truncation, the lm-eval LM class, flag parsing."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rltbench.commands.gsm8k.backends import EngineBackend, Generation, completions_url, cut_at_stop
from rltbench.commands.gsm8k.cli import parse_arm_urls, parse_arms, validate_numbers
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

    def add_request(self, rid, ids, params) -> None:
        idx = int(rid.rsplit("-", 1)[1])
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
    be = EngineBackend(eng, codec, "torch", model_eos=(eos,), max_context=64)
    long_prompt = "Q: how many apples? " * 40
    gens = be.generate(["Q: a\nA:", long_prompt, "Q: c\nA:"], [["Q:"], ["Q:"], ["Q:"]], [40, 5, 40])
    assert gens[0].text == " The answer is 12.\n\n" and gens[0].finish_reason == "stop_str"
    assert "torch-0" in eng.aborted  # aborted as soon as the stop string appeared, not run to the end
    assert gens[0].num_tokens < len(answer)
    assert gens[1].num_tokens == 5 and gens[1].finish_reason == "length"
    assert gens[1].truncated_prompt and gens[1].prompt_tokens == 64 - 5
    assert eng.added[1][1] == codec.encode(long_prompt)[-(64 - 5) :]  # left truncation keeps the end
    assert gens[2].finish_reason == "stop" and gens[2].token_ids[-1] == eos and gens[2].text == " 12"
    assert all(eos in p.stop_token_ids for _, _, p in eng.added)
    assert be.stats.requests == 3 and be.stats.truncated_prompts == 1
    assert be.stats.generated_tokens == sum(g.num_tokens for g in gens)


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
    assert parse_arms("exact,torch", "engine", {}) == ["torch", "exact"]
    assert parse_arms(None, "engine", {}) == ["torch", "exact", "approx"]
    urls = parse_arm_urls(["torch=http://a:1", "approx=http://b:2/v1"])
    assert parse_arms(None, "openai", urls) == ["torch", "approx"]
    # the reference named twice is the A/A arm (the throughput noise floor)
    assert parse_arms("torch,exact,torch", "engine", {}) == ["torch", "exact", "torch#2"]
    for bad in (
        lambda: parse_arms("exact", "engine", {}),
        lambda: parse_arms("torch,torch,torch", "engine", {}),
        lambda: parse_arms("torch,exact,exact", "engine", {}),
        lambda: parse_arms(None, "openai", {}),
        lambda: parse_arm_urls(["nourl"]),
        lambda: parse_arms("torch,exact", "openai", urls),
        lambda: parse_arms(None, "engine", urls),
        lambda: validate_numbers(1.0, 0, 1, 1, None, "gsm8k_cot", "engine", "strict-match"),
        lambda: validate_numbers(-1, None, 1, 1, None, "gsm8k_cot", "engine", "strict-match"),
        lambda: validate_numbers(float("nan"), None, 1, 1, None, "gsm8k_cot", "engine", "strict-match"),
        lambda: validate_numbers(float("inf"), None, 1, 1, None, "gsm8k_cot", "engine", "strict-match"),
        lambda: validate_numbers(1.0, None, 1, 1, None, "mmlu", "engine", "strict-match"),
        lambda: completions_url("localhost:8000"),
    ):
        with pytest.raises(UsageError):
            bad()
    assert completions_url("http://h:8/") == "http://h:8/v1/completions"
    assert completions_url("http://h:8/v1") == "http://h:8/v1/completions"
    assert completions_url("http://h:8/v1/completions") == "http://h:8/v1/completions"
