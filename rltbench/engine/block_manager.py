"""Paged KV block accounting and the prefix cache (host side only; no tensors here).

One block table per request, shared by every KV plane: a block id indexes
`kv[:, :, block]` of the pool, so allocating one id reserves `block_size` tokens in all planes.

Prefix cache: a full prompt block is identified by a hash chain (digest of the parent block's digest
plus the block's token ids), so a block is only reused when the whole prefix before it matches.
Blocks are refcounted; a cached block whose refcount drops to 0 stays cached and joins an LRU list of
evictable blocks, which allocation drains (oldest first) once the plain free list is empty. The
free-block count (plain free + evictable) is therefore exact at all times.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence


def block_hashes(token_ids: Sequence[int], block_size: int, max_blocks: int | None = None) -> list[bytes]:
    """Hash chain over the full blocks of `token_ids` (at most `max_blocks` of them)."""
    n = len(token_ids) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    out: list[bytes] = []
    parent = b""
    for j in range(n):
        h = hashlib.blake2b(parent, digest_size=16)
        h.update(array("q", token_ids[j * block_size : (j + 1) * block_size]).tobytes())
        parent = h.digest()
        out.append(parent)
    return out


class BlockManager:
    """Free list + refcounts + hash -> block map with LRU eviction. Deterministic (FIFO/LRU order)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._free: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached blocks with refcount 0, LRU first
        self._ref = [0] * num_blocks
        self._hash: list[bytes | None] = [None] * num_blocks
        self._cached: dict[bytes, int] = {}

    # ---- counts -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    # ---- prefix cache ---------------------------------------------------------------------------
    def match_prefix(self, hashes: Sequence[bytes]) -> list[int]:
        """Blocks holding the longest cached prefix of `hashes` (not yet referenced)."""
        if not self.enable_prefix_caching:
            return []
        out = []
        for h in hashes:
            b = self._cached.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def blocks_needed_to_admit(self, hit_blocks: Sequence[int], new_blocks: int) -> int:
        """Free blocks consumed by taking `hit_blocks` (the evictable ones leave the free count)
        plus `new_blocks` fresh ones."""
        return new_blocks + sum(1 for b in hit_blocks if self._ref[b] == 0)

    def can_allocate(self, hit_blocks: Sequence[int], new_blocks: int) -> bool:
        return self.blocks_needed_to_admit(hit_blocks, new_blocks) <= self.num_free_blocks

    def allocate(self, hit_blocks: Sequence[int], new_blocks: int) -> list[int]:
        """Reference `hit_blocks` and append `new_blocks` fresh blocks; returns the block table."""
        if not self.can_allocate(hit_blocks, new_blocks):
            raise RuntimeError("BlockManager.allocate called without enough free blocks")
        table = []
        for b in hit_blocks:
            if self._ref[b] == 0:
                del self._evictable[b]
            self._ref[b] += 1
            table.append(b)
        for _ in range(new_blocks):
            if self._free:
                b = self._free.popleft()
            else:
                b, _ = self._evictable.popitem(last=False)  # evict the least recently used cached block
                h = self._hash[b]
                self._hash[b] = None
                if h is not None and self._cached.get(h) == b:
                    del self._cached[h]
            self._ref[b] = 1
            table.append(b)
        return table

    def register(self, block: int, h: bytes) -> None:
        """Publish a full prompt block whose KV has been written. A hash already cached by another
        block (two identical prompts prefilled at once) keeps the first one."""
        if not self.enable_prefix_caching or self._hash[block] is not None or h in self._cached:
            return
        self._cached[h] = block
        self._hash[block] = h

    def free(self, table: Sequence[int]) -> None:
        """Drop one reference to each block; tail blocks first, so the LRU evicts suffixes first."""
        for b in reversed(table):
            self._ref[b] -= 1
            if self._ref[b] < 0:
                raise RuntimeError(f"block {b} freed twice")
            if self._ref[b] == 0:
                if self._hash[b] is not None:
                    self._evictable[b] = None
                else:
                    self._free.append(b)

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash; evictable blocks become plain free blocks."""
        for b in self._evictable:
            self._free.append(b)
        self._evictable.clear()
        self._cached.clear()
        self._hash = [None] * self.num_blocks

    def check_all_free(self) -> bool:
        """True when no block is referenced (used by tests and arm switches)."""
        return self.num_free_blocks == self.num_blocks and not any(self._ref)
