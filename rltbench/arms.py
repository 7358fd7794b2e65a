"""Arm specifications for `rltbench e2e --arms`.

Grammar (comma-separated items):
  NAME                   a known arm of rltbench.kernels.ARMS (torch, exact, approx, cuda)
  NAME=op:val/op:val     a custom arm, starting from torch (all ops off), e.g. `fused=norm:exact/scope:all`
                         (ops: norm, rope, act in {exact, approx, cuda, off}; scope in {graph, all})
A repeated name becomes NAME#2, NAME#3 (`--arms torch,torch` is the A/A noise-floor run).
`--norm/--rope/--act/--scope` override those settings on every named non-torch arm (not on custom ones).
An arm that uses `cuda` (the native CUDA C++ kernels) where they cannot be built is a UsageError.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rltbench.errors import UsageError

OP_VALUES = ("exact", "approx", "cuda", "off")   # rltbench.kernels.selection.IMPLS (not imported: light CLI)
BITWISE_VALUES = ("exact", "cuda")               # must reproduce torch bit for bit
SCOPE_VALUES = ("graph", "all")
OP_KEYS = ("norm", "rope", "act")


def _check(key: str, val: str, where: str) -> None:
    allowed = SCOPE_VALUES if key == "scope" else OP_VALUES
    if key not in (*OP_KEYS, "scope"):
        raise UsageError(f"{where}: unknown setting {key!r} (norm, rope, act, scope)")
    if val not in allowed:
        raise UsageError(f"{where}: {key} must be one of {', '.join(allowed)}, not {val!r}")


def parse_arms(spec: str, overrides: dict[str, str | None] | None = None) -> dict[str, Any]:
    """'torch,exact' -> {name: OpSelection} in order; bad input -> UsageError."""
    from rltbench.kernels import ARMS, OpSelection

    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    for k, v in overrides.items():
        _check(k, v, f"--{k}")
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if not items:
        raise UsageError("--arms is empty (e.g. --arms torch,exact,approx)")
    out: dict[str, Any] = {}
    for item in items:
        name, sep, body = item.partition("=")
        name = name.strip()
        if not name or "#" in name:
            raise UsageError(f"--arms item {item!r}: bad arm name")
        if sep:
            fields: dict[str, str] = {}
            for part in body.split("/"):
                key, colon, val = part.strip().partition(":")
                if not colon:
                    raise UsageError(f"--arms {item!r}: expected op:value pairs separated by '/'")
                _check(key.strip(), val.strip(), f"--arms {name}")
                fields[key.strip()] = val.strip()
            sel = dataclasses.replace(OpSelection.torch(), **fields)
        else:
            if name not in ARMS:
                raise UsageError(
                    f"--arms: unknown arm {name!r} (known: {', '.join(ARMS)}; or NAME=norm:exact/...)"
                )
            sel = ARMS[name]
            if name != "torch" and overrides:
                sel = dataclasses.replace(sel, **overrides)
        key, k = name, 1
        while key in out:
            k += 1
            key = f"{name}#{k}"
        out[key] = sel
    from rltbench import native

    native.require(out.values())   # builds the native kernels now, or says why they cannot run
    return out


def reference_arm(arms: list[str]) -> str:
    """The arm every other arm is compared against: `torch` if present, else the first."""
    return "torch" if "torch" in arms else arms[0]


def selection_dict(sel: Any) -> dict[str, str]:
    return {k: str(getattr(sel, k)) for k in (*OP_KEYS, "scope") if hasattr(sel, k)}


def is_exact(sel: Any) -> bool:
    """An arm that must reproduce torch bit for bit: every op exact, cuda or off, at least one not off."""
    vals = [str(getattr(sel, k, "off")) for k in OP_KEYS]
    return all(v in (*BITWISE_VALUES, "off") for v in vals) and any(v != "off" for v in vals)


def eager_reference_arms(selections: dict[str, Any], graphs: bool) -> list[str]:
    """Arms that silently run the torch reference ops: scope "graph" fuses only inside CUDA graphs,
    so without graphs (CPU, --enforce-eager) such an arm computes exactly what `torch` computes."""
    if graphs:
        return []
    return [
        n
        for n, s in selections.items()
        if str(getattr(s, "scope", "all")) == "graph"
        and any(str(getattr(s, k, "off")) != "off" for k in OP_KEYS)
    ]


def eager_kernel_arms(selections: dict[str, Any]) -> set[str]:
    """Arms whose eager (uncaptured) steps run their own fused kernels (scope "all"): the kernel
    specialisations they compile differ from every other arm's, so each needs its own warm-up."""
    def fused(s: Any) -> bool:
        return any(str(getattr(s, k, "off")) != "off" for k in OP_KEYS)

    return {n for n, s in selections.items() if str(getattr(s, "scope", "graph")) == "all" and fused(s)}
