"""Generated ids -> text, incrementally, with OpenAI stop strings.

Incremental detokenization follows vLLM's offsets scheme: decode a short window of ids twice (without
and with the new ids) and emit the difference, starting from the prompt's last ids so the first token
gets the spacing it has in context; text ending in U+FFFD (an incomplete UTF-8 sequence of a
byte-level tokenizer) is held until the next id completes it. Stop strings: the text is searched
after every delta; the returned text stops before the earliest stop string (OpenAI semantics), and
while the request runs the last `len(longest stop) - 1` characters are held back so no emitted text
can turn out to be the start of a stop string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PROMPT_CONTEXT_IDS = 5  # prompt ids decoded with the first new id (spacing of the first token)


class TextStream:
    """One request's output text. `codec` None (no tokenizer): every delta is ""."""

    def __init__(self, codec: Any, prompt_ids: Sequence[int], stop: Sequence[str] = ()) -> None:
        self.codec = codec
        self.stop = tuple(s for s in stop if s)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.ids = list(prompt_ids[-PROMPT_CONTEXT_IDS:]) if codec is not None else []
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""  # output text so far (cut at a stop string once one is found)
        self.sent = 0  # characters of `text` already returned
        self.stopped = False  # a stop string was found

    def _decode_new(self) -> str:
        prefix = self.codec.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.codec.decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return full[len(prefix) :]
        return ""

    def add(self, token_ids: Sequence[int], final: bool = False, drop_last: bool = False) -> str:
        """Feed new ids; returns the text that may be sent now. `final`: the request ends here (flush
        what was held). `drop_last`: the last id is a stop id (EOS or a one-token stop string) whose
        text is not part of the output."""
        if self.codec is None or self.stopped:
            return ""
        ids = list(token_ids[:-1] if drop_last else token_ids)
        if ids:
            self.ids.extend(ids)
            start = max(0, len(self.text) - self.hold)
            self.text += self._decode_new()
            if self.stop:
                cuts = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
                if cuts:
                    self.text = self.text[: min(cuts)]
                    self.stopped = True
        end = len(self.text) if (final or self.stopped) else max(self.sent, len(self.text) - self.hold)
        delta = self.text[self.sent : end]
        self.sent = end
        return delta
