"""`rltbench serve` in-process for tests: a server on 127.0.0.1 (free port) in a background thread with its
own event loop, plus small stdlib HTTP helpers (no client library between the test and the wire)."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from rltbench.server.metrics import parse_text
from rltbench.server.server import Built, ServeOptions, build, serve_forever

TINY = dict(model="ouro-tiny", weights="random", dtype="float32", device="cpu", port=0)


class InProcessServer:
    """Start on enter, stop (like SIGTERM) on exit; `final_stats` is the engine's stats after shutdown."""

    def __init__(self, built: Built | None = None, **opts: Any) -> None:
        self.built = built or build(ServeOptions(**{**TINY, **opts}))
        self.app = self.built.app
        self.lines: list[str] = []
        self.port: int | None = None
        self.final_stats: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def main() -> None:
            self._stop = asyncio.Event()
            self.final_stats = await serve_forever(
                self.built,
                "127.0.0.1",
                0,
                stop=self._stop,
                on_ready=self._on_ready,
                install_signals=False,
                log=self.lines.append,
            )

        try:
            self._loop.run_until_complete(main())
        except BaseException as exc:  # surfaced by __enter__ / close
            self.error = exc
            self._ready.set()
        finally:
            self._loop.close()

    def _on_ready(self, port: int) -> None:
        self.port = port
        self._ready.set()

    def __enter__(self) -> InProcessServer:
        self._thread.start()
        if not self._ready.wait(120) or self.error is not None:
            raise RuntimeError(f"server did not start: {self.error!r}; log {self.lines}")
        return self

    def close(self) -> dict[str, Any]:
        if self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        assert not self._thread.is_alive(), "server thread did not stop"
        return self.final_stats or {}

    def __exit__(self, *exc: Any) -> None:
        self.close()


def request(
    url: str, path: str, body: Any = None, method: str | None = None, timeout: float = 60
) -> tuple[int, dict[str, str], Any]:
    """(status, headers, JSON or text) of one request; `body` bytes are sent as they are."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url + path,
        data=data,
        method=method or ("POST" if data is not None else "GET"),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, headers, raw = resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        status, headers, raw = err.code, dict(err.headers), err.read()
    text = raw.decode()
    try:
        return status, headers, json.loads(text)
    except ValueError:
        return status, headers, text


def sse(url: str, path: str, body: dict[str, Any], timeout: float = 60) -> list[Any]:
    """The `data:` payloads of a streamed response (JSON objects, then the string '[DONE]')."""
    status, headers, text = request(url, path, body, timeout=timeout)
    assert status == 200, text
    assert headers["Content-Type"].startswith("text/event-stream")
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            payload = line[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


class OpenStream:
    """A streaming request held open on a raw socket; `close()` disconnects mid-stream."""

    def __init__(self, url: str, path: str, body: dict[str, Any]) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()

    def next_event(self) -> Any:
        while True:
            line = self.resp.readline()
            if not line:
                return None
            line = line.decode().strip()
            if line.startswith("data: "):
                payload = line[6:]
                return payload if payload == "[DONE]" else json.loads(payload)

    def close(self) -> None:
        self.conn.sock.close()
        self.conn.close()


def metrics(url: str) -> dict[str, float]:
    """/metrics as {'name{labels without model_name}': value}; fails on anything not Prometheus text."""
    status, headers, text = request(url, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return parse_text(text)


def wait_for(cond: Any, timeout: float = 20.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def all_blocks_free(url: str) -> bool:
    m = metrics(url)
    return (
        m["rltbench_kv_blocks_free"] == m["rltbench_kv_blocks_total"]
        and m["rltbench_requests_running"] == 0
        and m["rltbench_requests_waiting"] == 0
    )
