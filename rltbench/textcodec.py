"""Text <-> token ids for the gate: one small adapter over whatever tokenizer we were given.

Why an adapter: the engine works on token ids, lm-eval on text. The tokenizer may be the one
`rltbench.models.load_model` returns, a `tokenizers.Tokenizer` from `--tokenizer PATH`, or (random
weights, no tokenizer given) a fallback byte-level BPE trained in-process on the GSM8K train text.
Random weights produce meaningless text anyway; the fallback only has to be a real, reversible,
deterministic tokenizer whose ids fit in the model's vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from rltbench.errors import UsageError

FALLBACK_MAX_VOCAB = 4096
# The GSM8K files shipped with rltbench (MIT): the gate's questions, and the text the fallback
# tokenizer is trained on.
GSM8K_DATA_DIR = Path(__file__).resolve().parent / "data" / "gsm8k"
BYTE_ALPHABET = 256


class TextCodec:
    """encode/decode/stop ids over a `tokenizers.Tokenizer` or a duck-typed wrapper.

    `encode` never adds special tokens (lm-eval's causal-LM convention: the prompt is the text).
    `decode` drops special tokens so an EOS id at the end of an output adds no text.
    """

    def __init__(self, tok: Any, source: str, eos_token_ids: tuple[int, ...] = ()):
        self.tok = tok
        self.source = source
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        self._raw = _raw_tokenizer(tok)

    def encode(self, text: str) -> list[int]:
        if self._raw is not None:
            return list(self._raw.encode(text, add_special_tokens=False).ids)
        ids = self.tok.encode(text)
        return list(ids.ids if hasattr(ids, "ids") else ids)

    def decode(self, ids: list[int]) -> str:
        if self._raw is not None:
            return self._raw.decode(list(ids), skip_special_tokens=True)
        return self.tok.decode(list(ids))

    def token_id(self, text: str) -> int | None:
        """Id of `text` if it is a single token of the vocabulary (e.g. '<|im_end|>'), else None."""
        if self._raw is not None:
            return self._raw.token_to_id(text)
        fn = getattr(self.tok, "token_to_id", None)
        return fn(text) if callable(fn) else None

    def vocab_size(self) -> int | None:
        if self._raw is not None:
            return self._raw.get_vocab_size(with_added_tokens=True)
        fn = getattr(self.tok, "vocab_size", None)
        return (fn() if callable(fn) else fn) if fn is not None else None

    def stop_token_ids(self, stop_strings: list[str], model_eos: tuple[int, ...] = ()) -> tuple[int, ...]:
        """Model EOS ids, the tokenizer's EOS ids, and every stop string that is a single token."""
        ids = set(model_eos) | set(self.eos_token_ids)
        for s in stop_strings:
            tid = self.token_id(s)
            if tid is not None:
                ids.add(int(tid))
        return tuple(sorted(ids))


def _raw_tokenizer(tok: Any) -> Any:
    """The underlying `tokenizers.Tokenizer` if there is one (directly or as an attribute)."""
    if isinstance(tok, Tokenizer):
        return tok
    for attr in ("tokenizer", "_tokenizer", "tok", "_tok"):
        inner = getattr(tok, attr, None)
        if isinstance(inner, Tokenizer):
            return inner
    return None


def _eos_of(tok: Any) -> tuple[int, ...]:
    for attr in ("eos_token_ids", "eos_ids", "eos_token_id"):
        val = getattr(tok, attr, None)
        if val is None:
            continue
        if isinstance(val, int):
            return (val,)
        try:
            return tuple(int(v) for v in val)
        except TypeError:
            continue
    return ()


def wrap(tok: Any, source: str) -> TextCodec:
    """Adapter over a tokenizer returned by `load_model` (or anything with encode/decode)."""
    return TextCodec(tok, source, _eos_of(tok))


def load_tokenizer_file(path: str | Path) -> TextCodec:
    """`--tokenizer PATH`: a tokenizer.json file or a directory holding one."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise UsageError(f"tokenizer file not found: {p}")
    try:
        tok = Tokenizer.from_file(str(p))
    except Exception as exc:  # tokenizers raises a bare Exception on a bad file
        raise UsageError(f"cannot read tokenizer {p}: {exc}") from None
    eos: tuple[int, ...] = ()
    for name in ("<|endoftext|>", "</s>", "<|im_end|>", "<eos>"):
        tid = tok.token_to_id(name)
        if tid is not None:
            eos += (tid,)
    return TextCodec(tok, f"file:{p}", eos)


def train_fallback_tokenizer(texts: list[str], model_vocab: int, max_vocab: int = FALLBACK_MAX_VOCAB) -> Any:
    """A byte-level BPE trained on `texts`, vocab = min(model_vocab, max_vocab) (>= 256 bytes).

    No special tokens (a vocab of exactly 256, as in the tiny presets, holds only the bytes); the
    model's EOS ids stop generation. Deterministic for the same texts and vocab size.
    """
    vocab = min(int(model_vocab), int(max_vocab))
    if vocab < BYTE_ALPHABET:
        raise UsageError(
            f"model vocab {model_vocab} < 256: a byte-level fallback tokenizer cannot fit; "
            "pass --tokenizer PATH"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
        min_frequency=2,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def gsm8k_train_texts(data_dir: Path) -> list[str]:
    rows = []
    with open(Path(data_dir) / "train.jsonl", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                obj = json.loads(line)
                rows.append(f"Question: {obj['question']}\nAnswer: {obj['answer']}\n\n")
    return rows


def fallback_codec(
    model_vocab: int, data_dir: Path = GSM8K_DATA_DIR, max_vocab: int = FALLBACK_MAX_VOCAB
) -> TextCodec:
    tok = train_fallback_tokenizer(gsm8k_train_texts(data_dir), model_vocab, max_vocab)
    return TextCodec(tok, f"fallback byte-level BPE (vocab {tok.get_vocab_size()}, trained on GSM8K train)")
