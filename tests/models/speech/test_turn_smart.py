"""Smart Turn v3: our batched features and scores equal pipecat's own analyzer on the same audio, and
the model tells a finished sentence from an unfinished one."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from realtime_gw.models.speech.turn_smart import (
    TURN_RATE,
    SmartTurnBackend,
    last_window,
    log_mel,
    smart_turn_onnx_path,
)
from realtime_gw.protocols.audio import resample
from realtime_gw.records.voice import TurnRequest, TurnScore
from realtime_gw.sessions.turn_detection import SEMANTIC_THRESHOLDS
from tests.models.conftest import synthesize

FINISHED = "What is the weather like in Paris today?"
UNFINISHED = "I was wondering whether the"


@functools.lru_cache(maxsize=1)
def turn_backend() -> SmartTurnBackend:
    backend = SmartTurnBackend()
    backend.warmup()
    return backend


@pytest.fixture(scope="module")
def spoken(piper: Any) -> dict[str, bytes]:
    """24 kHz PCM16 of each sentence followed by 200 ms of silence (the pause that asks the model)."""
    return {t: synthesize(piper, t) + bytes(2 * 24000 // 5) for t in (FINISHED, UNFINISHED)}


def pipecat_probability(audio16k: np.ndarray) -> float:
    from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3

    analyzer = LocalSmartTurnAnalyzerV3(smart_turn_model_path=str(smart_turn_onnx_path()))
    analyzer._sample_rate = TURN_RATE  # what its pipeline sets on start; our audio is 16 kHz already
    return float(analyzer._predict_endpoint(audio16k)["probability"])


def test_features_and_scores_equal_pipecats(spoken: dict[str, bytes]) -> None:
    from pipecat.audio.turn.smart_turn._whisper_features import compute_whisper_log_mel_features

    backend = turn_backend()
    for pcm in spoken.values():
        pcm16k = resample(pcm, 24000, TURN_RATE)
        audio = np.frombuffer(pcm16k, dtype="<i2").astype(np.float32) / 32768.0
        window = last_window(pcm16k, TURN_RATE)
        np.testing.assert_array_equal(window[-audio.size :], audio)
        ours = log_mel(window[None])[0]
        theirs = compute_whisper_log_mel_features(window)
        np.testing.assert_allclose(ours, theirs, atol=1e-5)
        [result] = backend.step([(backend.open(TurnRequest(pcm16k, TURN_RATE)), [])])
        assert result.done
        assert result.outputs[0].probability == pytest.approx(pipecat_probability(audio), abs=1e-4)


def test_longer_turns_keep_their_last_8_seconds(spoken: dict[str, bytes]) -> None:
    pcm16k = resample(spoken[FINISHED], 24000, TURN_RATE)
    long = bytes(2 * 6 * TURN_RATE) + pcm16k  # 6 s of silence first: over 8 s in all
    audio = np.frombuffer(long, dtype="<i2").astype(np.float32) / 32768.0
    np.testing.assert_array_equal(last_window(long, TURN_RATE), audio[-8 * TURN_RATE :])


async def test_finished_and_unfinished_in_one_batched_step(
    spoken: dict[str, bytes], start_worker: Any
) -> None:
    worker = await start_worker(turn_backend(), max_batch=8)
    streams = [worker.submit(TurnRequest(pcm, 24000)) for pcm in spoken.values()]
    scores: list[TurnScore] = [(await s.collect())[0] for s in streams]
    finished, unfinished = (s.probability for s in scores)
    # Complete at semantic_vad's default eagerness (0.5, pipecat's too). The finished sentence's score
    # depends on the Piper audio (0.70 with today's packages, over 0.8 before).
    assert finished > SEMANTIC_THRESHOLDS["auto"] and unfinished < 0.2, (finished, unfinished)
    # Batched or alone, the same probability.
    alone = turn_backend().score(last_window(spoken[UNFINISHED], 24000)[None])[0]
    assert unfinished == pytest.approx(float(alone), abs=1e-5)
