"""The lm-eval model class: lm-eval builds the prompts and scores; we only generate, greedily.

`RltbenchLM` implements `generate_until` over one arm's backend (engine or OpenAI server) and
keeps, per request, the generated token ids and counts keyed by lm-eval's doc id, so the paired
comparison can say which sequences differ at all. Loglikelihood requests are not supported (the
GSM8K tasks are generate-only).
"""

from __future__ import annotations

import time
from typing import Any

from rltbench.commands.gsm8k.generation import Generation, GenerationSource
from rltbench.commands.gsm8k.tasks import import_lm_eval

import_lm_eval()
from lm_eval.api.model import LM  # noqa: E402


class RltbenchLM(LM):
    """lm-eval LM over a generation backend for one arm.

    Every request is generated greedily regardless of its gen_kwargs' sampling fields (the gate is
    defined for greedy decoding); `until` and `max_gen_toks` from the request are honoured, the
    latter defaulting to the command's --max-gen-toks.
    """

    def __init__(self, backend: GenerationSource, max_gen_toks: int = 256, tokenizer_name: str = "rltbench"):
        super().__init__()
        self.backend = backend
        self.max_gen_toks = int(max_gen_toks)
        self._tokenizer_name = tokenizer_name
        self.records: dict[int, Generation] = {}
        self.generate_seconds = 0.0

    @property
    def tokenizer_name(self) -> str:
        return self._tokenizer_name

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
        raise NotImplementedError("rltbench gsm8k only generates (generate_until)")

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
        raise NotImplementedError("rltbench gsm8k only generates (generate_until)")

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        prompts: list[str] = []
        until: list[list[str]] = []
        max_new: list[int] = []
        for req in requests:
            context, gen_kwargs = req.args
            kw = dict(gen_kwargs or {})
            stops = kw.get("until") or []
            until.append([stops] if isinstance(stops, str) else [str(s) for s in stops])
            max_new.append(int(kw.get("max_gen_toks", self.max_gen_toks)))
            prompts.append(context)
        t0 = time.perf_counter()
        gens = self.backend.generate(prompts, until, max_new)
        self.generate_seconds += time.perf_counter() - t0
        for i, (req, gen) in enumerate(zip(requests, gens, strict=True)):
            doc_id = getattr(req, "doc_id", None)
            self.records[int(doc_id) if doc_id is not None else i] = gen
        return [g.text for g in gens]
