"""PersonaPlex's voices: named voice prompts, each the Mimi codes of a voice sample, computed once.

A voice directory (``--s2s-voices-dir``) holds samples, ``NAME.wav`` (or ``.flac``/``.ogg``: anything
soundfile reads; any rate, channels mixed down). At stage start each sample is brought to the reference's
prompt audio (24 kHz, -24 LUFS integrated, ITU-R BS.1770 as ``pyloudnorm`` measures it) and encoded by
the stage's own Mimi into codes, one frame per 80 ms (``MoshiEngine.encode_voice``), kept beside it as
``NAME.prompt.npz`` (the codes, the codec's card and codebooks, the sample's size and mtime; mode 0600,
written whole: ``models/private_files.py``, as the voice library writes its files): a restart
reads the codes instead of encoding again, a changed sample or another codec encodes again. A voice may
be its ``.prompt.npz`` alone (the operator may remove the sample once encoded). Names are the file stems
(``[A-Za-z0-9_.-]``, at most 64 characters).

NVIDIA's published voices (``voices.tgz``: ``NATF0.pt`` ...) are read as they are: the reference's saved
input embeddings of the voice's columns and its token cache (``prompt.VoiceEmbeddings``), checked against
the model's width and streams (``torch.load`` with ``weights_only``: tensors only, no code). Made by a
model's weights, they are only meaningful with those weights (nvidia/personaplex-7b-v1). A name with both
a ``.pt`` and a sample takes the ``.pt`` (NVIDIA's own prompt state).
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from realtime_gw.models.private_files import write_private
from realtime_gw.models.s2s.config import MoshiShape
from realtime_gw.models.s2s.prompt import VoiceEmbeddings
from realtime_gw.protocols.loudness import RATE, normalized

__all__ = ["CODES_SUFFIX", "VoicePrompts", "normalized_sample"]

log = logging.getLogger(__name__)

Voice = np.ndarray | VoiceEmbeddings
"""A voice prompt: Mimi codes ``(F, q)``, or a published voice's embeddings."""
SAMPLE_EXTS = (".wav", ".flac", ".ogg")
PUBLISHED_EXT = ".pt"
CODES_SUFFIX = ".prompt.npz"
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
def normalized_sample(path: Path) -> np.ndarray:
    """A voice sample as the reference's ``load_voice_prompt`` has it: mono float at 24 kHz, -24 LUFS."""
    import soundfile
    import soxr

    pcm, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    mono = pcm.mean(axis=1)
    if rate != RATE:
        mono = soxr.resample(mono, rate, RATE).astype(np.float32)
    try:
        return normalized(mono)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


@dataclass
class VoicePrompts:
    """Voice name -> its prompt."""

    codes: dict[str, Voice] = field(default_factory=dict)
    """The voice directory's (listed: every session may name them). Voices made at run time are not kept
    here: an opening that names one carries its codes (``S2sOpen.custom_voice``)."""

    @classmethod
    def open(cls, root: str | Path, encode: Callable[[np.ndarray], np.ndarray], shape: MoshiShape) -> VoicePrompts:
        """Every voice of ``root``, encoding (with ``encode``: float PCM at 24 kHz -> codes) what is new."""
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"{root}: not a directory of voice samples")
        store = cls()
        names = {p.name.removesuffix(CODES_SUFFIX) for p in root.glob("*" + CODES_SUFFIX)}
        names |= {p.stem for p in root.iterdir() if p.suffix.lower() in (*SAMPLE_EXTS, PUBLISHED_EXT)}
        for name in sorted(names):
            if not NAME.match(name):
                raise ValueError(f"{root}: voice name {name!r} is not [A-Za-z0-9_.-]{{1,64}}")
            published = root / (name + PUBLISHED_EXT)
            if published.exists():
                store.codes[name] = published_voice(published, shape)
            else:
                store.codes[name] = _voice(root, name, encode, shape.card, shape.own_q)
        log.info("voice prompts of %s: %s", root, {n: frames(c) for n, c in store.codes.items()})
        return store

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.codes))

    def prompt(self, name: str) -> Voice:
        voice = self.codes.get(name)
        if voice is None:
            have = ", ".join(self.names()) or "none"
            raise ValueError(f"unknown voice {name!r}; this model's voices: {have}")
        return voice


def frames(voice: Voice) -> int:
    return voice.frames if isinstance(voice, VoiceEmbeddings) else len(voice)


def published_voice(path: Path, shape: MoshiShape) -> VoiceEmbeddings:
    """NVIDIA's ``NAME.pt``: ``{"embeddings": (V - 1, 1, 1, dim), "cache": (1, 1 + n_q, ct)}``."""
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # not a tensor file (weights_only refuses pickled code)
        raise ValueError(f"{path}: not a PersonaPlex voice ({type(e).__name__}: {e})") from e
    if not isinstance(state, dict) or not {"embeddings", "cache"} <= set(state):
        raise ValueError(f"{path}: not a PersonaPlex voice (expected the keys 'embeddings' and 'cache')")
    emb, cache = state["embeddings"], state["cache"]
    streams = shape.n_q + 1
    if emb.ndim < 2 or emb.shape[-1] != shape.dim or emb[..., 0].numel() < 1:
        raise ValueError(f"{path}: embeddings {tuple(emb.shape)} are not (frames, ..., {shape.dim})")
    if cache.ndim != 3 or cache.shape[:2] != (1, streams) or cache.shape[2] < shape.max_delay + 2:
        raise ValueError(f"{path}: cache {tuple(cache.shape)} is not (1, {streams}, >= {shape.max_delay + 2})")
    voice = VoiceEmbeddings(emb.reshape(-1, shape.dim).float(), cache[0].long())
    tokens = voice.cache[:, (voice.frames - 1) % cache.shape[2]]
    if int(tokens.min()) < 0 or int(tokens[1:].max()) > shape.card or int(tokens[0]) > shape.text_card:
        raise ValueError(f"{path}: its cache holds tokens outside the model's vocabularies")
    return voice


def _voice(root: Path, name: str, encode: Callable[[np.ndarray], np.ndarray], card: int, q: int) -> np.ndarray:
    sample = next((root / (name + e) for e in SAMPLE_EXTS if (root / (name + e)).exists()), None)
    cached = root / (name + CODES_SUFFIX)
    stamp = np.array([sample.stat().st_size, sample.stat().st_mtime_ns] if sample else [-1, -1], np.int64)
    if cached.exists():
        with np.load(cached) as z:
            same_codec = int(z["card"]) == card and z["codes"].shape[1:] == (q,)
            if same_codec and (sample is None or np.array_equal(z["sample"], stamp)):
                return z["codes"].astype(np.int64)
        if sample is None:
            raise ValueError(f"{cached}: codes of another codec (card, codebooks) and no sample to encode again")
    assert sample is not None
    codes = np.asarray(encode(normalized_sample(sample)), np.int64)
    out = io.BytesIO()
    np.savez(out, codes=codes.astype(np.int16), card=np.int64(card), sample=stamp)
    write_private(cached, out.getvalue())  # a voice's codes are biometric data, as its sample is
    return codes
