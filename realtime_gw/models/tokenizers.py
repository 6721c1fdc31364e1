"""Text tokenizers shared by the models: UTF-8 bytes for random-init weights, or a tokenizer saved next
to the weights. The PI0 prompt and the codec TTS text feed use the same two, each through the fields
it needs (PI0: ``bos_id``; the talker: ``pad_id`` and ``vocab_size``)."""

from __future__ import annotations

from pathlib import Path

BYTE_TOKENIZER_NAME = "byte-level (random-init model)"


class ByteTokenizer:
    """UTF-8 bytes as tokens, for random-init models that come without a tokenizer.

    Ids follow Gemma's specials (0 pad, 1 eos, 2 bos); byte ``b`` is id ``b + 3``. ``name`` is what the
    model's metadata reports (a caller may say which real tokenizer it stands in for)."""

    pad_id = 0
    eos_id = 1
    bos_id = 2
    vocab_size = 259

    def __init__(self, name: str = BYTE_TOKENIZER_NAME) -> None:
        self.name = name

    def encode(self, text: str) -> list[int]:
        return [b + 3 for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        """Ids back to text; ids that are no byte (specials, a larger model vocabulary) are skipped and an
        invalid UTF-8 sequence becomes U+FFFD."""
        return bytes(i - 3 for i in ids if 3 <= i < 259).decode("utf-8", errors="replace")


class HfTokenizer:
    """A tokenizer saved in the weight directory (``AutoTokenizer``, local files only).

    ``literal``: special-token text in the input (``"<bos>"``, ``"<image>"``) is encoded as plain text, as
    sentencepiece does (openpi's tokenizer), never as the special token itself."""

    def __init__(self, path: str | Path, literal: bool = False) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.name = f"{type(self._tok).__name__} from {path}"
        bos, pad = self._tok.bos_token_id, self._tok.pad_token_id
        self.bos_id = int(bos if bos is not None else 2)
        self.pad_id = int(pad if pad is not None else 0)
        self.vocab_size = len(self._tok)
        self.base_vocab_size = int(self._tok.vocab_size)
        """Without tokens added after training (e.g. PaliGemma's ``<image>``, which prompts never produce)."""
        self.literal = literal

    def encode(self, text: str) -> list[int]:
        if self.literal:
            return list(self._tok.encode(text, add_special_tokens=False, split_special_tokens=True))
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Ids back to text, special tokens (padding, BOS/EOS) left out."""
        return str(self._tok.decode(ids, skip_special_tokens=True))


def has_tokenizer_files(path: str | Path, names: tuple[str, ...] | None = None) -> bool:
    """Whether ``path`` holds tokenizer files (``names``, by default any file ``AutoTokenizer`` reads)."""
    p = Path(path)
    names = names or ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
    return any((p / f).exists() for f in names)
