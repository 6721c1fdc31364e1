"""The tiny Qwen3-TTS fixture checkpoints (tests/fixtures) as live gateways use them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CLONE_WAV = FIXTURES / "qwen3_tts_tiny_clone.wav"


def greedy_copy(name: str, tmp: Path) -> Path:
    """The fixture checkpoint (its speech_tokenizer link resolved) with greedy sampling, so the same text
    and voice give the same audio."""
    ckpt = tmp / name
    shutil.copytree(FIXTURES / name, ckpt)
    gen = json.loads((ckpt / "generation_config.json").read_text())
    (ckpt / "generation_config.json").write_text(
        json.dumps({**gen, "do_sample": False, "subtalker_dosample": False})
    )
    return ckpt
