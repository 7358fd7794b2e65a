"""Typed config of the RoPE family, read once from the per-GPU tuned file (rltbench/tuned.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from rltbench import tuned


@tuned.register
@dataclass(frozen=True)
class RopeKvConfig:
    """``enabled``: the kernel arms' NeoX RoPE also writes k and v into the paged KV cache, one
    launch instead of two (Ops.rope_neox_store). Off by default; on where a GPU's profile showed
    the fused step faster (the H200: 981 kernels per Ouro-1.4B decode step instead of 1077,
    5.554 against 5.633 ms, results/gpu/profile-fusekv)."""

    SECTION: ClassVar[str] = "rope_kv"
    enabled: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"enabled must be true or false, got {self.enabled!r}")

    @classmethod
    def from_section(cls, value: Any) -> RopeKvConfig:
        return cls(**tuned.fields_of(cls, value))
