"""Small real checkpoints, built locally: a random-init tiny PI0 saved with ``save_pretrained`` beside a small
tokenizer trained here (a sentencepiece-style BPE with Gemma's special ids: 0 pad, 1 eos, 2 bos, 3 unk),
as a converted openpi checkpoint is laid out. Nothing is downloaded."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

CORPUS = [
    "pick up the red cup",
    "open the drawer and put the food on the plate",
    "fold the towel",
    "do something",
    "Task: transfer the cube, State: 0 12 127 128 255 31 64;\nAction: ",
]


@functools.lru_cache(maxsize=1)
def _trained() -> Any:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "▁")  # sentencepiece's whitespace, no dummy prefix (Gemma's)
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    alphabet = [chr(c) for c in range(32, 127)] + ["▁", "\n"]
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"], initial_alphabet=alphabet
    )
    tok.train_from_iterator(CORPUS * 10, trainer)
    return tok


def save_tokenizer(path: Path) -> int:
    """Write the small tokenizer into ``path`` (tokenizer.json, tokenizer_config.json); returns its size."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=_trained(),
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    hf.save_pretrained(str(path))
    return len(hf)


def save_checkpoint(
    path: Path, vocab: int, tokenizer: bool = True, policy: str = "pi0", **config: Any
) -> Path:
    """A tiny PI0 (or π0.5: ``policy="pi05"``) with a ``vocab``-token text vocabulary (``image_token_id``
    just past it, as PI0), saved by ``save_pretrained``; with the small tokenizer beside it unless
    ``tokenizer`` is False. π0.5's adaptive norms get random weights, as a trained checkpoint has."""
    from realtime_gw.models.policy.factory import _randomize_adaptive_norms, model_class, policy_model_config

    cfg = policy_model_config(policy, "tiny")
    cfg.vlm_config.text_config.vocab_size = vocab
    cfg.dit_config.vocab_size = vocab
    cfg.vlm_config.image_token_id = vocab
    for key, value in config.items():
        setattr(cfg, key, value)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        model = model_class(policy)(cfg).eval()
        _randomize_adaptive_norms(model)
    model.save_pretrained(str(path))
    if tokenizer:
        save_tokenizer(path)
    return path
