"""Loading the Mimi codec LM and its engine: talker (all 16 codebooks) -> Mimi decode -> PCM16, on the
shared slots and CUDA-graph step of ``streaming/slot_engine.py``.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from realtime_gw.models.speech.codec.mimi_stream import StreamingMimiDecoder
from realtime_gw.models.speech.codec.spec import CODEC_DIR, SPEC_FILE, TALKER_FILE, CodecSpec, named_spec
from realtime_gw.models.speech.codec.talker import CodecTalker, TalkerRuntime
from realtime_gw.models.speech.streaming.slot_engine import SlotEngine
from realtime_gw.models.speech.streaming.text_feed import TextTokenizer
from realtime_gw.models.tokenizers import ByteTokenizer, HfTokenizer, has_tokenizer_files

log = logging.getLogger(__name__)

INIT_SEED = 0
"""Random-init weights are seeded, so every process builds the same model."""


@dataclass
class LoadedModels:
    spec: CodecSpec
    talker: CodecTalker
    mimi: Any
    tokenizer: TextTokenizer
    description: str
    random_init: bool


def randomize_codebooks(mimi: Any) -> None:
    """Make a random-init Mimi usable as a stand-in.

    Its init leaves every codebook at zero (all codes would decode alike), so codebooks get unit-normal
    entries; and its output is loud, clipped noise, so the last conv is scaled down to speaking level.
    """
    from realtime_gw.models.speech.codec.mimi_stream import mimi_decoder_parts

    with torch.no_grad():
        for mod in mimi.modules():
            if hasattr(mod, "embed_sum") and hasattr(mod, "cluster_usage"):
                mod.embed_sum.normal_()
                mod.cluster_usage.fill_(1.0)
                mod._embed = None  # the codebook caches embed_sum / usage on first use
        last = mimi_decoder_parts(mimi)[2].layers[-1].conv
        last.weight.mul_(0.05)
        if last.bias is not None:
            last.bias.mul_(0.05)


def build_random(spec: CodecSpec, device: str, dtype: torch.dtype) -> tuple[CodecTalker, Any]:
    from transformers import MimiConfig, MimiModel

    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(INIT_SEED)
        talker = CodecTalker(spec)
        mimi = MimiModel(MimiConfig(**spec.mimi))
        randomize_codebooks(mimi)
    return talker.to(device=device, dtype=dtype).eval(), mimi.to(device=device, dtype=torch.float32).eval()


def load_models(
    config: str, path: str | None, device: str, dtype: torch.dtype, max_positions: int | None = None
) -> LoadedModels:
    """Weights from ``path`` (see ``spec``'s directory format) or random init of the named config.

    ``max_positions`` overrides the slot length (KV memory per slot scales with it)."""
    if not path:
        spec = named_spec(config)
        if max_positions:
            spec = dataclasses.replace(spec, max_positions=max_positions)
        talker, mimi = build_random(spec, device, dtype)
        return LoadedModels(
            spec, talker, mimi, ByteTokenizer(), f"codec-{spec.name} (random init: audio is noise)", True
        )
    from safetensors.torch import load_file
    from transformers import MimiModel

    root = Path(path)
    spec = CodecSpec.from_json((root / SPEC_FILE).read_text())
    if max_positions:
        spec = dataclasses.replace(spec, max_positions=max_positions)
    with torch.device(device):  # not "meta": non-persistent buffers (rotary inv_freq) must be real
        talker = CodecTalker(spec)
    talker.load_state_dict(load_file(str(root / TALKER_FILE), device="cpu"), strict=True)
    talker = talker.to(device=device, dtype=dtype).eval()
    mimi = MimiModel.from_pretrained(str(root / CODEC_DIR), local_files_only=True, dtype=torch.float32)
    mimi = mimi.to(device).eval()
    tok: TextTokenizer = HfTokenizer(root) if has_tokenizer_files(root) else ByteTokenizer()
    if tok.vocab_size > spec.text_vocab:
        raise ValueError(
            f"{root}: tokenizer has {tok.vocab_size} ids but the talker embeds {spec.text_vocab}"
        )
    return LoadedModels(spec, talker, mimi, tok, f"codec-{spec.name} from {root}", False)


class CodecEngine(SlotEngine):
    """The Mimi codec LM on fixed slots (``SlotEngine``): ``TalkerRuntime`` + ``StreamingMimiDecoder``."""

    name = "tts-codec"

    def __init__(
        self,
        models: LoadedModels,
        slots: int,
        *,
        temperature: float = 0.9,
        top_k: int = 50,
        allow_eos: bool = False,
        cuda_graphs: bool | None = None,
    ) -> None:
        self.spec = models.spec
        device = next(models.talker.parameters()).device
        talker = TalkerRuntime(models.talker, slots, temperature=temperature, top_k=top_k, allow_eos=allow_eos)
        decoder = StreamingMimiDecoder(models.mimi, slots, self.spec.num_codebooks)
        super().__init__(
            talker,
            decoder,
            slots,
            max_positions=self.spec.max_positions,
            num_codebooks=self.spec.num_codebooks,
            device=device,
            cuda_graphs=cuda_graphs,
        )
