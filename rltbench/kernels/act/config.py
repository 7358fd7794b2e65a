"""Typed launch config of the exact SiLU·up, read once from the per-GPU tuned file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from rltbench import tuned

FEW_ROWS = 4
BLOCKS = (128, 256, 512, 1024, 2048, 4096)


@tuned.register
@dataclass(frozen=True)
class ActExactConfig:
    """Column tile per program on the GPU: small for a few rows (``block_few_rows``, up to FEW_ROWS:
    more programs share the latency of the accurate exp and the IEEE division), larger for many
    (``block_many_rows``: fewer, longer programs stream better)."""

    SECTION: ClassVar[str] = "act_exact"
    block_few_rows: int = 512
    block_many_rows: int = 2048

    def __post_init__(self) -> None:
        for name in ("block_few_rows", "block_many_rows"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {v!r}")

    @classmethod
    def from_section(cls, value: Any) -> ActExactConfig:
        return cls(**tuned.fields_of(cls, value))

    def block_for(self, rows: int) -> int:
        return self.block_few_rows if rows <= FEW_ROWS else self.block_many_rows

    @classmethod
    def search_space(cls) -> dict[str, ActExactConfig]:
        """What the tuner times: one tile for both row classes (it picks per class)."""
        return {str(b): cls(b, b) for b in BLOCKS}
