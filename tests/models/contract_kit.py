"""The contract kit: one small CPU config per registered family (``realtime_gw.models.families``), the
requests every check sends it, and the helpers the checks share (``test_contract_kit.py``).

A new family adds one ``KitCase`` here; the kit then runs it through every check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from realtime_gw.config import GatewayConfig
from realtime_gw.models.contract import BackendInfo, StepResult
from realtime_gw.models.families import Role
from realtime_gw.models.runtime import END_OF_INPUT
from realtime_gw.records.s2s import S2sAudio, S2sFrame, S2sOpen
from realtime_gw.records.voice import (
    AsrRequest,
    AsrResult,
    TtsFrame,
    TtsRequest,
    TurnRequest,
    TurnScore,
    VadProbs,
    VadRequest,
)

QWEN3_TINY = str(Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_tts_tiny")

Good = Callable[[BackendInfo], tuple[Any, list[Any]]]
"""A request the backend serves, and the inputs pushed to it (from its description: a policy's spec)."""


def _noise(rate: int, seconds: float) -> bytes:
    rng = np.random.default_rng(1)
    return (rng.standard_normal(int(rate * seconds)) * 300).astype("<i2").tobytes()


def _tts(info: BackendInfo) -> tuple[Any, list[Any]]:
    return TtsRequest(), ["Hello there. ", "How are you?", END_OF_INPUT]


def _asr(info: BackendInfo) -> tuple[Any, list[Any]]:
    return AsrRequest(pcm=_noise(16000, 0.5), sample_rate=16000), []


def _vad(info: BackendInfo) -> tuple[Any, list[Any]]:
    return VadRequest(sample_rate=16000), [_noise(16000, 0.1), END_OF_INPUT]


def _turn(info: BackendInfo) -> tuple[Any, list[Any]]:
    return TurnRequest(_noise(16000, 1.0), 16000), []


def _policy(info: BackendInfo) -> tuple[Any, list[Any]]:
    from realtime_gw.models.policy.backend import dummy_request

    assert info.policy_spec is not None
    return dummy_request(info.policy_spec), []


def _s2s(info: BackendInfo) -> tuple[Any, list[Any]]:
    assert info.s2s is not None
    frame = 2 * info.s2s.native_rate * info.s2s.frame_ms // 1000
    pcm = _noise(info.s2s.native_rate, 0.24)
    return S2sOpen(seed=1), [S2sAudio(pcm[i : i + frame]) for i in range(0, len(pcm), frame)] + [END_OF_INPUT]


OUTPUTS: dict[Role, type] = {
    "tts": TtsFrame,
    "asr": AsrResult,
    "vad": VadProbs,
    "turn": TurnScore,
    "policy": np.ndarray,
    "s2s": S2sFrame,
}
"""What each role's results are."""


@dataclass(frozen=True)
class KitCase:
    role: Role
    family: str
    settings: dict[str, Any]
    """``GatewayConfig`` fields: the family's smallest CPU config."""
    good: Good
    bad: Any
    """A request the backend must refuse at ``open`` (ValueError/TypeError, never NoFreeSlot)..."""
    refusal: str
    """...with a message that matches this (it names what is wrong)."""
    variant: str = ""

    @property
    def id(self) -> str:
        return f"{self.role}-{self.family}" + (f"-{self.variant}" if self.variant else "")

    def config(self) -> GatewayConfig:
        return GatewayConfig(cpu_backends_in_process=True, warmup=False, **self.settings)


_BAD_VOICE = TtsRequest(voice="no-such-voice")
_BAD_RATE = "sample_rate must be positive"

CASES: tuple[KitCase, ...] = (
    KitCase("tts", "piper", {"tts": "piper"}, _tts, _BAD_VOICE, "no-such-voice"),
    KitCase("tts", "tone", {"tts": "tone"}, _tts, _BAD_VOICE, "no-such-voice"),
    KitCase("tts", "codec", {"tts": "codec", "tts_max_batch": 2}, _tts, _BAD_VOICE, "no-such-voice"),
    KitCase(
        "tts",
        "qwen3",
        {"tts": "qwen3", "tts_path": QWEN3_TINY, "tts_max_batch": 2},
        _tts,
        _BAD_VOICE,
        "no-such-voice",
    ),
    KitCase(
        "asr", "pocketsphinx", {"asr": "pocketsphinx", "asr_slots": 2}, _asr, AsrRequest(b"", 0), _BAD_RATE
    ),
    KitCase("asr", "kyutai", {"asr": "kyutai", "asr_max_batch": 2}, _asr, AsrRequest(b"", 0), _BAD_RATE),
    KitCase("vad", "silero", {}, _vad, VadRequest(sample_rate=0), _BAD_RATE, "onnx"),
    KitCase(
        "vad",
        "silero",
        {"vad_device": "cpu", "worker_max_active": 3},
        _vad,
        VadRequest(sample_rate=0),
        _BAD_RATE,
        "torch",
    ),
    KitCase("turn", "smart", {}, _turn, TurnRequest(b"", 0), _BAD_RATE),
    KitCase(
        "policy",
        "pi0",
        {"policy": "pi0", "openpi_max_sessions": 1},
        _policy,
        "not a request",
        "PolicyRequest",
    ),
    KitCase(
        "policy",
        "pi05",
        {"policy": "pi05", "robot": "droid", "openpi_max_sessions": 1},
        _policy,
        "not a request",
        "PolicyRequest",
    ),
    KitCase(
        "policy",
        "noop",
        {"policy": "noop", "openpi_max_sessions": 1},
        _policy,
        "not a request",
        "PolicyRequest",
    ),
    KitCase("s2s", "moshi", {"s2s": "moshi", "s2s_slots": 2}, _s2s, S2sOpen(voice="alba"), "no voice prompt"),
    KitCase(
        "s2s", "personaplex", {"s2s": "personaplex", "s2s_slots": 2}, _s2s, S2sOpen(voice="alba"), "unknown voice"
    ),
)


def run_to_end(backend: Any, request: Any, inputs: list[Any], max_steps: int = 500) -> list[Any]:
    """Open, step until done (inputs in the first step), release: the outputs, in order."""
    state = backend.open(request)
    outputs: list[Any] = []
    try:
        for _ in range(max_steps):
            (result,) = backend.step([(state, inputs)])
            inputs = []
            assert result.error is None, result.error
            outputs += result.outputs
            if result.done:
                return outputs
    finally:
        backend.release(state)
    raise AssertionError(f"{backend.name}: not done after {max_steps} steps")


@dataclass(eq=False)
class Counting:
    """A backend that records every state it opened and every release of one (by identity)."""

    inner: Any
    opened: list[Any] = field(default_factory=list)
    released: list[Any] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.inner.name)

    def open(self, request: Any) -> Any:
        state = self.inner.open(request)
        self.opened.append(state)
        return state

    def step(self, work: list[tuple[Any, list[Any]]]) -> list[StepResult]:
        return self.inner.step(work)  # type: ignore[no-any-return]

    def release(self, state: Any) -> None:
        self.released.append(state)
        self.inner.release(state)

    def has_work(self, state: Any) -> bool:
        return bool(self.inner.has_work(state))

    def warmup(self) -> None:
        self.inner.warmup()

    def describe(self) -> BackendInfo:
        return self.inner.describe()  # type: ignore[no-any-return]

    def releases_per_open(self) -> list[int]:
        return [sum(r is s for r in self.released) for s in self.opened]
