"""The prompt lengths of `rltbench prefill`, per model, decided before any run directory exists.

Why a module: the default length (2048) does not fit a tiny preset's 512-token context, and
`prefill --models ouro-tiny` stopped on its own default. Like e2e's burst lengths
(`rltbench.bench.workload.fit_burst_lengths`), a default shortens to fit and says so; a length the
user gave must fit, or the error names the flag and a value that works.
"""

from __future__ import annotations

from rltbench import options, runtime
from rltbench.errors import UsageError

DEFAULT_INPUT_LEN = 2048  # the study's prompt length, where the model's context holds it
LONGEST = "max"  # an --input-lens item: the longest prompt the model's context allows


def _parse(text: str) -> list[str]:
    """The items of --input-lens: positive integers or 'max', in the given order."""
    items = options.comma_list(text, "--input-lens", f"{DEFAULT_INPUT_LEN},{LONGEST}")
    for part in items:
        if part != LONGEST and not (part.isdigit() and int(part) >= 1):
            raise UsageError(f"--input-lens: {part!r} is not a positive length or '{LONGEST}'")
    return items


def prompt_lengths(text: str | None, models: list[str],
                   output_len: int) -> tuple[dict[str, list[int]], str | None]:
    """(per model the prompt lengths, note). `text` None is the default: DEFAULT_INPUT_LEN, or the
    longest the model's context allows (context - output_len) where that is shorter, which the
    note says in one line. A given length a model cannot hold is a UsageError, not a silent skip."""
    items = _parse(text) if text is not None else None
    out: dict[str, list[int]] = {}
    shortened: list[str] = []
    for name in models:
        ctx = int(runtime.ModelSource(name).config().max_position_embeddings)
        room = ctx - output_len
        if room < 1:
            raise UsageError(f"--output-len {output_len} leaves no prompt room in {name}'s context of {ctx}: "
                             f"use --output-len {max(1, ctx // 4)} or less")
        if items is None:
            lens = [min(DEFAULT_INPUT_LEN, room)]
            if lens[0] < DEFAULT_INPUT_LEN:
                shortened.append(f"{lens[0]} for {name} (context {ctx})")
        else:
            lens = list(dict.fromkeys(room if part == LONGEST else int(part) for part in items))
            too_long = [n for n in lens if n > room]
            if too_long:
                raise UsageError(f"--input-lens {too_long[0]} + --output-len {output_len} exceeds {name}'s "
                                 f"context of {ctx}: use --input-lens {room} or less (or '{LONGEST}')")
        out[name] = lens
    note = None
    if shortened:
        note = (f"--input-lens {', '.join(shortened)}: the default {DEFAULT_INPUT_LEN} + {output_len} "
                "generated tokens do not fit; each is the longest prompt its model's context allows")
    return out, note
