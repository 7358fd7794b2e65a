"""The pieces every command's table.md is assembled from.

A report is a list of small section functions, each taking the analysed run and returning its lines
(an empty list when it has nothing to say); `render_sections` joins them. The blocks the reports share
(title, bold notes, the random-weights caption, bullet lists, headed sections) live here so that each
command states only what it shows, and the same wording comes out of every command.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rltbench.results.serving import METRIC_DEFINITIONS
from rltbench.results.serving_stats import random_weights_line

Section = Callable[[Any], list[str]]


def render_sections(sections: Sequence[Section], data: Any) -> str:
    """The markdown of `data`: every section's lines in order, one per line."""
    return "\n".join(line for section in sections for line in section(data))


def title(text: str) -> list[str]:
    """The report's first line ('# rltbench CMD: ...') and the blank line after it."""
    return [f"# {text}", ""]


def bold(text: str) -> list[str]:
    """A paragraph in bold: the warnings a reader must not miss."""
    return [f"**{text}**", ""]


def notes(items: Iterable[str]) -> list[str]:
    """One bold '**note: ...**' paragraph per note (the manifest's notes and the report's own)."""
    return [line for note in items for line in bold(f"note: {note}")]


def random_weights(on: bool, no_verdict: str | None) -> list[str]:
    """The random-weights caption under the title, or nothing when the weights are real."""
    return [random_weights_line(no_verdict), ""] if on else []


def bullets(items: Iterable[str]) -> list[str]:
    """A bullet list and the blank line after it (the run header: backend, device, status...)."""
    return [*(f"- {item}" for item in items), ""]


def heading(text: str, level: int = 2) -> list[str]:
    """A section heading with blank lines on both sides, for sections that follow a table."""
    return ["", f"{'#' * level} {text}", ""]


def explained_table(text: str, explanation: str, table_lines: Sequence[str]) -> list[str]:
    """A headed section whose paragraph says how to read the table under it."""
    return [*heading(text), explanation, "", *table_lines]


def metric_definitions() -> list[str]:
    """The serving reports' closing section: what TTFT, TPOT, ITL, E2E and tok/s mean."""
    return ["## Metric definitions", "", METRIC_DEFINITIONS, ""]
