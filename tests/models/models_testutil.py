"""Helpers for the model tests (a uniquely named module, so no clash with other test folders)."""

from __future__ import annotations

import torch


def run_prefill(model, seqs, ops, max_len=64, impl="sdpa"):
    """One flattened forward over several whole prompts (seq i -> cache row i); returns (hidden, cache)."""
    cache = model.new_kv_cache(max_seqs=len(seqs), max_len=max_len, impl=impl)
    seq_ids = [i for i, s in enumerate(seqs) for _ in s]
    positions = [p for s in seqs for p in range(len(s))]
    cache.begin(seq_ids, positions)
    ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long)
    hidden = model.forward(ids, torch.tensor(positions), cache, ops)
    return hidden, cache


def random_prompt(n, vocab=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()
