"""Questions in, answers out, for one arm: lm-eval's text prompts and stop strings turned into backend
requests (rltbench.backends) and the records turned back into answers.

Each answer is the generated text cut at the first stop string (what lm-eval's own HF model returns),
with the generated token ids / count. On the engine, prompts are encoded with the run's codec; the
model's EOS ids and every stop string that is a single token become engine stop ids, the other stop
strings are checked on the decoded tail after each step and the request is aborted as soon as one
appears (so a request costs no decode steps after its stop); prompts longer than the context budget
keep their last tokens (lm-eval's left truncation) and are counted. On a server, the text and the stop
strings are sent as they are; token ids are not part of the OpenAI API, so sequences are compared by
text and the token count is the server's usage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from rltbench.backends.base import Request
from rltbench.errors import UsageError
from rltbench.textcodec import TextCodec


@dataclass
class Generation:
    """One request's result. `text` is cut before the first stop string."""

    text: str
    num_tokens: int
    token_ids: list[int] | None = None
    finish_reason: str = "length"  # "stop" (eos/stop id), "stop_str", "length"
    prompt_tokens: int = 0
    truncated_prompt: bool = False


@dataclass
class BackendStats:
    """What one arm's prompts and generation cost over the run (arms.json)."""

    prompt_tokens: int = 0
    truncated_prompts: int = 0
    seconds: float = 0.0

    def account(self, gens: list[Generation], seconds: float) -> None:
        self.prompt_tokens += sum(g.prompt_tokens for g in gens)
        self.truncated_prompts += sum(1 for g in gens if g.truncated_prompt)
        self.seconds += seconds


class GenerationSource(Protocol):
    """What lm-eval's model class generates through: one arm's answers to a list of questions."""

    stats: BackendStats

    def generate(
        self, prompts: list[str], until: list[list[str]], max_gen_toks: list[int]
    ) -> list[Generation]: ...


def cut_at_stop(text: str, until: list[str]) -> tuple[str, bool]:
    """Text before the earliest stop string (lm-eval's `s.split(term)[0]` for every term)."""
    cut = len(text)
    for term in until:
        if term:
            i = text.find(term)
            if 0 <= i < cut:
                cut = i
    return text[:cut], cut < len(text)


class QuestionCodec:
    """How questions reach one backend: token ids through `codec` (the engine) or text (a server)."""

    def __init__(self, codec: TextCodec | None = None, model_eos: tuple[int, ...] = (), max_context: int = 0):
        self.codec = codec
        self.model_eos = tuple(model_eos)
        self.max_context = int(max_context)

    def _prompt_ids(self, prompt: str, max_new: int) -> tuple[list[int], bool]:
        assert self.codec is not None
        ids = self.codec.encode(prompt)
        budget = self.max_context - max_new
        if budget < 1:
            raise UsageError(
                f"--max-gen-toks {max_new} leaves no room for a prompt in a context of "
                f"{self.max_context} tokens"
            )
        if len(ids) > budget:
            return ids[-budget:], True
        return ids, False

    def requests(self, prompts: list[str], until: list[list[str]],
                 max_new: list[int]) -> tuple[list[Request], list[bool]]:
        """One greedy request per prompt, stopping at EOS, a stop id or a stop string; and which
        prompts were left-truncated."""
        if self.codec is None:
            texts = [
                Request(index=i, prompt=p, output_len=int(m), ignore_eos=False, stop=tuple(s for s in u if s))
                for i, (p, u, m) in enumerate(zip(prompts, until, max_new, strict=True))
            ]
            return texts, [False] * len(prompts)
        out, truncated = [], []
        for i, (p, u, m) in enumerate(zip(prompts, until, max_new, strict=True)):
            ids, cut = self._prompt_ids(p, int(m))
            out.append(Request(index=i, prompt=ids, output_len=int(m), ignore_eos=False,
                               stop=tuple(s for s in u if s and self.codec.token_id(s) is None),
                               stop_token_ids=tuple(self.codec.stop_token_ids(u, self.model_eos))))
            truncated.append(cut)
        return out, truncated

    def generations(self, arm: str, reqs: list[Request], truncated: list[bool], recs: list[dict[str, Any]],
                    until: list[list[str]]) -> list[Generation]:
        """The answers of finished records (a failed request fails the run: its answer is unknown)."""
        gens = []
        for i, (req, rec) in enumerate(zip(reqs, recs, strict=True)):
            if rec["status"] != "ok":
                raise UsageError(f"arm {arm}: question {i} failed: {rec.get('error')}")
            reason = rec.get("finish_reason") or "length"
            if self.codec is None:
                text, _ = cut_at_stop(rec.get("text") or "", until[i])
                n = rec["n_tokens"] if rec.get("token_ids") is None else len(rec["token_ids"])
                gens.append(Generation(text=text, num_tokens=int(n), token_ids=None,
                                       finish_reason="stop_str" if reason == "stop" else reason,
                                       prompt_tokens=int(rec.get("prompt_tokens") or 0)))
                continue
            outs = list(rec["token_ids"])
            reason = reason if reason in ("stop", "stop_str") else "length"
            # the stopping token (EOS / single-token stop string) is not part of the answer text
            body = outs[:-1] if reason == "stop" and outs and outs[-1] in req.stop_token_ids else outs
            text, _ = cut_at_stop(self.codec.decode(body), until[i])
            gens.append(Generation(text=text, num_tokens=len(outs), token_ids=outs, finish_reason=reason,
                                   prompt_tokens=len(req.prompt), truncated_prompt=truncated[i]))
        return gens
