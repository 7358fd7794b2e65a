"""A captured decode step over fake sequences, for the profile/e2e commands and the GPU script.

The benchmark drives the engine's runner (rltbench.engine.runner.ModelRunner): it borrows its static
metadata buffers and `batch_size * ceil((context_len+1) /
block_size)` pool blocks; each row is a sequence with `context_len` cached tokens decoding the token at
position `context_len` (seq_len = context_len + 1). The KV contents are whatever the pool holds (zeros
or stale finite values): attention cost does not depend on them. The engine serves no request while a
benchmark is active; `release()` returns the blocks.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from rltbench.bench.timing import time_calls
from rltbench.engine.engine import Engine
from rltbench.errors import UsageError
from rltbench.results.quantiles import summarize


class DecodeBenchmark:
    """`.replay()` runs one decode step (graph replay, or eager when graphs are unavailable),
    `.graph` is the torch.cuda.CUDAGraph (None when eager), `.time_ms()` times replays."""

    def __init__(self, engine: Engine, batch_size: int, context_len: int) -> None:
        if batch_size < 1 or context_len < 0:
            raise UsageError("decode_benchmark: batch_size must be >= 1 and context_len >= 0")
        runner = engine.runner
        if engine.has_unfinished() or runner.synthetic_decode_active:
            raise UsageError("decode_benchmark needs an idle engine (no requests, no other benchmark)")
        if context_len + 1 > engine.max_model_len:
            raise UsageError(
                f"decode_benchmark: context {context_len} + 1 exceeds max_model_len {engine.max_model_len}"
            )
        bs = engine.config.block_size
        per_seq = -(-(context_len + 1) // bs)
        if batch_size * per_seq > engine.blocks.num_free_blocks:
            raise UsageError(
                f"decode_benchmark: {batch_size} x {context_len} tokens need {batch_size * per_seq} "
                f"KV blocks, {engine.blocks.num_free_blocks} are free"
            )
        bucket = runner.graph_bucket(batch_size) if runner.use_graphs else None
        if runner.use_graphs and bucket is None:
            raise UsageError(
                f"decode_benchmark: batch {batch_size} exceeds the largest graph bucket {max(runner.buckets)}"
            )
        self.engine = engine
        self.batch_size = batch_size
        self.context_len = context_len
        self.rows = bucket or batch_size
        self.tables = [engine.blocks.allocate([], per_seq) for _ in range(batch_size)]
        runner.open_synthetic_decode(self.tables, context_len, self.rows)
        self.len_class = runner.len_class(context_len + 1) if bucket else runner.eager_len(context_len + 1)
        self.graph: torch.cuda.CUDAGraph | None = None
        self._out: torch.Tensor | None = None
        if bucket is not None:
            self.graph, self._out = runner.decode_graph(bucket, self.len_class)
        self._released = False

    def replay(self) -> None:
        if self._released:
            raise RuntimeError("decode benchmark already released")
        if self.graph is not None:
            self.graph.replay()
        else:
            self._out = self.engine.runner.decode_eager(self.rows, self.len_class)

    @property
    def output(self) -> torch.Tensor | None:
        """Argmax ids of the last replay, [rows] (padding rows included)."""
        return self._out

    def time_ms(self, iters: int = 100, warmup: int = 10) -> dict[str, Any]:
        """CUDA events around each replay (perf_counter on CPU); median/p10/p90/n (and the samples)
        over `iters`."""
        for _ in range(warmup):
            self.replay()
        cuda = self.engine.device.type == "cuda"
        samples: list[float] = []
        if cuda:
            torch.cuda.synchronize(self.engine.device)
            samples = time_calls(self.replay, iters, device=self.engine.device)
        else:
            for _ in range(iters):
                t0 = time.perf_counter()
                self.replay()
                samples.append((time.perf_counter() - t0) * 1e3)
        q = summarize(samples)
        return dict(median=q.median, p10=q.p10, p90=q.p90, n=q.n, samples=samples)

    def release(self) -> None:
        """Return the blocks and hand the static buffers back to the engine (idempotent)."""
        if self._released:
            return
        for t in self.tables:
            self.engine.blocks.free(t)
        self.tables = []
        self._released = True
        self.engine.runner.close_synthetic_decode()

    def __enter__(self) -> DecodeBenchmark:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
