"""The 12 Hz speech tokenizer's encoder: a recording -> its 16 codebooks per 80 ms frame (ICL voice clones).

``encoder.*`` of ``speech_tokenizer/model.safetensors`` is a transformers ``MimiModel`` without its decoder
half (the reference's ``Qwen3TTSTokenizerV2Encoder``), saved under transformers 4.57's flat names
(``encoder.layers``, ``encoder_transformer``, ``downsample``, ``quantizer``). Newer transformers nest the
first three under ``encoder.`` (``encoder_seanet``, ...): the names are mapped to whichever layout the
installed version builds, and every encoder weight must be found (the decoder half stays unused).

Run once per registered voice at start-up (``voices.py``), as the reference's ``speech_tokenizer.encode``:
the whole recording in one ``MimiModel.encode``, the first ``encoder_valid_num_quantizers`` codebooks,
``ceil(samples / 1920)`` frames.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

_NESTED = {"encoder.": "encoder.encoder_seanet.", "encoder_transformer.": "encoder.encoder_transformer.",
           "downsample.": "encoder.downsample."}  # fmt: skip
_DECODER_HALF = ("decoder", "decoder_transformer", "upsample")


class SpeechEncoder:
    """``encode(wav)``: mono float32 audio at 24 kHz -> codes ``(frames, codebooks)`` (int64)."""

    def __init__(self, codec_config: dict[str, Any], state: dict[str, torch.Tensor]) -> None:
        from transformers import MimiConfig, MimiModel

        self.codebooks = int(codec_config.get("encoder_valid_num_quantizers", 16))
        self.hop = int(codec_config.get("encode_downsample_rate", 1920))
        self.model = MimiModel(MimiConfig(**codec_config["encoder_config"])).eval()
        own = self.model.state_dict()
        mapped: dict[str, torch.Tensor] = {}
        for name, tensor in state.items():
            target = name
            if target not in own:
                target = next((new + name[len(old) :] for old, new in _NESTED.items() if name.startswith(old)), name)
            if target not in own:
                raise ValueError(f"speech_tokenizer encoder weight {name!r} has no place in MimiModel")
            mapped[target] = tensor
        missing = [k for k in own if k not in mapped and k.split(".")[0] not in _DECODER_HALF]
        missing = [k for k in missing if not k.startswith(("decoder.", "encoder.decoder"))]
        if missing:
            raise ValueError(f"speech_tokenizer: encoder weights missing: {missing[:5]}")
        self.model.load_state_dict(mapped, strict=False)

    @classmethod
    def from_dir(cls, speech_tokenizer: Path, codec_config: dict[str, Any]) -> SpeechEncoder:
        """From a checkpoint's ``speech_tokenizer/`` (its ``encoder.*`` weights)."""
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for f in sorted(Path(speech_tokenizer).glob("*.safetensors")):
            state.update({k[len("encoder.") :]: v for k, v in load_file(str(f)).items() if k.startswith("encoder.")})
        return cls(codec_config, state)

    @torch.no_grad()
    def encode(self, wav: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32))[None, None]
        codes = self.model.encode(x, return_dict=True).audio_codes[0, : self.codebooks]
        return codes[:, : math.ceil(wav.shape[0] / self.hop)].T.contiguous()
