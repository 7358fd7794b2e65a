"""`rltbench serve` as a process: the ready line, SIGTERM with a request in flight and SIGINT idle both
exit 0 with every KV block accounted for; bad options exit 2 before any model work."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading

import pytest
from serve_fixtures import OpenStream

from rltbench.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ServeProcess:
    def __init__(self, *args: str) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rltbench.cli",
                "serve",
                "--model",
                "ouro-tiny",
                "--dtype",
                "float32",
                "--device",
                "cpu",
                "--port",
                "0",
                *args,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.log.append(line.rstrip())
            self.lines.put(line)

    def wait_ready(self, timeout: float = 90) -> str:
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(f"no ready line: {self.log}") from None
            m = re.search(r"ready on (http://127\.0\.0\.1:\d+)", line)
            if m:
                return m.group(1)

    def finish(self, sig: int) -> tuple[int, str]:
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        return rc, "\n".join(self.log)


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)], ids=["SIGTERM", "SIGINT"]
)
def test_signal_with_request_in_flight_returns_every_block(sig):
    srv = ServeProcess("--kv-cache-gib", "0.01")
    url = srv.wait_ready()
    stream = OpenStream(
        url,
        "/v1/completions",
        {"prompt": [1, 2, 3, 4, 5], "max_tokens": 500, "ignore_eos": True, "stream": True},
    )
    assert stream.next_event()["choices"]
    rc, log = srv.finish(sig)
    events = []
    while (ev := stream.next_event()) is not None:
        events.append(ev)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "shutting_down", events[-3:]
    assert rc == 0, log
    m = re.search(r"KV blocks at shutdown: (\d+)/(\d+) free, 0 in use", log)
    assert m and m.group(1) == m.group(2), log


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--arm", "torch,exact"], "one arm per server"),
        (["--arm", "fancy"], "unknown arm 'fancy'"),
        (["--port", "70000"], "--port must be an integer in [0, 65535], got 70000"),
        (["--tokenizer", "/nonexistent/tok.json"], "no such file"),
        (["--max-queue", "-1"], "--max-queue"),
        (["--weights", "/nonexistent/ckpt"], "not a checkpoint directory"),
        (["--max-model-len", "1024"], "exceeds the model's context 512"),
        (["--warmup-prefill-len", "600"], "must be < --max-model-len 512"),
        (["--warmup-prefill-len", "1x"], "'1x' is not an integer"),
    ],
)
def test_bad_options_exit_2(args, fragment, capsys):
    assert main(["serve", "--model", "ouro-tiny", "--device", "cpu", *args]) == 2
    assert fragment in capsys.readouterr().err
