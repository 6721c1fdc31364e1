"""Custom voices added to a TTS stage at run time through the worker interface (``custom_voices``):
``VoiceRegistration`` / ``VoiceRemoval`` records run through ``run_iteration`` as the stage worker runs them,
on the tiny Qwen3-TTS Base and VoiceDesign fixtures (greedy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from realtime_gw.models.contract import Iteration, run_iteration
from realtime_gw.models.speech.qwen3.checkpoint import load_checkpoint
from realtime_gw.models.speech.qwen3.talker import Sampling
from realtime_gw.models.speech.qwen3.voices import read_clone_audio
from realtime_gw.models.speech.tts_qwen3 import Qwen3TtsStage
from realtime_gw.models.speech.tts_tone import ToneTtsBackend
from realtime_gw.protocols.voices import check_sample
from realtime_gw.records.voice import TtsRequest, VoiceAdded, VoiceRegistration, VoiceRemoval

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CLONE_WAV = FIXTURES / "qwen3_tts_tiny_clone.wav"
TEXT = "Hi."
VID = "voice_" + "ab" * 12


def _stage(kind: str, **kw: Any) -> Qwen3TtsStage:
    return Qwen3TtsStage(
        checkpoint=load_checkpoint(FIXTURES / f"qwen3_tts_tiny_{kind}", "cpu", torch.float32), slots=2, max_positions=128,
        cuda_graphs=False, max_frames_per_token=2, sampling=Sampling(do_sample=False, sub_do_sample=False), **kw,
    )  # fmt: skip


def _run(stage: Any, record: Any) -> list[Any]:
    """One record through a worker iteration: its outputs, or the open error as ValueError."""
    out = run_iteration(stage, Iteration(open=[(record, [])], max_batch=4))
    if out.opened[0].error is not None:
        raise ValueError(out.opened[0].error)
    (result,) = out.results
    assert result.done and result.error is None
    return result.outputs


@pytest.fixture(scope="module")
def base() -> Qwen3TtsStage:
    return _stage("base", clones={"anna": str(CLONE_WAV)})


def test_a_registered_clone_speaks_as_the_start_up_clone(base: Qwen3TtsStage) -> None:
    sample = check_sample(read_clone_audio(str(CLONE_WAV)))
    (added,) = _run(base, VoiceRegistration(VID, "audio_sample", sample=sample))
    assert isinstance(added, VoiceAdded) and added.voice_id == VID
    assert added.vector == base.clones["anna"].vector  # the same x-vector, computed once, here
    assert base.describe().voices == ("anna",)  # custom voices are not advertised to every key
    anna = base.synthesize(TEXT, TtsRequest(voice="anna"))
    assert base.synthesize(TEXT, TtsRequest(voice=VID)) == anna
    # a restart registers the stored x-vector: nothing computed, same audio
    other = "voice_" + "cd" * 12
    assert _run(base, VoiceRegistration(other, "audio_sample", vector=added.vector)) == [VoiceAdded(other, added.vector)]
    assert base.synthesize(TEXT, TtsRequest(voice=other)) == anna
    assert _run(base, VoiceRemoval(other)) == []
    with pytest.raises(ValueError, match="unknown voice"):
        base.check_request(TtsRequest(voice=other))


def test_records_batch_with_speech(base: Qwen3TtsStage) -> None:
    """A record opened while a stream speaks: both answered in the same step, the stream unharmed."""
    state = base.open(TtsRequest(voice="anna"))
    try:
        rec = VoiceRegistration("voice_" + "ef" * 12, "audio_sample", vector=base.clones["anna"].vector)
        out = run_iteration(base, Iteration(open=[(rec, [])], work=[(state, [TEXT])], max_batch=4))
        assert out.results[0].error is None and isinstance(out.results[1].outputs[0], VoiceAdded)
    finally:
        base.release(state)


def test_refusals(base: Qwen3TtsStage) -> None:
    assert base.describe().voice_kinds == ("audio_sample",)
    with pytest.raises(ValueError, match="not 'prompt'"):
        base.check_request(VoiceRegistration(VID, "prompt", description="A warm voice."))
    with pytest.raises(ValueError, match="built-in"):
        _run(base, VoiceRegistration("anna", "audio_sample", vector=base.clones["anna"].vector))
    with pytest.raises(ValueError, match="x-vector of 3"):
        _run(base, VoiceRegistration(VID + "0", "audio_sample", vector=(0.0, 1.0, 2.0)))
    tone = ToneTtsBackend()  # a backend without custom voices refuses the records outright
    assert tone.describe().voice_kinds == ()
    with pytest.raises(ValueError, match="no custom voices"):
        tone.check_request(VoiceRegistration(VID, "audio_sample", sample=np.zeros(8, "<f4").tobytes()))


def test_a_designed_voice_speaks_as_its_description() -> None:
    design = _stage("voice_design")
    assert design.describe().voice_kinds == ("prompt",)
    warm = "A warm, low voice, speaking slowly."
    assert _run(design, VoiceRegistration(VID, "prompt", description=warm)) == [VoiceAdded(VID)]
    assert design.synthesize(TEXT, TtsRequest(voice=VID)) == design.synthesize(TEXT, TtsRequest(instructions=warm))
    with pytest.raises(ValueError, match="tokens"):
        design.check_request(VoiceRegistration(VID, "prompt", description="word " * 600))
    with pytest.raises(ValueError, match="not 'audio_sample'"):
        design.check_request(VoiceRegistration(VID, "audio_sample", vector=(0.0,)))
