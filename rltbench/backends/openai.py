"""OpenAI-compatible backend: streaming `/v1/completions`, one server per arm.

Works against vLLM, SGLang or any server that follows the completions API. Load requests send `prompt`
as a list of token ids and ask for exactly `max_tokens` (`ignore_eos`); text requests (the quality
gate) send text with their `stop` strings. Every request is greedy (temperature 0) and streamed, with
usage in the last chunk and, where the server accepts them, vLLM's `return_token_ids`. The generated ids
are taken from `token_ids` or from `logprobs.tokens` written as `token_id:N`; otherwise tokens are
counted as one per streamed text event and N comes from the server's usage (identity by ids is then
unavailable). If the server rejects the optional fields with HTTP 400 during warm-up they are dropped
(and noted).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from rltbench.backends.base import (
    CellProgress,
    CellResult,
    DeadlineReached,
    Request,
    Timeouts,
    finalize,
    new_record,
)
from rltbench.errors import UsageError

# Optional request fields, dropped in this order when a server answers HTTP 400 to the warm-up probe.
EXTRA_FIELDS = ("return_token_ids", "ignore_eos", "stream_options")


def _token_ids_of(choice: dict[str, Any]) -> list[int] | None:
    ids = choice.get("token_ids")
    if isinstance(ids, list):
        return [int(t) for t in ids]
    lp = choice.get("logprobs")
    toks = lp.get("tokens") if isinstance(lp, dict) else None
    if (
        isinstance(toks, list)
        and toks
        and all(isinstance(t, str) and t.startswith("token_id:") for t in toks)
    ):
        return [int(t.split(":", 1)[1]) for t in toks]
    return None


class _Turns:
    """The later turns of a cell's conversations on the client: a request with `after` waits until its
    previous turn (in the cell) ended, then `think` seconds (backends.base.SendOrder's rule)."""

    def __init__(self, requests: Sequence[Request]):
        present = {r.index for r in requests}
        self._waited = {r.after for r in requests if r.after is not None and r.after in present}
        self._done = {i: asyncio.Event() for i in self._waited}
        self._end: dict[int, float] = {}

    def waits(self, req: Request) -> bool:
        return req.after is not None and req.after in self._done and req.after != req.index

    async def previous_end(self, req: Request) -> float:
        assert req.after is not None
        await self._done[req.after].wait()
        return self._end[req.after]

    def ended(self, index: int, rec: dict[str, Any]) -> None:
        """Request `index` is over: its last token's time, or now where it failed or was cancelled."""
        if index in self._done and not self._done[index].is_set():
            ok = rec.get("status") is None and rec.get("last") is not None
            self._end[index] = rec["last"] if ok else time.perf_counter()
            self._done[index].set()


class OpenAIBackend:
    """Runs cells against OpenAI-compatible servers with aiohttp (one arm per server)."""

    name = "openai"
    hosting = "one server per arm (OpenAI-compatible /v1/completions); arms run one at a time in the schedule"
    supports_replay = False

    def __init__(self, urls: dict[str, str], model_name: str | None = None):
        self.urls = urls
        self.arms = list(urls)
        self.model_name = model_name
        self.models: dict[str, str] = {}
        self.extras: dict[str, dict[str, Any]] = {
            a: {"return_token_ids": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
            for a in urls
        }
        self.notes: dict[str, Any] = {}

    # -- public API (base.Backend) -----------------------------------------------------------------
    def stats(self, arm: str | None = None) -> dict[str, Any]:
        return {}

    def warmup(self, arm: str, requests: Sequence[Request], timeouts: Timeouts) -> None:
        """Find the served model name, negotiate the extra fields, run a small warm-up burst."""
        asyncio.run(self._warmup(arm, requests, timeouts))

    def run_cell(self, arm: str, tag: str, requests: Sequence[Request], timeouts: Timeouts,
                 progress: CellProgress | None = None, max_concurrency: int | None = None,
                 **_engine_only: Any) -> CellResult:
        """Serve `requests` (each sent at cell start + arrival, held back while `max_concurrency`
        are in flight); one record per request (a server gives no schedule or cold work). The
        engine's options (prefix-cache reset, timed window, step hook) do not exist here: the server's
        prefix cache cannot be reset through this API (the session report says so)."""
        return CellResult(asyncio.run(self._run_cell(arm, tag, requests, timeouts, progress or CellProgress(),
                                                     max_concurrency)))

    # -- internals ---------------------------------------------------------------------------------
    def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )

    async def _warmup(self, arm: str, requests: Sequence[Request], timeouts: Timeouts) -> None:
        async with self._session() as sess:
            if arm not in self.models:
                self.models[arm] = self.model_name or await self._served_model(sess, arm)
            first = requests[0] if requests else Request(index=0, prompt=[1, 2, 3], output_len=2)
            probe = dataclasses.replace(first, index=0, output_len=2, arrival=0.0)
            kind = "text" if isinstance(probe.prompt, str) else "token-id"
            error = ""
            for n_drop in range(len(EXTRA_FIELDS) + 1):
                for key in EXTRA_FIELDS[:n_drop]:
                    self.extras[arm].pop(key, None)
                async with sess.post(
                    self.urls[arm] + "/v1/completions", json=self._payload(arm, probe)
                ) as resp:
                    body = await resp.text()
                    if resp.status != 400:
                        break
                    error = body[:200]
            else:
                raise UsageError(
                    f"--arm {arm}: {self.urls[arm]} rejects streaming {kind} completions: {error}"
                )
            self.notes[arm] = {"model": self.models[arm], "extra_fields": sorted(self.extras[arm])}
        if requests:
            await self._run_cell(arm, "warmup", requests, timeouts.without_deadline(), CellProgress())

    async def _served_model(self, sess: Any, arm: str) -> str:
        try:
            async with sess.get(self.urls[arm] + "/v1/models") as resp:
                data = await resp.json(content_type=None)
            return str(data["data"][0]["id"])
        except Exception as exc:
            raise UsageError(
                f"--arm {arm}: cannot list models at {self.urls[arm]}/v1/models ({exc}); "
                "give --served-model-name"
            ) from None

    def _payload(self, arm: str, req: Request) -> dict[str, Any]:
        body = {
            "model": self.models.get(arm, self.model_name or ""),
            "prompt": req.prompt if isinstance(req.prompt, str) else list(req.prompt),
            "max_tokens": req.output_len,
            "temperature": 0.0,
            "stream": True,
            **self.extras[arm],
        }
        if not req.ignore_eos:
            body.pop("ignore_eos", None)
        if req.stop:
            body["stop"] = list(req.stop)
        return body

    async def _run_cell(
        self, arm: str, tag: str, requests: Sequence[Request], timeouts: Timeouts, prog: CellProgress,
        max_concurrency: int | None = None,
    ) -> list[dict[str, Any]]:
        prog.total, prog.start = len(requests), time.perf_counter()
        t0 = prog.start
        recs = [new_record(r, f"{arm}/{tag}/{r.index}", t0 + r.arrival) for r in requests]
        slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        turns = _Turns(requests)
        async with self._session() as sess:
            tasks = [
                asyncio.ensure_future(self._one(sess, arm, req, rec, timeouts, prog, slots, turns))
                for req, rec in zip(requests, recs, strict=False)
            ]
            remaining = (
                None if timeouts.deadline is None else max(0.0, timeouts.deadline - time.perf_counter())
            )
            _, pending = await asyncio.wait(tasks, timeout=remaining)
            if pending:
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                for t, rec in zip(tasks, recs, strict=False):
                    if t in pending:
                        rec.update(status="timeout", error="global deadline reached")
                raise DeadlineReached([finalize(r) for r in recs])
        return [finalize(r) for r in recs]

    async def _one(
        self, sess: Any, arm: str, req: Request, rec: dict[str, Any], timeouts: Timeouts, prog: CellProgress,
        slots: asyncio.Semaphore | None = None, turns: _Turns | None = None,
    ) -> None:
        try:
            if turns is not None and turns.waits(req):  # a later turn: think time after the previous one
                rec["scheduled"] = rec["send"] = await turns.previous_end(req) + req.think
            delay = rec["scheduled"] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if slots is None:
                await self._send(sess, arm, req, rec, timeouts, prog)
                return
            async with slots:  # the concurrency limit: wait here (client-side queue) for a free slot
                await self._send(sess, arm, req, rec, timeouts, prog)
        finally:
            if turns is not None:
                turns.ended(req.index, rec)

    async def _send(
        self, sess: Any, arm: str, req: Request, rec: dict[str, Any], timeouts: Timeouts, prog: CellProgress
    ) -> None:
        rec["send"] = time.perf_counter()
        text = isinstance(req.prompt, str)
        if text:
            rec["text"] = ""
        usage_n: int | None = None
        ids_missing = False
        try:
            async with sess.post(self.urls[arm] + "/v1/completions", json=self._payload(arm, req)) as resp:
                if resp.status != 200:
                    body = (await resp.text())[:200]
                    rec.update(status="error", error=f"HTTP {resp.status}: {body}")
                    return
                while True:
                    limit = timeouts.first_token if rec["first"] is None else timeouts.stall
                    line = await asyncio.wait_for(resp.content.readline(), timeout=limit)
                    if not line:
                        break
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    now = time.perf_counter()
                    chunk = json.loads(data)
                    usage = chunk.get("usage")
                    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                        usage_n = int(usage["completion_tokens"])
                        if usage.get("prompt_tokens") is not None:
                            rec["prompt_tokens"] = int(usage["prompt_tokens"])
                        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                        if cached is not None:  # the server's prefix cache, where it says (vLLM, rltbench)
                            rec["prefix_hit_tokens"] = int(cached)
                    for choice in chunk.get("choices") or []:
                        if choice.get("finish_reason"):
                            rec["finish_reason"] = choice["finish_reason"]
                        if text:
                            rec["text"] += choice.get("text") or ""
                        ids = _token_ids_of(choice)
                        if ids is None:
                            k = 1 if choice.get("text") else 0
                            ids_missing = ids_missing or k == 1
                        else:
                            k = len(ids)
                            rec["token_ids"].extend(ids)
                        if k == 0:
                            continue
                        if rec["first"] is None:
                            rec["first"] = now
                            prog.ttfts.append(now - rec["send"])
                        rec["last"] = now
                        rec["event_times"].append(now)
                        rec["event_tokens"].append(k)
                        prog.tokens += k
        except asyncio.TimeoutError:
            what = "first token" if rec["first"] is None else "next token"
            rec.update(status="timeout", error=f"no {what} within the timeout")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # connection reset, bad JSON...: this request fails, the cell goes on
            rec.update(status="error", error=f"{type(exc).__name__}: {exc}"[:300])
        finally:
            if ids_missing:
                rec["token_ids"] = None
                rec["n_tokens"] = usage_n if usage_n is not None else int(sum(rec["event_tokens"]))
            prog.done += 1
            prog.errors += rec["status"] is not None
