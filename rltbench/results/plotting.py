"""Matplotlib for every command's plots, headless (Agg), imported on first use.

Why lazily: matplotlib and pyplot cost about 0.6 s to import, which `rltbench --help` and every command
that draws nothing would pay; this module is the only place that imports them.
"""

from __future__ import annotations

import io
from typing import Any

from rltbench.results.stats import base_arm

ARM_COLORS = {"torch": "#4C72B0", "exact": "#55A868", "approx": "#C44E52", "cuda": "#DD8452"}


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend."""
    import matplotlib  # heavy (see the module docstring): loaded by the first plot only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def arm_color(arm: str) -> str:
    return ARM_COLORS.get(base_arm(arm), "#8172B2")


def figure(width: float = 7.0, height: float = 4.5, rows: int = 1, cols: int = 1, **kw: Any) -> Any:
    """(figure, axes) of a new `rows` x `cols` figure of `width` x `height` inches."""
    return pyplot().subplots(rows, cols, figsize=(width, height), **kw)


def colormap(name: str) -> Any:
    return pyplot().colormaps[name]


def log_axis(ax: Any, ticks: list[int], label: str) -> None:
    """A log x axis labelled with exactly `ticks` (no minor tick labels)."""
    from matplotlib.ticker import NullFormatter  # loaded with pyplot by the figure this axis is on

    ax.set_xscale("log")
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(c) for c in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(label)


def caveat(fig: Any, reasons: list[str | None]) -> None:
    """Write on the figure itself why its numbers carry no verdict (CPU timings, the Triton
    interpreter, random weights): a plot is often seen without the table that says so."""
    text = "; ".join(r for r in reasons if r)
    if text:
        # below the figure (the saved PNG's tight box grows to hold it), clear of titles and legends
        fig.text(0.5, -0.01, text, ha="center", va="top", fontsize=8, color="#b22222")


def png_bytes(fig: Any) -> bytes:
    """The figure as PNG bytes; the figure is closed (pyplot keeps every open figure alive)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    pyplot().close(fig)
    return palette_png(buf.getvalue())


def palette_png(png: bytes) -> bytes:
    """A plot's PNG in 256 colours: line plots carry a few dozen colours, and an 8-bit palette
    image is about a third of matplotlib's RGBA one, which keeps committed runs inside the
    results budget (Pillow comes with matplotlib)."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    img.save(out, format="PNG", optimize=True)
    return out.getvalue()
