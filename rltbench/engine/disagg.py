"""Prefill/decode disaggregation on the engine: a request's KV leaving one engine and entering another.

A prefill engine runs a prompt-only request (`Engine.add_prefill_request`) up to its first token; the
request then leaves the running list with its blocks still referenced (`HeldRequests.hold`), its KV
leaves as one packed buffer (`HeldRequests.export`: every plane of its blocks, rltbench.engine.
kv_transfer) and its blocks are freed once the transfer is over (`HeldRequests.release`). A decode
engine admits the request straight into decode (`Engine.import_prefilled`): it allocates blocks as
admission sizes any request (`blocks_to_import`) and scatters the payload into the prompt's blocks
(`scatter_prompt`). docs/pd.md describes the whole path.
"""

from __future__ import annotations

from torch import Tensor

from rltbench.engine import kv_transfer
from rltbench.engine.block_manager import BlockManager
from rltbench.engine.kv_capacity import blocks_for_tokens, kv_tokens_needed
from rltbench.engine.scheduler import Scheduler, Sequence
from rltbench.engine.types import EngineRequestError


class HeldRequests:
    """Prefilled requests whose blocks are held for export, oldest first."""

    def __init__(self, kv: Tensor, blocks: BlockManager, scheduler: Scheduler) -> None:
        self.kv, self.blocks, self.scheduler = kv, blocks, scheduler
        self._seqs: dict[str, Sequence] = {}

    @property
    def request_ids(self) -> list[str]:
        """The held requests, oldest first."""
        return list(self._seqs)

    def hold(self, seq: Sequence) -> None:
        """A finished prefill-only request leaves the running list with its blocks still referenced."""
        self.scheduler.running.remove(seq)
        self._seqs[seq.request_id] = seq

    def export(self, request_id: str, extra_bytes: int = 0) -> tuple[Tensor, kv_transfer.PrefilledMeta]:
        """A held request's KV as one contiguous byte buffer (all its blocks of every plane, then
        `extra_bytes` for the transport: `kv_transfer.pack_blocks`) and its facts. The blocks stay
        held until `release`."""
        seq = self._seqs.get(request_id)
        if seq is None:
            raise EngineRequestError(f"request {request_id!r} is not a prefilled request held for export")
        geo = kv_transfer.KVGeometry.of_pool(self.kv)
        meta = kv_transfer.PrefilledMeta(request_id, seq.prompt_len, seq.output[0], len(seq.blocks), geo)
        return kv_transfer.pack_blocks(self.kv, seq.blocks, extra_bytes), meta

    def release(self, request_id: str) -> bool:
        """Free a held request's blocks (its transfer finished or failed); False if it is not held."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        self.blocks.free(seq.blocks)
        seq.blocks, seq.block_arr = [], None
        return True


def blocks_to_import(prompt_len: int, max_tokens: int, max_model_len: int, block_size: int) -> int:
    """KV blocks an imported request gets (prompt plus output, as admission sizes every request), so a
    receiver can promise room before the payload arrives."""
    max_new = min(max_tokens, max_model_len - prompt_len + 1)
    return blocks_for_tokens(kv_tokens_needed(prompt_len, max_new), block_size)


def check_first_token(first_token: int, vocab_size: int) -> None:
    """Refuse a first token outside the vocabulary (EngineRequestError)."""
    if not 0 <= int(first_token) < vocab_size:
        raise EngineRequestError(f"first token {first_token} outside [0, {vocab_size})")


def scatter_prompt(kv: Tensor, seq: Sequence, packed: Tensor, block_size: int) -> None:
    """Scatter `packed` (a prompt's blocks from `HeldRequests.export` on an engine of the same KV
    geometry) into the prompt's blocks of an admitted `seq`, leaving its prefix-cache hits alone;
    kv_transfer.TransferError for a size mismatch."""
    n = -(-seq.prompt_len // block_size)
    kv_transfer.unpack_blocks(kv, seq.blocks[:n], packed, skip=seq.num_computed // block_size)
