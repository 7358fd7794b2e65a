"""Block accounting and the prefix cache's hash chain / refcounts / LRU eviction (host only, fast)."""

from __future__ import annotations

import pytest

from rltbench.engine.block_manager import BlockManager, block_hashes


def test_hash_chain_depends_on_parent_and_ignores_partial_block():
    a = block_hashes([1, 2, 3, 4, 5, 6, 7], 3)
    b = block_hashes([9, 2, 3, 4, 5, 6], 3)
    assert len(a) == 2 and len(b) == 2
    assert a[0] != b[0]
    assert a[1] != b[1]  # same tokens 4,5,6 but a different parent
    assert block_hashes([1, 2, 3, 4, 5, 6, 8], 3) == a  # the partial tail is not hashed
    assert block_hashes([1, 2, 3, 4, 5, 6], 3, max_blocks=1) == a[:1]


def test_refcounts_lru_eviction_and_exact_free_count():
    bm = BlockManager(4, 2, enable_prefix_caching=True)
    h = block_hashes([1, 2, 3, 4], 2)
    t1 = bm.allocate([], 2)
    for blk, hh in zip(t1, h, strict=True):
        bm.register(blk, hh)
    assert bm.num_free_blocks == 2
    assert bm.match_prefix(h) == t1
    t2 = bm.allocate(bm.match_prefix(h), 1)  # shares both cached blocks
    assert t2[:2] == t1 and bm.num_free_blocks == 1
    bm.free(t1)
    assert bm.num_free_blocks == 1  # still referenced by t2
    bm.free(t2)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 2
    # Taking 3 fresh blocks: 2 plain free ones, then the LRU cached one. Freed in reverse order, the
    # tail block t1[1] became evictable first, so it is evicted and the chain's head survives.
    t3 = bm.allocate([], 3)
    assert t1[1] in t3 and t1[0] not in t3
    assert bm.match_prefix(h) == [t1[0]]
    assert bm.num_free_blocks == 1
    bm.free(t3)
    assert bm.check_all_free()
    bm.reset_prefix_cache()
    assert bm.match_prefix(h) == [] and bm.num_free_blocks == 4 and bm.num_cached_blocks == 0


def test_duplicate_hash_keeps_first_and_double_free_is_caught():
    bm = BlockManager(3, 2, enable_prefix_caching=True)
    h = block_hashes([5, 6], 2)[0]
    a, b = bm.allocate([], 1), bm.allocate([], 1)
    bm.register(a[0], h)
    bm.register(b[0], h)
    assert bm.match_prefix([h]) == a
    bm.free(a)
    bm.free(b)
    assert bm.check_all_free()
    with pytest.raises(RuntimeError):
        bm.free(b)


def test_allocation_beyond_free_blocks_raises():
    bm = BlockManager(2, 4, enable_prefix_caching=False)
    assert not bm.can_allocate([], 3)
    with pytest.raises(RuntimeError):
        bm.allocate([], 3)
    assert bm.match_prefix(block_hashes([1, 2, 3, 4], 4)) == []
