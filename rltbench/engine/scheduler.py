"""Continuous-batching scheduler: FCFS admission limited by KV blocks, chunked prefill, decode batches.

Policy (separate prefill and decode steps, the simple choice allowed by the engine brief):
- A step is a *prefill* step whenever some admitted sequence still has prompt tokens to compute or the
  head of the waiting queue can be admitted. Its tokens come first from sequences already prefilling (in
  admission order), then from newly admitted ones, until `max_num_batched_tokens` is used; a prompt
  longer than the remaining budget is split into chunks over several steps.
- `max_prefill_seqs` (default None: no limit) caps the sequences one prefill step packs; 1 gives
  one-request-per-step prefill, the unpacked baseline that the long-prompt benchmark compares the
  packed steps against (same token budget, so a prompt longer than it is still chunked).
- Otherwise it is a *decode* step over every running sequence (one token each), in admission order.
- Admission is strictly FCFS: only the head of the queue is considered; if it does not fit (blocks or
  `max_num_seqs`) nothing behind it is admitted. Every block a request can ever need (prompt plus
  `max_tokens`, capped by max_model_len) is allocated at admission, so there is never preemption and
  a sequence's block table never changes while it runs.
Everything is ordered by deques and lists, so the same submission order gives the same batches.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from rltbench.engine.block_manager import BlockManager
from rltbench.engine.kv_capacity import blocks_for_tokens, kv_tokens_needed
from rltbench.engine.types import SamplingParams


@dataclass(eq=False)
class Sequence:
    """Engine-side state of one request."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    max_new: int  # max_tokens capped so that prompt + output fits max_model_len
    arrival_time: float
    hashes: list[bytes] = field(default_factory=list)  # prompt full-block hash chain
    output: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    block_arr: np.ndarray | None = None  # int32 copy of `blocks` for fast row fills
    num_computed: int = 0  # tokens whose KV is in the pool
    num_registered: int = 0  # prompt blocks already published to the prefix cache
    prefix_hit_tokens: int = 0
    finish_reason: str | None = None
    seq_no: int = 0  # unique per engine; keys the cached decode block-table rows
    hold_kv: bool = False  # prefill-only: blocks kept for export at finish (Engine.add_prefill_request)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < len(self.prompt)

    @property
    def kv_tokens_needed(self) -> int:
        """Tokens that will ever be written to the cache (the last sampled token never is)."""
        return kv_tokens_needed(len(self.prompt), self.max_new)


@dataclass
class PrefillBatch:
    chunks: list[tuple[Sequence, int]]  # (sequence, number of prompt tokens computed this step)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.chunks)


@dataclass
class DecodeBatch:
    seqs: list[Sequence]


class Scheduler:
    """Owns the waiting queue and the running list; allocates blocks at admission."""

    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_prefill_seqs: int | None = None) -> None:
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_prefill_seqs = max_prefill_seqs  # None: pack as many as the token budget takes
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        self.prefix_hit_requests = 0

    def blocks_for(self, seq: Sequence) -> int:
        return blocks_for_tokens(seq.kv_tokens_needed, self.blocks.block_size)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    def _try_admit(self, seq: Sequence) -> bool:
        bs = self.blocks.block_size
        # The last prompt token is always computed (its logits give the first output token).
        hit = self.blocks.match_prefix(seq.hashes[: (seq.prompt_len - 1) // bs])
        new = self.blocks_for(seq) - len(hit)
        if len(self.running) >= self.max_num_seqs or not self.blocks.can_allocate(hit, new):
            return False
        seq.blocks = self.blocks.allocate(hit, new)
        seq.block_arr = np.asarray(seq.blocks, dtype=np.int32)
        seq.num_computed = len(hit) * bs
        seq.num_registered = len(hit)
        seq.prefix_hit_tokens = len(hit) * bs
        if self.blocks.enable_prefix_caching:
            self.prefix_query_tokens += seq.prompt_len
            self.prefix_hit_tokens += seq.prefix_hit_tokens
            self.prefix_hit_requests += int(bool(hit))
        self.running.append(seq)
        return True

    def admit(self, seq: Sequence) -> bool:
        """Admit a waiting `seq` out of FCFS order (a schedule replay decides the order); False when it
        does not fit."""
        if not self._try_admit(seq):
            return False
        self.waiting.remove(seq)
        return True

    def _rows_left(self, rows: int) -> bool:
        """Whether a prefill step of `rows` sequences may take one more (`max_prefill_seqs`)."""
        return self.max_prefill_seqs is None or rows < self.max_prefill_seqs

    def schedule(self) -> PrefillBatch | DecodeBatch | None:
        budget = self.max_num_batched_tokens
        chunks: list[tuple[Sequence, int]] = []
        for seq in self.running:
            if budget == 0 or not self._rows_left(len(chunks)):
                break
            if seq.is_prefilling:
                n = min(seq.prompt_len - seq.num_computed, budget)
                chunks.append((seq, n))
                budget -= n
        while (self.waiting and budget > 0 and self._rows_left(len(chunks))
               and self._try_admit(self.waiting[0])):
            seq = self.waiting.popleft()
            n = min(seq.prompt_len - seq.num_computed, budget)
            chunks.append((seq, n))
            budget -= n
        if chunks:
            return PrefillBatch(chunks)
        if self.running:
            return DecodeBatch(list(self.running))
        return None

    def register_computed_blocks(self, seq: Sequence) -> None:
        """Publish the prompt blocks completed so far to the prefix cache."""
        full = min(seq.num_computed, seq.prompt_len) // self.blocks.block_size
        full = min(full, len(seq.hashes))
        for j in range(seq.num_registered, full):
            self.blocks.register(seq.blocks[j], seq.hashes[j])
        seq.num_registered = max(seq.num_registered, full)

    def finish(self, seq: Sequence) -> None:
        """Remove a running or waiting sequence and return its blocks."""
        if seq in self.running:
            self.running.remove(seq)
            self.blocks.free(seq.blocks)
            seq.blocks = []
            seq.block_arr = None
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
