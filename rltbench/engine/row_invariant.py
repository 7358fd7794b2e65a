"""Row-invariant prefill: every token's values independent of the step it is computed in.

Why: GPU kernels pick their algorithm by shape. cuBLAS chooses a GEMM kernel (tiles, split-K) by M,
torch's row reductions (the reference RMSNorm) pick their thread layout by the number of rows, and
chunked prefill attention runs SDPA per row with one query block per chunk (its kernel, and its math
fallback's GEMMs, depend on the chunk's length and context). A prompt token prefilled beside other
requests, or in a chunk that starts after cached context, can therefore get K/V that differ in the
last bits from the same token prefilled alone, and a greedy token can flip. The prefix cache makes
exactly that comparison: a cached prefix's K/V were computed in the steps of the earlier request that
filled the cache, while with the cache off the same positions are recomputed in a step of another
shape.

The mode (`rltbench.engine.replay.row_invariant`) runs each prefill step as consecutive forwards
of exactly `tile_tokens` tokens (the step's tokens in order, the last tile padded with tokens that
write no KV and attend to nothing), each token attending as a one-query decode row over its own
prefix with the engine's full block-table width. Every kernel of every forward then sees one shape (M =
`tile_tokens` for GEMMs, norms and the head; one decode-attention configuration whose split plan
depends on a row's own length only), so a token's values depend on its ids, position and the
cached K/V of its earlier positions, not on its companions or where the step was cut. Tiling
preserves causality: a tile's tokens see the K/V of earlier tiles (all layers done) and, per layer,
of the tile's own earlier tokens, as a chunk boundary does.

What it still assumes: a kernel called with one shape treats every row alike (true of the GEMMs
when a tile fits in one M tile of the kernel, hence the default of 64 rows; checked bitwise on the
GPU by tests/engine/test_row_invariant_gpu.py). Decode steps are unchanged: a replayed schedule
gives both sides of a comparison the same decode batches. A Huginn model whose recurrence shares
one KV plane per physical layer ("compress") is refused: there later iterations overwrite earlier
ones' K/V, so what a token attends to depends on where a tile boundary falls.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from rltbench.errors import UsageError

DEFAULT_TILE_TOKENS = 64


@dataclass(frozen=True)
class TokenTile:
    """One fixed-size forward of a row-invariant prefill step.

    `packed` (int64): ids, positions, slots, seq_lens [tile] each, then the block tables
    [tile, width]; padding rows have id 0, position 0, slot -1 and seq_len 0. `finishing` lists the
    tile rows whose token completes its request's prompt, in the step's order of finishing rows."""

    packed: np.ndarray
    finishing: tuple[int, ...]


def check_tile_tokens(tile_tokens: int) -> int:
    """The tile size, refused (UsageError) unless a positive integer."""
    if isinstance(tile_tokens, bool) or not isinstance(tile_tokens, int) or tile_tokens < 1:
        raise UsageError(f"row-invariant tile must be a positive number of tokens, got {tile_tokens!r}")
    return tile_tokens


def check_model(model: object) -> None:
    """Refuse a model whose K/V at a position depend on how its tokens were grouped (module docstring)."""
    if getattr(getattr(model, "config", None), "kv_layout", "full") == "compress":
        raise UsageError(
            "row-invariant prefill needs one KV plane per layer application; the Huginn 'compress' "
            "layout overwrites a position's K/V with later iterations, so results depend on tiling"
        )


def token_tiles(
    ids: np.ndarray,
    positions: np.ndarray,
    slots: np.ndarray,
    row_of_token: np.ndarray,
    block_tables: np.ndarray,
    last_idx: Sequence[int],
    tile_tokens: int,
    width: int,
) -> Iterator[TokenTile]:
    """The step's tokens (ids/positions/slots [N], the step row of each token, the step's block
    tables [rows, w <= width], the token index of each finishing row) as tiles of `tile_tokens`
    one-query rows with `width`-wide block tables."""
    n = len(ids)
    last = {int(t): k for k, t in enumerate(last_idx)}
    tables = np.zeros((n, width), dtype=np.int64)
    tables[:, : block_tables.shape[1]] = block_tables[row_of_token]
    for t0 in range(0, n, tile_tokens):
        t1 = min(n, t0 + tile_tokens)
        m = t1 - t0
        cols = np.zeros((4, tile_tokens), dtype=np.int64)
        cols[2] = -1
        cols[0, :m], cols[1, :m], cols[2, :m] = ids[t0:t1], positions[t0:t1], slots[t0:t1]
        cols[3, :m] = positions[t0:t1] + 1
        bt = np.zeros((tile_tokens, width), dtype=np.int64)
        bt[:m] = tables[t0:t1]
        finishing = sorted((last[t], t - t0) for t in range(t0, t1) if t in last)
        yield TokenTile(np.concatenate([cols.reshape(-1), bt.reshape(-1)]), tuple(r for _, r in finishing))
