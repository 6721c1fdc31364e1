"""The reference package's own Qwen3-TTS generation, timed on the same GPU as ``loadtest/bench/tts_qwen3_gpu.py``.

``qwen-tts``'s user API at one stream: ``Qwen3TTSModel.generate_custom_voice`` (the talker's
``generate`` with its code predictor, non-streaming text input, its default) then the 12 Hz tokenizer's
full-utterance ``decode``, on a checkpoint directory written in the published layout at the 0.6B / 1.7B
shapes with **random-init weights** (real architecture and cost; the audio is noise). The first audio of
this path is the whole call: nothing is heard before generation and decoding end.

Runs in its own interpreter with the reference installed (it pins transformers 4.57), never the
gateway's venv; the checkpoint directory is built by the reference's own classes::

    PYTHONPATH=/tmp/ref python3 -m loadtest.probes.qwen3_reference --sizes 0.6b --frames 150 --json ref.json

Random weights may sample the codec EOS early, so each run reports the frames it made, and RTF = wall
time / audio length.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import platform
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import torch

from realtime_gw.models.speech.qwen3.checkpoint import published_configs
from tests.fixtures.make_qwen3_tts import (
    GENERATION,
    randomize_decoder,
    save_published,
    save_speech_tokenizer,
    write_tokenizer,
)

ROOT = Path(__file__).resolve().parents[2]

TEXT = "The quick brown fox jumps over the lazy dog while the band plays on."


def stub_unused_imports() -> None:
    """Modules the reference imports at load time but the 12 Hz CustomVoice path never calls."""
    for name in (
        "torchaudio",
        "torchaudio.compliance",
        "torchaudio.compliance.kaldi",
        "librosa",
        "librosa.filters",
        "sox",
    ):
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - absent or broken: an empty stand-in
            mod = types.ModuleType(name)
            mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
            if name == "librosa.filters":
                mod.mel = None  # type: ignore[attr-defined]
            sys.modules[name] = mod


def write_checkpoint(size: str, out: Path, device: str) -> None:
    """The published layout, built and saved by the reference's classes, seeded random weights."""
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    config, codec = published_configs(size)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**config)).to(torch.bfloat16).eval()
    save_published(model, out)
    del model
    (out / "generation_config.json").write_text(json.dumps(GENERATION))
    write_tokenizer(out)
    with torch.device(device):
        st = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**codec)).eval()
    randomize_decoder(st.decoder)
    save_speech_tokenizer(st, out / "speech_tokenizer")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_size(size: str, frames: int, runs: int, device: str) -> dict:
    from qwen_tts import Qwen3TTSModel

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        write_checkpoint(size, Path(tmp), device)
        tts = Qwen3TTSModel.from_pretrained(
            tmp, local_files_only=True, dtype=torch.bfloat16, device_map=device
        )
        load_s = time.perf_counter() - t0
    speaker = tts.get_supported_speakers()[0]
    rows = []
    for i in range(runs + 1):  # the first call warms up (kernels, allocator) and is not reported
        torch.manual_seed(i)
        sync(device)
        t = time.perf_counter()
        wavs, rate = tts.generate_custom_voice(
            TEXT, speaker=speaker, language="english", max_new_tokens=frames
        )
        sync(device)
        wall = time.perf_counter() - t
        audio_s = len(wavs[0]) / rate
        if i:
            rows.append(
                {
                    "wall_ms": round(wall * 1e3, 1),
                    "frames": round(audio_s * 12.5),
                    "audio_s": round(audio_s, 2),
                    "rtf": round(wall / max(audio_s, 1e-9), 3),
                }
            )
        print(size, "run", i, f"{wall * 1e3:.0f} ms for {audio_s:.2f} s of audio", flush=True)
    del tts
    walls = [r["wall_ms"] for r in rows]
    return {
        "size": size,
        "load_and_build_s": round(load_s, 1),
        "speaker": speaker,
        "runs": rows,
        "wall_ms_p50": float(np.median(walls)),
        "rtf_p50": float(np.median([r["rtf"] for r in rows])),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=["0.6b"])
    p.add_argument("--frames", type=int, default=150, help="max_new_tokens (12.5 frames a second)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    stub_unused_imports()
    import qwen_tts  # noqa: F401 - fail early, before building anything
    import transformers

    on_gpu = args.device.startswith("cuda")
    result = {
        "bench": "qwen3_reference",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": torch.cuda.get_device_name() if on_gpu else platform.processor(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "weights": "random-init at the published shapes",
        "text": TEXT,
        "sizes": [time_size(s, args.frames, args.runs, args.device) for s in args.sizes],
    }
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
