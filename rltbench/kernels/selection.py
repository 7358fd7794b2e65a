"""Which implementation each op family uses, parsed from CLI strings and environment variables.

Per family (norm / rope / act): ``exact`` | ``approx`` | ``cuda`` | ``off`` (the torch reference).
``exact`` and ``cuda`` (the native CUDA C++ kernels, rltbench.native) must equal torch bit for bit.
Scope: ``graph`` (fused kernels only while a CUDA graph is being captured; eager keeps torch
because an eager Triton launch costs more host time than it saves) or ``all`` (always).
Precedence: explicit values (CLI) > ``RLTBENCH_NORM/ROPE/ACT/SCOPE`` > the base selection.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

from rltbench.errors import UsageError
from rltbench.native import NATIVE_IMPL

IMPLS = ("exact", "approx", NATIVE_IMPL, "off")
BITWISE_IMPLS = ("exact", NATIVE_IMPL)   # implementations that must reproduce torch bit for bit
SCOPES = ("graph", "all")
FAMILIES = ("norm", "rope", "act")
ENV_VARS = {
    "norm": "RLTBENCH_NORM",
    "rope": "RLTBENCH_ROPE",
    "act": "RLTBENCH_ACT",
    "scope": "RLTBENCH_SCOPE",
}
_ALIASES = {"torch": "off", "ref": "off", "reference": "off", "none": "off"}


def _impl(field: str, value: str) -> str:
    v = _ALIASES.get(value.strip().lower(), value.strip().lower())
    allowed = SCOPES if field == "scope" else IMPLS
    if v not in allowed:
        raise UsageError(f"invalid {field} value {value!r}: expected one of {', '.join(allowed)}")
    return v


@dataclass(frozen=True)
class OpSelection:
    """The arm: one implementation per op family plus the scope. Immutable, hashable."""

    norm: str = "off"
    rope: str = "off"
    act: str = "off"
    scope: str = "graph"

    def __post_init__(self) -> None:
        for f in (*FAMILIES, "scope"):
            object.__setattr__(self, f, _impl(f, getattr(self, f)))

    @classmethod
    def torch(cls, scope: str = "graph") -> OpSelection:
        return cls("off", "off", "off", scope)

    @classmethod
    def exact(cls, scope: str = "graph") -> OpSelection:
        return cls("exact", "exact", "exact", scope)

    @classmethod
    def approx(cls, scope: str = "graph") -> OpSelection:
        return cls("approx", "approx", "approx", scope)

    @classmethod
    def cuda(cls, scope: str = "graph") -> OpSelection:
        """The native arm: every family as CUDA C++ operators (rltbench.native)."""
        return cls(NATIVE_IMPL, NATIVE_IMPL, NATIVE_IMPL, scope)

    @property
    def bitwise(self) -> bool:
        """Every family is the torch reference or an implementation that must equal it bitwise."""
        return all(getattr(self, f) in (*BITWISE_IMPLS, "off") for f in FAMILIES)

    @property
    def fused(self) -> bool:
        """At least one family runs kernels of this project (not the torch reference)."""
        return any(getattr(self, f) != "off" for f in FAMILIES)

    @property
    def name(self) -> str:
        """The arm's name when all families agree ('torch', 'exact', ...), else e.g.
        'norm=exact,rope=off,act=approx'."""
        impls = {self.norm, self.rope, self.act}
        if len(impls) == 1:
            return {"off": "torch"}.get(self.norm, self.norm)
        return f"norm={self.norm},rope={self.rope},act={self.act}"

    def to_dict(self) -> dict[str, str]:
        """For manifests: the four fields plus the display name."""
        return {**asdict(self), "name": self.name}

    def with_env(self, env: Mapping[str, str] | None = None) -> OpSelection:
        """This selection with any RLTBENCH_* variables applied on top."""
        env = os.environ if env is None else env
        updates = {f: env[var] for f, var in ENV_VARS.items() if env.get(var, "").strip()}
        return replace(self, **updates) if updates else self


def parse_selection(
    text: str | None = None,
    *,
    norm: str | None = None,
    rope: str | None = None,
    act: str | None = None,
    scope: str | None = None,
    env: Mapping[str, str] | None = None,
    base: OpSelection | None = None,
) -> OpSelection:
    """Build a selection. `text` is an arm name (torch|exact|approx|cuda) or 'key=value' pairs joined by
    commas (keys norm, rope, act, scope; 'all=exact' sets the three families). Keyword values
    override `text`, which overrides the environment, which overrides `base` (default torch)."""
    sel = (base or OpSelection.torch()).with_env(env)
    updates: dict[str, str] = {}
    if text is not None and text.strip():
        t = text.strip().lower()
        if "=" not in t:
            arms = {
                "torch": OpSelection.torch,
                "off": OpSelection.torch,
                "exact": OpSelection.exact,
                "approx": OpSelection.approx,
                NATIVE_IMPL: OpSelection.cuda,
            }
            if t not in arms:
                raise UsageError(
                    f"unknown arm {text!r}: expected torch, exact, approx, cuda or key=value pairs"
                )
            updates = {f: getattr(arms[t](), f) for f in FAMILIES}
        else:
            for part in t.split(","):
                if not part.strip():
                    continue
                key, sep, val = part.partition("=")
                key = key.strip()
                if not sep or key not in (*FAMILIES, "scope", "all"):
                    raise UsageError(f"bad selection item {part!r}: expected norm|rope|act|scope|all=VALUE")
                for f in FAMILIES if key == "all" else (key,):
                    updates[f] = val
    for f, v in (("norm", norm), ("rope", rope), ("act", act), ("scope", scope)):
        if v is not None:
            updates[f] = v
    return replace(sel, **updates) if updates else sel


ARMS: dict[str, OpSelection] = {
    "torch": OpSelection.torch(),
    "exact": OpSelection.exact(),
    "approx": OpSelection.approx(),
    NATIVE_IMPL: OpSelection.cuda(),
}
