"""Greedy generation backends for one arm: the rltbench engine (token ids) or an OpenAI server (text).

Both take the task's text prompts and stop strings and return, per prompt, the text cut at the
first stop string (what lm-eval's own HF model returns), plus the generated token ids / count.

Engine backend: prompts are encoded, all requests are queued at once and the engine batches them
(continuous batching, at most `max_num_seqs` = --batch-size running). Stopping: the model's EOS ids
and every stop string that is a single token are engine stop ids; the other stop strings are
checked on the decoded tail after each step and the request is aborted as soon as one appears (so
a request costs no decode steps after its stop). Prompts longer than the context budget keep their
last tokens (lm-eval's left truncation) and are counted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

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
    requests: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    truncated_prompts: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    arm: str
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


class EngineBackend:
    """Greedy batched generation through `rltbench.engine.Engine` for one arm (already selected)."""

    def __init__(
        self,
        engine: Any,
        codec: TextCodec,
        arm: str,
        model_eos: tuple[int, ...],
        max_context: int,
        progress: Callable[[int, int], None] | None = None,
    ):
        self.engine = engine
        self.codec = codec
        self.arm = arm
        self.model_eos = tuple(model_eos)
        self.max_context = int(max_context)
        self.progress = progress
        self.stats = BackendStats()
        # the last generate call's requests, id -> (prompt ids, max tokens): what a replay needs
        self.last_requests: dict[str, tuple[list[int], int]] = {}

    def _prompt_ids(self, prompt: str, max_new: int) -> tuple[list[int], bool]:
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

    def generate(
        self, prompts: list[str], until: list[list[str]], max_gen_toks: list[int]
    ) -> list[Generation]:
        from rltbench.engine import SamplingParams

        n = len(prompts)
        outs: list[list[int]] = [[] for _ in range(n)]
        reasons: list[str] = ["length"] * n
        done = [False] * n
        rid_to_idx: dict[str, int] = {}
        # A stop string of L characters spans at most 4L byte-level tokens: decode only that tail.
        tail_len = [4 * max((len(s) for s in u), default=0) + 4 for u in until]
        text_stops = [[s for s in u if s and self.codec.token_id(s) is None] for u in until]
        meta: list[tuple[int, bool]] = []
        stop_ids = [self.codec.stop_token_ids(u, self.model_eos) for u in until]
        self.last_requests = {}
        t0 = time.perf_counter()
        for i, prompt in enumerate(prompts):
            ids, truncated = self._prompt_ids(prompt, max_gen_toks[i])
            meta.append((len(ids), truncated))
            params = SamplingParams(
                max_tokens=int(max_gen_toks[i]), ignore_eos=False, stop_token_ids=stop_ids[i]
            )
            rid = f"{self.arm}-{i}"
            self.last_requests[rid] = (ids, int(max_gen_toks[i]))
            try:
                self.engine.add_request(rid, ids, params)
            except ValueError as exc:  # EngineRequestError
                raise UsageError(f"request {i} rejected by the engine: {exc}") from None
            rid_to_idx[rid] = i
        finished = 0
        while self.engine.has_unfinished():
            for ev in self.engine.step():
                i = rid_to_idx[ev.request_id]
                if done[i]:
                    continue
                outs[i].extend(int(t) for t in ev.token_ids)
                if ev.finished:
                    done[i] = True
                    reasons[i] = "stop" if ev.finish_reason == "stop" else "length"
                elif text_stops[i]:
                    tail = self.codec.decode(outs[i][-(tail_len[i] + len(ev.token_ids)) :])
                    if any(s in tail for s in text_stops[i]):
                        self.engine.abort_request(ev.request_id)
                        done[i] = True
                        reasons[i] = "stop_str"
                if done[i]:
                    finished += 1
                    if self.progress is not None:
                        self.progress(finished, n)
        elapsed = time.perf_counter() - t0
        gens = []
        for i in range(n):
            # The stopping token (EOS / single-token stop string) is not part of the answer text.
            body = (
                outs[i][:-1] if reasons[i] == "stop" and outs[i] and outs[i][-1] in stop_ids[i] else outs[i]
            )
            text, _ = cut_at_stop(self.codec.decode(body), until[i])
            gens.append(
                Generation(
                    text=text,
                    num_tokens=len(outs[i]),
                    token_ids=outs[i],
                    finish_reason=reasons[i],
                    prompt_tokens=meta[i][0],
                    truncated_prompt=meta[i][1],
                )
            )
        self._account(gens, elapsed)
        return gens

    def _account(self, gens: list[Generation], elapsed: float) -> None:
        st = self.stats
        st.requests += len(gens)
        st.generated_tokens += sum(g.num_tokens for g in gens)
        st.prompt_tokens += sum(g.prompt_tokens for g in gens)
        st.truncated_prompts += sum(1 for g in gens if g.truncated_prompt)
        st.seconds += elapsed


def completions_url(url: str) -> str:
    """Normalise `--arm NAME=URL`: a server root, a `/v1` base or the full completions endpoint."""
    u = url.rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise UsageError(f"--arm URL must start with http:// or https://: {url}")
    if u.endswith("/completions"):
        return u
    if u.endswith("/v1"):
        return u + "/completions"
    return u + "/v1/completions"


class OpenAIBackend:
    """Greedy completions from an OpenAI-compatible server (e.g. vLLM serving one arm).

    Text prompts, temperature 0, the task's stop strings, max_tokens; `batch_size` requests in
    flight. Token ids are not part of the OpenAI API: sequences are compared by text and the token
    count is the server's `usage.completion_tokens`.
    """

    def __init__(self, arm: str, url: str, model: str | None, batch_size: int, timeout_s: float = 600.0):
        self.arm = arm
        self.url = completions_url(url)
        self.model = model
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.stats = BackendStats()

    async def _served_model(self, session: Any) -> str | None:
        models_url = self.url.rsplit("/completions", 1)[0] + "/models"
        try:
            async with session.get(models_url) as resp:
                if resp.status == 200:
                    data = await resp.json()
                    items = data.get("data") or []
                    if items:
                        return str(items[0]["id"])
        except Exception:
            return None
        return None

    async def _run(
        self, prompts: list[str], until: list[list[str]], max_gen_toks: list[int]
    ) -> list[Generation]:
        import aiohttp

        sem = asyncio.Semaphore(self.batch_size)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            model = self.model or await self._served_model(session)

            async def one(i: int) -> Generation:
                body: dict[str, Any] = {
                    "prompt": prompts[i],
                    "max_tokens": int(max_gen_toks[i]),
                    "temperature": 0.0,
                    "top_p": 1.0,
                    "stop": [s for s in until[i] if s],
                }
                if model:
                    body["model"] = model
                async with sem:
                    try:
                        async with session.post(self.url, json=body) as resp:
                            if resp.status != 200:
                                detail = (await resp.text())[:200]
                                raise UsageError(
                                    f"arm {self.arm}: {self.url} answered {resp.status}: {detail}"
                                )
                            data = await resp.json()
                    except aiohttp.ClientError as exc:
                        raise UsageError(f"arm {self.arm}: cannot reach {self.url}: {exc}") from None
                choice = data["choices"][0]
                text, _ = cut_at_stop(choice.get("text", ""), until[i])
                usage = data.get("usage") or {}
                reason = choice.get("finish_reason") or "length"
                return Generation(
                    text=text,
                    num_tokens=int(usage.get("completion_tokens", 0)),
                    token_ids=None,
                    finish_reason="stop_str" if reason == "stop" else reason,
                    prompt_tokens=int(usage.get("prompt_tokens", 0)),
                )

            return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))

    def generate(
        self, prompts: list[str], until: list[list[str]], max_gen_toks: list[int]
    ) -> list[Generation]:
        t0 = time.perf_counter()
        gens = asyncio.run(self._run(prompts, until, max_gen_toks))
        elapsed = time.perf_counter() - t0
        st = self.stats
        st.requests += len(gens)
        st.generated_tokens += sum(g.num_tokens for g in gens)
        st.prompt_tokens += sum(g.prompt_tokens for g in gens)
        st.seconds += elapsed
        return gens
