"""Typed launch configs of the RMSNorm kernels: code default, tuned-file override, search space.

Each config is a frozen dataclass read once from its section of the per-GPU tuned file
(rltbench/tuned.py: ``tuned.config(OneLaunchConfig)``); a field the file does not set keeps its
code default. ``rltbench tune kernels`` times every configuration of ``search_space()`` (after its
bitwise check) and writes the best back as a section. Kernels also take a config argument, so the
tuner and the tests run a configuration without touching global state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rltbench import tuned

LAYOUTS = ("lowwarp", "general")
TREES = ("tl_sum", "halvings")
MAX_WARPS = 16
PDL_MODES = (0, 1, 2)
# the approx norm's PDL configurations apply from this many rows: PDL helped at T=4096 and made
# the decode step slower where it was tried (results/gpu/profile-pdl1, -pdl2)
PDL_MIN_ROWS = 1024


def _pow2(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and v & (v - 1) == 0


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@tuned.register
@dataclass(frozen=True)
class OneLaunchConfig:
    """Layout of the exact one-launch norm (onelaunch.py).

    ``lowwarp``: torch's lanes with the warps on the lowest lane bits (one shared-memory exchange
    per reduction), ``warps`` warps per program at 512 lanes, its last levels as Triton's own
    butterfly (``tree="tl_sum"``, GPU only) or as explicit size-2 halvings. ``general``: one flat
    lane tile, every plan (also the shapes lowwarp does not take). The code default is the H200's
    tuned choice (results/gpu/tune: 1.02x the best per decode-sized case, geometric mean; the
    general layout 2.16x), so an untuned GPU runs it too; the start-up validation still decides
    per GPU, torch version, dtype and width, and falls back to the general layout.

    lowwarp only: below ``two_pass_min_rows`` rows a row is read once and kept in registers (one
    row's latency decides at decode sizes); from it a row is read twice, the sum and then the
    output, with fewer live registers, so more rows are in flight (docs/onelaunch_norm.md has the
    measurements). ``packed`` (bf16/fp16 on the GPU): the epilogue's dtype multiply and residual
    add as packed 16-bit instructions, two elements each, the same values with about a third fewer
    instructions (at 128 rows of width 2048 one warp runs a row's 64 values per thread alone).
    ``stream`` (two passes, plain form only): the row's reads marked evict-first and the output
    stored streaming, as the approx norm's tuned launch does; at 4096 rows of width 2048 it was
    faster than without, beyond the spread of an A/A copy, in an H200 side comparison
    (docs/onelaunch_norm.md), so it is the default. ``stream_rows`` (two passes, plain form, torch's
    32-lane plan, width <= 2048): rows per program of the several-rows kernel, one warp each (1:
    the one-row kernel); 4 was the fastest of 1, 2, 4, 8, 16 and 32 at 4096 x 2048 in an H200 side
    comparison. ``wide_registers`` (16-bit rows wider than 2048 at torch's 32-lane plan with
    ``packed``, the plain and add forms): a row is read once and held in registers as dtype values
    until its output is written, instead of two passes. At width 5280 on the H200 it was faster than
    the two passes at 16..8192 rows, except the plain form at 2048 rows, within 1% of them (side
    comparisons with rotated outputs, docs/onelaunch_norm.md), so every such row count takes it.
    """

    SECTION: ClassVar[str] = "norm_onelaunch"
    layout: str = "lowwarp"
    warps: int = 4
    tree: str = "tl_sum"
    two_pass_min_rows: int = 1024
    packed: bool = True
    stream: bool = True
    stream_rows: int = 4
    wide_registers: bool = True

    def __post_init__(self) -> None:
        _require(self.layout in LAYOUTS, f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        _require(_pow2(self.warps) and self.warps <= MAX_WARPS,
                 f"warps must be a power of two in 1..{MAX_WARPS}, got {self.warps!r}")
        _require(self.tree in TREES, f"tree must be one of {TREES}, got {self.tree!r}")
        _require(isinstance(self.two_pass_min_rows, int) and not isinstance(self.two_pass_min_rows, bool)
                 and self.two_pass_min_rows >= 1,
                 f"two_pass_min_rows must be an integer >= 1, got {self.two_pass_min_rows!r}")
        _require(isinstance(self.packed, bool), f"packed must be true or false, got {self.packed!r}")
        _require(isinstance(self.stream, bool), f"stream must be true or false, got {self.stream!r}")
        _require(_pow2(self.stream_rows) and self.stream_rows <= MAX_WARPS,
                 f"stream_rows must be a power of two in 1..{MAX_WARPS}, got {self.stream_rows!r}")
        _require(isinstance(self.wide_registers, bool),
                 f"wide_registers must be true or false, got {self.wide_registers!r}")

    @classmethod
    def from_section(cls, value: Any) -> OneLaunchConfig:
        return cls(**tuned.fields_of(cls, value))

    @property
    def name(self) -> str:
        """The configuration's name in tuning results ("general", "lowwarp-flat-sum-w4", ...)."""
        if self.layout == "general":
            return "general"
        return (f"lowwarp-flat-{'sum' if self.tree == 'tl_sum' else 'halve'}-w{self.warps}"
                + ("" if self.packed else "-fp32epi") + ("" if self.stream else "-nostream")
                + ("" if self.stream_rows == 4 else f"-rows{self.stream_rows}")
                + ("" if self.wide_registers else "-widetwopass"))

    @classmethod
    def search_space(cls) -> dict[str, OneLaunchConfig]:
        """What the tuner times: the general layout and lowwarp at 1, 2, 4 warps with either tree
        (more warps split 512 lanes into fewer per thread than the loads need; 8 and 16 measured
        slower on the H200)."""
        space = [cls(layout="general")]
        space += [cls(warps=w, tree=t) for t in TREES for w in (1, 2, 4)]
        space += [cls(packed=False)]   # the fp32 epilogue of the default layout
        space += [cls(stream_rows=1)]  # one row per program in the two-pass plain form
        return {c.name: c for c in space}


@tuned.register
@dataclass(frozen=True)
class ExactNormRouting:
    """Which exact kernel serves a call (the dispatch table in norm/__init__.py reads it).

    ``onelaunch``: False keeps every exact norm on the 3-launch path. ``wide_min_rows``: rows wider
    than WIDE_ROW take the one-launch kernel only from this many rows (1: at every row count). It
    was 128 while the one-launch kernel ran such rows one program per row on the general layout,
    slower than three launches at decode sizes; on the low-warp layout Huginn's width 5280 takes
    about half the 3-launch time at 1 and 8 rows (docs/onelaunch_norm.md, "Width 5280"), so every
    row count now takes it. A tuned file can set a GPU's own threshold.
    """

    SECTION: ClassVar[str] = "norm_exact"
    WIDE_ROW: ClassVar[int] = 4096
    onelaunch: bool = True
    wide_min_rows: int = 1

    def __post_init__(self) -> None:
        _require(isinstance(self.onelaunch, bool), f"onelaunch must be true or false, got {self.onelaunch!r}")
        _require(isinstance(self.wide_min_rows, int) and self.wide_min_rows >= 1,
                 f"wide_min_rows must be an integer >= 1, got {self.wide_min_rows!r}")

    @classmethod
    def from_section(cls, value: Any) -> ExactNormRouting:
        return cls(**tuned.fields_of(cls, value))

    def takes_onelaunch(self, rows: int, width: int) -> bool:
        """Whether `rows` rows of `width` may take the one-launch kernel (before its trust check)."""
        return self.onelaunch and (width <= self.WIDE_ROW or rows >= self.wide_min_rows)


@dataclass(frozen=True)
class ApproxNormLaunch:
    """Launch of the approx norm at one width.

    ``rows`` per program (power of two); ``warps`` (None: by tile size, as Liger's
    calculate_settings); ``persist`` > 0: the persistent kernel with that many programs per SM and
    ``stages`` software-pipeline stages; ``stream``: evict-first loads and streaming stores;
    ``wload``: the one-row kernel's weight load before the row (0), after it (1), before it and
    evict-last (2); ``pdl``: programmatic dependent launch mode (pdl.py) from ``pdl_min_rows`` rows.
    """

    rows: int = 1
    warps: int | None = None
    persist: int = 0
    stages: int = 1
    stream: bool = False
    wload: int = 0
    pdl: int = 0
    pdl_min_rows: int = 0

    def __post_init__(self) -> None:
        _require(_pow2(self.rows), f"rows must be a power of two, got {self.rows!r}")
        _require(self.warps is None or _pow2(self.warps),
                 f"warps must be a power of two, got {self.warps!r}")
        _require(isinstance(self.persist, int) and self.persist >= 0,
                 f"persist must be >= 0, got {self.persist!r}")
        _require(isinstance(self.stages, int) and self.stages >= 1,
                 f"stages must be >= 1, got {self.stages!r}")
        _require(self.wload in (0, 1, 2), f"wload must be 0, 1 or 2, got {self.wload!r}")
        _require(self.pdl in PDL_MODES, f"pdl must be one of {PDL_MODES}, got {self.pdl!r}")
        _require(isinstance(self.pdl_min_rows, int) and self.pdl_min_rows >= 0,
                 f"pdl_min_rows must be >= 0, got {self.pdl_min_rows!r}")
        object.__setattr__(self, "stream", bool(self.stream))

    @property
    def name(self) -> str:
        """The configuration's name in tuning results ("rows1-w4-stream-pdl2", "persist8-s3-w8")."""
        w = "" if self.warps is None else f"-w{self.warps}"
        base = f"persist{self.persist}-s{self.stages}{w}" if self.persist else f"rows{self.rows}{w}"
        return (base + ("-stream" if self.stream else "") + (f"-pdl{self.pdl}" if self.pdl else "")
                + {0: "", 1: "-wafter", 2: "-wlast"}[self.wload])

    def pdl_mode(self, rows: int) -> int:
        """The PDL mode requested for a launch over `rows` rows."""
        return self.pdl if rows >= self.pdl_min_rows else 0

    @classmethod
    def search_space(cls) -> dict[str, ApproxNormLaunch]:
        """What the tuner times at T=4096: rows x warps, the persistent kernel (programs per SM x
        stages x warps), streaming on the best of those, where the weight is loaded, two rows per
        program, and PDL (weight before the wait, or after the row)."""
        space = [cls(rows=1, warps=w) for w in (4, 8)]
        space += [cls(persist=p, stages=s, warps=4) for p in (4, 8, 12, 16) for s in (3, 4, 5)]
        space += [cls(persist=8, stages=s, warps=w) for s in (3, 4) for w in (2, 8)]
        space += [cls(rows=1, warps=4, stream=True), cls(rows=1, warps=8, stream=True),
                  cls(persist=8, stages=3, warps=2, stream=True),
                  cls(persist=4, stages=5, warps=4, stream=True)]
        space += [cls(warps=4, stream=s, wload=wl) for s in (False, True) for wl in (1, 2)]
        space += [cls(rows=2, warps=w) for w in (4, 8)]
        space += [cls(warps=w, stream=s, pdl=m, wload=wl, pdl_min_rows=PDL_MIN_ROWS)
                  for w, s, m, wl in ((4, True, 1, 0), (4, True, 2, 0), (4, True, 2, 1), (8, False, 2, 0),
                                      (8, True, 2, 0))]
        return {c.name: c for c in space}


@tuned.register
@dataclass(frozen=True)
class ApproxNormConfig:
    """The approx norm's launch per width: ``by_width`` entries (tuned at the models' widths) over
    the section's ``default``, each field falling back to the code default."""

    SECTION: ClassVar[str] = "norm_approx"
    default: ApproxNormLaunch = ApproxNormLaunch()
    by_width: Mapping[int, ApproxNormLaunch] = field(default_factory=dict)

    @classmethod
    def from_section(cls, value: Any) -> ApproxNormConfig:
        base = tuned.fields_of(ApproxNormLaunch, value)
        table = value.get("by_width", {}) if isinstance(value, Mapping) else {}
        if not isinstance(table, Mapping):
            raise TypeError("by_width must be a JSON object keyed by width")
        by_width = {int(w): ApproxNormLaunch(**{**base, **tuned.fields_of(ApproxNormLaunch, entry)})
                    for w, entry in table.items()}
        return cls(ApproxNormLaunch(**base), by_width)

    def for_width(self, width: int) -> ApproxNormLaunch:
        return self.by_width.get(width, self.default)


def as_section(config: Any) -> dict[str, Any]:
    """A config's fields as a tuned-file section (what ``from_section`` reads back)."""
    return dataclasses.asdict(config)
