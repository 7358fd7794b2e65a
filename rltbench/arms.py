"""The kernel arm: which implementation each op family runs, written one way and parsed in one place.

An arm picks, per op family (norm, rope, act), one implementation:
  exact   fused Triton kernels that must equal torch bit for bit
  approx  fused Triton kernels that are faster and may differ within a stated bound
  cuda    the native CUDA C++ kernels (rltbench.native), bitwise like exact
  off     the torch reference ops
and a scope: `graph` runs the fused kernels only while a CUDA graph is being captured (an eager
Triton launch costs more host time than it saves), `all` runs them everywhere. An arm that does not
state its scope gets `default_scope(graphs)`: `graph` where the run captures CUDA graphs, `all` where
it captures none (the CPU, --enforce-eager), since there a scope-graph arm runs torch's ops and its
kernels are never exercised. A scope stated there anyway (`--scope graph`) is kept, and the run's
verdict for that arm says it was not exercised (`NOT_EXERCISED`).

The grammar of `--arms` (every command; `parse_arms` is its only parser):
  ARMS  := ITEM ("," ITEM)*
  ITEM  := NAME                          a named arm: torch, exact, approx, cuda
         | NAME "=" FIELD ("/" FIELD)*   a custom arm, starting from torch (all off, default scope)
  FIELD := ("norm" | "rope" | "act") ":" IMPL  |  "scope" ":" ("graph" | "all")
e.g. `--arms torch,exact,fused=norm:exact/scope:all`. A repeated name becomes NAME#2, NAME#3:
`--arms torch,torch` is the A/A arm, the run's own noise floor. `--norm/--rope/--act/--scope`
change that setting on every named arm except torch (a custom arm already says what it means).
`str(spec)` writes the FIELD list back, so `parse_arms(f"x={spec}")` gives `spec` again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Annotated

import typer

from rltbench import native
from rltbench.errors import UsageError
from rltbench.options import comma_list

FAMILIES = ("norm", "rope", "act")
IMPLS = ("exact", "approx", native.NATIVE_IMPL, "off")
BITWISE_IMPLS = ("exact", native.NATIVE_IMPL)  # implementations that must reproduce torch bit for bit
SCOPES = ("graph", "all")
SETTINGS = (*FAMILIES, "scope")
REFERENCE = "torch"
NOT_EXERCISED = "not exercised: scope graph runs torch ops without CUDA graphs; use --scope all"


def _check_value(key: str, value: str, where: str) -> str:
    """`value` for setting `key`, or a UsageError naming the allowed values."""
    if key not in SETTINGS:
        raise UsageError(f"{where}: unknown setting {key!r} ({', '.join(SETTINGS)})")
    allowed = SCOPES if key == "scope" else IMPLS
    if value not in allowed:
        raise UsageError(f"{where}: {key} must be one of {', '.join(allowed)}, not {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class ArmSpec:
    """One arm: an implementation per op family plus the scope. Immutable and hashable, so it can key
    caches; invalid values are refused when the spec is made."""

    norm: str = "off"
    rope: str = "off"
    act: str = "off"
    scope: str = "graph"

    def __post_init__(self) -> None:
        for key in SETTINGS:
            _check_value(key, getattr(self, key), "arm")

    @classmethod
    def torch(cls, scope: str = "graph") -> ArmSpec:
        return cls("off", "off", "off", scope)

    @classmethod
    def exact(cls, scope: str = "graph") -> ArmSpec:
        return cls("exact", "exact", "exact", scope)

    @classmethod
    def approx(cls, scope: str = "graph") -> ArmSpec:
        return cls("approx", "approx", "approx", scope)

    @classmethod
    def cuda(cls, scope: str = "graph") -> ArmSpec:
        """The native arm: every family as CUDA C++ operators (rltbench.native)."""
        return cls(native.NATIVE_IMPL, native.NATIVE_IMPL, native.NATIVE_IMPL, scope)

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
        """'torch', 'exact', ... when all families agree, else the FIELD list of the families."""
        if len({self.norm, self.rope, self.act}) == 1:
            return REFERENCE if self.norm == "off" else self.norm
        return "/".join(f"{f}:{getattr(self, f)}" for f in FAMILIES)

    def replace(self, **settings: str) -> ArmSpec:
        return dataclasses.replace(self, **settings)

    def settings(self) -> dict[str, str]:
        """The four settings, {norm, rope, act, scope}."""
        return dataclasses.asdict(self)

    def to_dict(self) -> dict[str, str]:
        """For manifests: the four settings plus the display name."""
        return {**self.settings(), "name": self.name}

    def __str__(self) -> str:
        return "/".join(f"{k}:{getattr(self, k)}" for k in SETTINGS)


ARMS: dict[str, ArmSpec] = {
    REFERENCE: ArmSpec.torch(),
    "exact": ArmSpec.exact(),
    "approx": ArmSpec.approx(),
    native.NATIVE_IMPL: ArmSpec.cuda(),
}


def default_scope(graphs: bool) -> str:
    """The scope of an arm that does not state one: `graph` where the run captures CUDA graphs (the
    fused kernels run inside them), `all` where it captures none, so the kernels still run."""
    return "graph" if graphs else "all"


def _custom(name: str, body: str, item: str, scope: str) -> ArmSpec:
    fields: dict[str, str] = {}
    for part in body.split("/"):
        key, colon, value = (s.strip() for s in part.partition(":"))
        if not colon:
            raise UsageError(f"--arms {item!r}: expected setting:value pairs joined by '/' "
                             f"(e.g. {name}=norm:exact/scope:all)")
        fields[key] = _check_value(key, value, f"--arms {name}")
    return ArmSpec.torch(scope).replace(**fields)


def _old_grammar(item: str) -> bool:
    """`norm=exact` (the retired per-setting form), not a custom arm named `norm`."""
    name, _, value = item.partition("=")
    return name.strip() in SETTINGS and ":" not in value


def parse_arms(text: str, overrides: Mapping[str, str | None] | None = None, *,
               build_native: bool = True, graphs: bool = True) -> dict[str, ArmSpec]:
    """The arms of `--arms TEXT` in order, {name: ArmSpec}; `overrides` are --norm/--rope/--act/--scope
    (None: not given); `graphs`: whether the run captures CUDA graphs, which sets the scope of every
    arm that does not state one (`default_scope`). Builds the native kernels when an arm uses them
    (`build_native`), so an arm that cannot run here fails now with the reason, before any run
    directory or timed cell."""
    given = {k: _check_value(k, v, f"--{k}") for k, v in (overrides or {}).items() if v is not None}
    scope = default_scope(graphs)
    items = comma_list(text, "--arms", "torch,exact,approx")
    out: dict[str, ArmSpec] = {}
    for item in items:
        if _old_grammar(item):
            key = item.split("=")[0].strip()
            raise UsageError(f"--arms {item!r}: write a custom arm as NAME=norm:exact/rope:off (e.g. "
                             f"--arms torch,fused=norm:exact/scope:all), or set it with --{key}")
        name, eq, body = item.partition("=")
        name = name.strip()
        if not name or "#" in name:
            raise UsageError(f"--arms item {item!r}: bad arm name")
        if eq:
            spec = _custom(name, body, item, scope)
        elif name in ARMS:
            spec = ARMS[name] if name == REFERENCE else ARMS[name].replace(**{"scope": scope, **given})
        else:
            raise UsageError(
                f"--arms: unknown arm {name!r} (known: {', '.join(ARMS)}; or NAME=norm:exact/...)"
            )
        key, k = name, 1
        while key in out:
            k += 1
            key = f"{name}#{k}"
        out[key] = spec
    if build_native:
        native.require(out.values())  # builds the native kernels now, or says why they cannot run
    return out


def reference_arm(arms: Iterable[str]) -> str:
    """The arm every other arm is compared against: `torch` if present, else the first."""
    names = list(arms)
    return REFERENCE if REFERENCE in names else names[0]


def is_exact(spec: ArmSpec) -> bool:
    """An arm that must reproduce torch bit for bit: every family exact, cuda or off, one not off."""
    return spec.bitwise and spec.fused


def eager_reference_arms(specs: Mapping[str, ArmSpec], graphs: bool) -> list[str]:
    """Arms that silently run the torch reference ops: scope "graph" fuses only inside CUDA graphs,
    so without graphs (CPU, --enforce-eager) such an arm computes exactly what `torch` computes."""
    if graphs:
        return []
    return [n for n, s in specs.items() if s.scope == "graph" and s.fused]


def unexercised_arms(settings: Mapping[str, object], graphs: bool) -> list[str]:
    """The arms of a stored run (name -> its manifest settings, as `ArmSpec.settings()` wrote them;
    other values, e.g. a server's URL, are not engine arms) whose kernels never ran: `eager_reference_arms`
    of a run that had (`graphs`) or had no CUDA graphs."""
    specs = {n: ArmSpec(**{k: str(d[k]) for k in SETTINGS if k in d})
             for n, d in settings.items() if isinstance(d, Mapping)}
    return eager_reference_arms(specs, graphs)


def scope_notes(specs: Mapping[str, ArmSpec], graphs: bool, why: str = "not on a GPU") -> list[str]:
    """What a run without CUDA graphs (`why`) says about its fused arms: which run their kernels in
    every step (scope all, the default there) and which are not exercised (scope graph, stated)."""
    if graphs:
        return []
    notes = []
    run_all = [n for n, s in specs.items() if s.scope == "all" and s.fused]
    if run_all:
        notes.append(f"no CUDA graphs ({why}): scope all, the default without graphs: the arm(s) "
                     f"{', '.join(run_all)} run their kernels in every step"
                     + (" (through the Triton interpreter on the CPU)" if why == "not on a GPU" else ""))
    same = eager_reference_arms(specs, graphs)
    if same:
        notes.append(f"no CUDA graphs ({why}): the scope=graph arm(s) {', '.join(same)} run the torch "
                     f"reference ops: {NOT_EXERCISED}")
    return notes


def eager_kernel_arms(specs: Mapping[str, ArmSpec]) -> set[str]:
    """Arms whose eager (uncaptured) steps run their own fused kernels (scope "all"): the kernel
    specialisations they compile differ from every other arm's, so each needs its own warm-up."""
    return {n for n, s in specs.items() if s.scope == "all" and s.fused}


# ---- the shared typer options --------------------------------------------------------------------
ARMS_HELP = ("Comma list of arms: torch, exact, approx, cuda (native CUDA C++) or "
             "NAME=norm:exact/rope:off/act:approx/scope:all; a repeated name is an A/A arm "
             "(torch,torch -> torch#2).")


def _override_help(key: str) -> str:
    values = "|".join(SCOPES if key == "scope" else IMPLS)
    default = " Default: graph where the run has CUDA graphs, all where it has none."
    default = default if key == "scope" else ""
    return f"Set {key} ({values}) on every named arm except torch.{default}"


ArmsOption = Annotated[str, typer.Option("--arms", help=ARMS_HELP)]
NormOption = Annotated[str | None, typer.Option("--norm", help=_override_help("norm"))]
RopeOption = Annotated[str | None, typer.Option("--rope", help=_override_help("rope"))]
ActOption = Annotated[str | None, typer.Option("--act", help=_override_help("act"))]
ScopeOption = Annotated[str | None, typer.Option("--scope", help=_override_help("scope"))]


def override_flags(norm: str | None = None, rope: str | None = None, act: str | None = None,
              scope: str | None = None) -> dict[str, str | None]:
    """The per-setting flags as the `overrides` argument of `parse_arms`."""
    return {"norm": norm, "rope": rope, "act": act, "scope": scope}


__all__ = ["ARMS", "NOT_EXERCISED", "ArmSpec", "ArmsOption", "ActOption", "NormOption", "RopeOption",
           "ScopeOption", "default_scope", "eager_kernel_arms", "eager_reference_arms", "is_exact",
           "override_flags", "parse_arms", "reference_arm", "scope_notes", "unexercised_arms"]
