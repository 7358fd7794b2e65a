"""One sequence's KV as a single contiguous buffer: pack (gather) its blocks of every plane, unpack
(scatter) them into other block ids of another pool, and the fixed-size header that travels with it.

Why one buffer per request: a looped model keeps one KV plane per layer application (Ouro-1.4B 96,
Huginn-0125 132 in the "full" layout), and a request's blocks are scattered through the pool, so a
transfer per plane and block would be planes x 2 x blocks small messages (96 x 2 x 32 = 6144 for one
512-token Ouro prompt). Gathering them into one buffer makes the transfer one message per request,
whatever the model: the layout is `[planes, 2 (K, V), n_blocks, block_size, heads, head_dim]`, the
pool's own layout restricted to the request's blocks.

Bit-exact by construction: the pool is viewed as integers of the same width before the gather and
the scatter, so values are moved as bits (NaN payloads, -0.0 and infinities included), never through
float registers. The payload travels as bytes (uint8): every transport takes them.

The header is an int64 tensor of HEADER_WORDS words with a magic number, a version and a checksum
over the other words, so a corrupted or foreign header is refused instead of being trusted; it names
the request, its prompt (length and digest), the first token the prefill engine sampled and the
geometry and size of the payload that follows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields

import numpy as np
import torch
from torch import Tensor

MAGIC = 0x524C544B5631  # "RLTKV1"
VERSION = 1
KIND_KV = 1  # a prefilled request's KV follows
KIND_CANCEL = 2  # the request failed on the prefill side: nothing follows
# Integer dtypes of the same width as each KV dtype: the gather/scatter move bits, not floats.
_RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
DTYPE_CODES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3, torch.float64: 4}
_INT63 = (1 << 63) - 1


class TransferError(RuntimeError):
    """A transfer that cannot complete; `reason` is a short code for records and replies."""

    reason = "transfer_failed"


class HeaderError(TransferError):
    """The header is not a valid header of this version (bad magic, version or checksum)."""

    reason = "header_corrupt"


class SizeMismatch(TransferError):
    """The payload's size does not fit the blocks or the geometry of the receiving pool."""

    reason = "size_mismatch"


class PromptMismatch(TransferError):
    """The header names a prompt (length, digest) or a first token the receiver cannot accept."""

    reason = "prompt_mismatch"


@dataclass(frozen=True)
class KVGeometry:
    """The shape of one KV block in every plane, and its dtype: two pools can exchange blocks only
    when their geometries are equal."""

    planes: int
    block_size: int
    heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of_pool(cls, kv: Tensor) -> KVGeometry:
        """The geometry of a pool `[planes, 2, num_blocks, block_size, heads, head_dim]`."""
        planes, two, _, bs, heads, hd = kv.shape
        if two != 2:
            raise ValueError(f"not a KV pool: dim 1 is {two}, expected 2 (K, V)")
        return cls(int(planes), int(bs), int(heads), int(hd), kv.dtype)

    @property
    def bytes_per_block(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return self.planes * 2 * self.block_size * self.heads * self.head_dim * elem

    @property
    def dtype_code(self) -> int:
        return DTYPE_CODES.get(self.dtype, 0)

    def blocks_for(self, prompt_len: int) -> int:
        """Blocks holding a prompt of `prompt_len` tokens (the last one may be partly filled)."""
        return -(-int(prompt_len) // self.block_size)


@dataclass(frozen=True)
class PrefilledMeta:
    """What an exporting engine knows about a packed request besides its bytes."""

    request_id: str
    prompt_len: int
    first_token: int
    n_blocks: int
    geometry: KVGeometry


def _raw(kv: Tensor) -> Tensor:
    """`kv` viewed as integers of the same width (a view: writes go to the pool)."""
    return kv.view(_RAW[kv.element_size()])


def _block_index(blocks: Sequence[int], device: torch.device) -> Tensor:
    return torch.as_tensor(list(blocks), dtype=torch.long, device=device)


def pack_blocks(kv: Tensor, blocks: Sequence[int], extra_bytes: int = 0) -> Tensor:
    """Gather `blocks` of every plane of pool `kv` into one new contiguous byte buffer (uint8, 1-D):
    the bytes of `[planes, 2, len(blocks), block_size, heads, head_dim]`, then `extra_bytes` left
    for the caller (a transport's trailer travels in the same message without another copy). One
    gather kernel."""
    geo = KVGeometry.of_pool(kv)
    n = len(blocks)
    buf = torch.empty(n * geo.bytes_per_block + extra_bytes, dtype=torch.uint8, device=kv.device)
    raw = _raw(kv)
    out = buf[: n * geo.bytes_per_block].view(raw.dtype)
    out = out.view(geo.planes, 2, n, geo.block_size, geo.heads, geo.head_dim)
    torch.index_select(raw, 2, _block_index(blocks, kv.device), out=out)
    return buf


def unpack_blocks(kv: Tensor, blocks: Sequence[int], packed: Tensor, skip: int = 0) -> None:
    """Scatter a buffer made by `pack_blocks` into `blocks` of pool `kv` (same geometry): packed block
    i lands in `blocks[i]`, for i >= `skip` (blocks the receiver already holds, e.g. prefix-cache hits
    shared with other requests, are left alone). Raises SizeMismatch when the sizes disagree."""
    geo = KVGeometry.of_pool(kv)
    n = len(blocks)
    if packed.dtype != torch.uint8 or packed.dim() != 1 or packed.numel() != n * geo.bytes_per_block:
        raise SizeMismatch(
            f"payload of {packed.numel():,} {packed.dtype} elements does not fill {n} blocks of "
            f"{geo.bytes_per_block:,} bytes ({geo.planes} planes x K,V x {geo.block_size} tokens x "
            f"{geo.heads} heads x {geo.head_dim} x {geo.dtype})"
        )
    if skip >= n:
        return
    raw = _raw(kv)
    src = packed.to(kv.device).view(raw.dtype).view(geo.planes, 2, n, geo.block_size, geo.heads, geo.head_dim)
    raw.index_copy_(2, _block_index(blocks[skip:], kv.device), src[:, :, skip:])


def prompt_digest(prompt: Sequence[int]) -> int:
    """A 63-bit digest of a prompt's token ids: the receiver checks that the KV it gets belongs to the
    prompt it was told about (both sides hold the prompt; only its digest travels)."""
    h = hashlib.blake2b(np.asarray(list(prompt), dtype=np.int64).tobytes(), digest_size=8)
    return int.from_bytes(h.digest(), "little") & _INT63


def _checksum(words: Sequence[int]) -> int:
    h = hashlib.blake2b(np.asarray(list(words), dtype=np.int64).tobytes(), digest_size=8)
    return int.from_bytes(h.digest(), "little") & _INT63


@dataclass(frozen=True)
class TransferHeader:
    """What precedes one request's payload. `seq` numbers the messages of a link (it is also the
    payload's tag where the transport matches by tag); `request` is the request's index in its burst."""

    kind: int
    seq: int
    request: int
    prompt_len: int
    first_token: int
    n_blocks: int
    payload_bytes: int
    prompt_digest: int
    planes: int
    block_size: int
    heads: int
    head_dim: int
    dtype_code: int

    @classmethod
    def for_kv(
        cls, seq: int, request: int, prompt: Sequence[int], first_token: int, geo: KVGeometry
    ) -> TransferHeader:
        """The header of a request whose whole prompt (all its blocks) follows."""
        n = geo.blocks_for(len(prompt))
        return cls(
            KIND_KV,
            seq,
            request,
            len(prompt),
            int(first_token),
            n,
            n * geo.bytes_per_block,
            prompt_digest(prompt),
            geo.planes,
            geo.block_size,
            geo.heads,
            geo.head_dim,
            geo.dtype_code,
        )

    @classmethod
    def cancel(cls, seq: int, request: int) -> TransferHeader:
        """The header saying a request failed before its KV could be sent (no payload follows)."""
        return cls(KIND_CANCEL, seq, request, 0, -1, 0, 0, 0, 0, 0, 0, 0, 0)

    def encode(self) -> Tensor:
        """int64 [HEADER_WORDS]: magic, version, the fields, checksum of everything before it."""
        words = [MAGIC, VERSION, *astuple(self)]
        return torch.tensor([*words, _checksum(words)], dtype=torch.int64)

    @classmethod
    def decode(cls, t: Tensor) -> TransferHeader:
        """Parse an encoded header; HeaderError for a wrong size, magic, version or checksum."""
        words = [int(x) for x in t.reshape(-1).tolist()]
        if len(words) != HEADER_WORDS:
            raise HeaderError(f"header of {len(words)} words, expected {HEADER_WORDS}")
        if words[0] != MAGIC or words[1] != VERSION:
            raise HeaderError(f"bad magic/version {words[0]:#x}/{words[1]} (expected {MAGIC:#x}/{VERSION})")
        if _checksum(words[:-1]) != words[-1]:
            raise HeaderError("header checksum mismatch (corrupted in transit)")
        return cls(*words[2:-1])

    def check_kv(self, geo: KVGeometry, prompt: Sequence[int], vocab_size: int) -> None:
        """Refuse a KV header that does not fit the receiving pool or the prompt it names:
        SizeMismatch for geometry or size, PromptMismatch for the prompt or the first token."""
        mine = (geo.planes, geo.block_size, geo.heads, geo.head_dim, geo.dtype_code)
        theirs = (self.planes, self.block_size, self.heads, self.head_dim, self.dtype_code)
        if mine != theirs:
            raise SizeMismatch(
                f"KV geometry (planes, block size, heads, head dim, dtype code) {theirs} differs from "
                f"this pool's {mine}"
            )
        need = geo.blocks_for(self.prompt_len)
        if self.n_blocks != need or self.payload_bytes != self.n_blocks * geo.bytes_per_block:
            raise SizeMismatch(
                f"{self.payload_bytes:,} payload bytes in {self.n_blocks} blocks for a "
                f"{self.prompt_len}-token prompt; this pool needs {need} blocks of "
                f"{geo.bytes_per_block:,} bytes"
            )
        if self.prompt_len != len(prompt) or self.prompt_digest != prompt_digest(prompt):
            raise PromptMismatch(f"request {self.request}: the KV is for another prompt (length or digest)")
        if not 0 <= self.first_token < vocab_size:
            raise PromptMismatch(
                f"request {self.request}: first token {self.first_token} outside [0, {vocab_size})"
            )


HEADER_WORDS = 2 + len(fields(TransferHeader)) + 1
