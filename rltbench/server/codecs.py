"""Which text codec (tokenizer) `rltbench serve` uses: `--tokenizer PATH | fallback | ids`, else the
checkpoint's own, else none (token-id prompts only).

- PATH: a tokenizer.json (or a directory holding one), as `rltbench gsm8k --tokenizer`.
- fallback: the gsm8k gate's byte-level BPE trained on the GSM8K train text (vocab at most 4096): real
  text in, real text out, but ids above its vocab (most of what random weights generate) decode to "".
- ids: one word per token id, `t0 t1 ... t<vocab-1>`, whitespace separated. Made for benchmarking
  random weights with clients that count tokens with a tokenizer (peer benchmark clients): every id
  has text, and encode(decode(ids)) == ids, so a client's token counts equal the engine's. Any other
  word encodes to id 0.
`export_hf_tokenizer` writes the codec as a Hugging Face tokenizer directory so a client can load the
very same tokenizer (`AutoTokenizer.from_pretrained(DIR)`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from rltbench import textcodec
from rltbench.errors import UsageError
from rltbench.textcodec import TextCodec

SPECIAL = ("fallback", "ids")
ID_WORD = "t{}"


def id_word_tokenizer(vocab_size: int) -> Any:
    """A `tokenizers.Tokenizer` mapping id i <-> the word `t<i>` (WordLevel, whitespace split)."""
    vocab = {ID_WORD.format(i): i for i in range(int(vocab_size))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=ID_WORD.format(0)))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    return tok


def make_codec(spec: str | None, model_config: Any, checkpoint_tokenizer: Any = None) -> TextCodec | None:
    """The codec for `--tokenizer spec` (None: the checkpoint's tokenizer, or no codec)."""
    vocab = int(model_config.vocab_size)
    eos = tuple(int(t) for t in (getattr(model_config, "eos_token_ids", None) or ()))
    if spec is None:
        if checkpoint_tokenizer is None:
            return None
        return textcodec.wrap(checkpoint_tokenizer, "checkpoint tokenizer.json")
    if spec == "ids":
        return TextCodec(id_word_tokenizer(vocab), f"id words t0..t{vocab - 1} (one word per token id)", eos)
    if spec == "fallback":
        codec = textcodec.fallback_codec(vocab)
        codec.eos_token_ids = eos
        return codec
    codec = textcodec.load_tokenizer_file(spec)
    size = codec.vocab_size()
    if size is not None and size > vocab:
        raise UsageError(f"--tokenizer {spec}: vocab {size} exceeds the model's vocab {vocab}")
    return codec


def export_hf_tokenizer(codec: TextCodec, out_dir: str | Path, max_model_len: int) -> Path:
    """Write `codec` as tokenizer.json + tokenizer_config.json (PreTrainedTokenizerFast) in `out_dir`."""
    raw = getattr(codec, "_raw", None)
    if raw is None:
        raise UsageError("--export-tokenizer: this tokenizer has no tokenizer.json form")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": int(max_model_len),
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return out
