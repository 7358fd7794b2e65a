"""HTTP routes of `rltbench serve` (aiohttp.web): OpenAI completions and chat completions, streaming
or not, plus /v1/models, /health and /metrics.

A generation handler validates the body (protocol.py), checks capacity, submits the request to the
engine loop and waits for its first item before answering, so a request the engine refuses still
gets a proper 4xx and a shutdown before the first token a 503. Then it streams one SSE chunk per
engine event (`data: {...}` lines, `data: [DONE]` last) or collects the whole answer. Whatever ends
the handler (finished, stop string found, client gone, write failed, cancelled), `finally` aborts the
request in the engine if it is still live, so its KV blocks are always returned.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from rltbench.server.loop import EngineLoop, Failure
from rltbench.server.metrics import ServerMetrics
from rltbench.server.protocol import (
    ApiError,
    GenRequest,
    ResponseShape,
    ServedModel,
    parse_request,
    usage,
)
from rltbench.server.textstream import TextStream

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
SSE_DONE = b"data: [DONE]\n\n"
MAX_BODY_BYTES = 16 * 2**20  # a 64k-token id prompt is ~0.5 MB of JSON


def error_response(err: ApiError) -> web.Response:
    return web.json_response(err.body(), status=err.status, headers=err.headers)


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@web.middleware
async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every error leaves as an OpenAI error body: unknown routes, wrong methods, and (logged, 500)
    anything a handler did not expect; the server itself never goes down for a request."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(
            exc.status, "http_error"
        )
        msg = f"{exc.reason}: {request.method} {request.path}"
        return error_response(ApiError(exc.status, msg, code))
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception as exc:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", "internal_error"))


@dataclass
class _Run:
    """One request's progress, as its handler sees it."""

    req: GenRequest
    arrival: float
    text: TextStream
    tokens: list[int] = field(default_factory=list)
    first: float | None = None
    last: float | None = None
    finish_reason: str | None = None
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    status: str = "aborted"  # until it ends otherwise (client gone, cancelled)
    ended: bool = False  # no longer live in the engine
    reached_engine: bool = True


class ServerApp:
    """Handlers over one engine loop; `capacity` = max live requests (running + queued) before 503."""

    def __init__(
        self, loop: EngineLoop, served: ServedModel, sampling_cls: Any, capacity: int, info: dict[str, str]
    ) -> None:
        self.loop = loop
        self.served = served
        self.sampling_cls = sampling_cls
        self.capacity = capacity
        self.info = info
        self.metrics = ServerMetrics(served.name)
        self.closing = False
        self.created = int(time.time())

    def build(self) -> web.Application:
        app = web.Application(middlewares=[json_errors], client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_text)
        return app

    # ---- small endpoints ------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.served.name,
            "object": "model",
            "created": self.created,
            "owned_by": "rltbench",
            "max_model_len": self.served.max_model_len,
            **self.info,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def health(self, request: web.Request) -> web.Response:
        if self.loop.failed is not None:
            return web.json_response({"status": "error", "message": self.loop.failed}, status=503)
        if self.closing:
            return web.json_response({"status": "shutting down"}, status=503)
        return web.json_response({"status": "ok", "model": self.served.name})

    async def metrics_text(self, request: web.Request) -> web.Response:
        stats = await self.loop.stats()
        running = self.loop.num_running
        text = self.metrics.render(stats, running, self.loop.num_live - running, self.info)
        return web.Response(
            body=text.encode(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        )

    # ---- generation -----------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _admit(self, request: web.Request, chat: bool) -> GenRequest:
        if self.closing:
            raise ApiError(503, "the server is shutting down", "shutting_down")
        raw = await request.read()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}", "invalid_json") from None
        req = parse_request(body, self.served, chat)
        if self.loop.failed is not None:
            raise ApiError(503, f"the engine is unavailable: {self.loop.failed}", "engine_error")
        if self.loop.num_live >= self.capacity:
            raise ApiError(
                503,
                f"server at capacity: {self.loop.num_live} requests running or queued "
                f"(--max-num-seqs + --max-queue = {self.capacity}); retry later",
                "server_overloaded",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        return req

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = time.perf_counter()
        try:
            req = await self._admit(request, chat)
        except ApiError as err:
            self.metrics.count_request(
                "overloaded"
                if err.code == "server_overloaded"
                else "rejected"
                if err.status < 500
                else "error"
            )
            return error_response(err)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        params = self.sampling_cls(
            max_tokens=req.max_tokens, ignore_eos=req.ignore_eos, stop_token_ids=req.stop_token_ids
        )
        run = _Run(req, arrival, TextStream(self.served.codec, req.prompt_ids, req.stop))
        q = self.loop.submit(rid, req.prompt_ids, params)
        try:
            item = await q.get()
            if isinstance(item, Failure):
                run.ended = True
                run.reached_engine = item.status >= 500
                run.status = "rejected" if item.status < 500 else "error"
                return error_response(ApiError(item.status, item.message, item.code))
            shape = ResponseShape(rid, self.served.name, req)
            if req.stream:
                return await self._stream(request, run, shape, item, q)
            return await self._collect(run, shape, item, q)
        finally:
            if not run.ended:
                self.loop.abort(rid)
            self._account(run)

    def _on_tokens(self, run: _Run, rid: str, ev: Any) -> str:
        """Record one engine event; returns the text that may be sent now. Ends the run when the
        engine finished it or a stop string appeared (then the engine request is aborted)."""
        ids = [int(t) for t in ev.token_ids]
        if run.first is None:
            run.first = ev.time
            self.metrics.ttft.observe(ev.time - run.arrival)
        elif ids:
            gap = (ev.time - run.last) / len(ids)
            for _ in ids:
                self.metrics.itl.observe(gap)
        run.last = ev.time
        run.tokens.extend(ids)
        run.cached_tokens = int(getattr(ev, "prefix_hit_tokens", 0) or 0)
        delta = run.text.add(ids, final=ev.finished, drop_last=ev.finished and ev.finish_reason == "stop")
        if ev.finished:
            run.ended, run.finish_reason, run.status = True, ev.finish_reason, "ok"
        elif run.text.stopped:
            self.loop.abort(rid)
            run.ended, run.finish_reason, run.status = True, "stop", "ok"
        return delta

    async def _collect(self, run: _Run, shape: ResponseShape, item: Any, q: asyncio.Queue) -> web.Response:
        while True:
            if isinstance(item, Failure):
                run.ended, run.status = True, "error"
                return error_response(ApiError(item.status, item.message, item.code))
            self._on_tokens(run, shape.id, item)
            if run.ended:
                break
            item = await q.get()
        return web.json_response(shape.full(run.text.text, run.tokens, run.finish_reason, self._usage(run)))

    async def _stream(
        self, request: web.Request, run: _Run, shape: ResponseShape, item: Any, q: asyncio.Queue
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            await resp.prepare(request)
            while True:
                if isinstance(item, Failure):
                    run.ended, run.status = True, "error"
                    await resp.write(_sse(ApiError(item.status, item.message, item.code).body()))
                    break
                delta = self._on_tokens(run, shape.id, item)
                live_usage = self._usage(run) if run.req.continuous_usage else None
                ids = [int(t) for t in item.token_ids]
                await resp.write(_sse(shape.chunk(delta, ids, run.finish_reason, live_usage)))
                if run.ended:
                    break
                item = await q.get()
            if run.req.include_usage and run.status == "ok":
                await resp.write(_sse(shape.usage_chunk(self._usage(run))))
            await resp.write(SSE_DONE)
            await resp.write_eof()
        except ConnectionError:  # the client went away mid-stream: `finally` of _generate aborts
            if run.status == "ok":
                return resp
            run.status = "aborted"
        return resp

    @staticmethod
    def _usage(run: _Run) -> dict[str, Any]:
        return usage(len(run.req.prompt_ids), len(run.tokens), run.cached_tokens)

    def _account(self, run: _Run) -> None:
        if not run.reached_engine:
            self.metrics.count_request(run.status)
            return
        e2e = run.last - run.arrival if run.last is not None else None
        self.metrics.finish(run.status, run.finish_reason, len(run.req.prompt_ids), len(run.tokens), e2e)
