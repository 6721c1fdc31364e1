"""Custom voices added to a TTS stage at run time, through the stage-worker interface itself.

The server submits a ``VoiceRegistration`` (or ``VoiceRemoval``) record to the TTS worker like any request;
``VoiceRecords``, mixed in ahead of a backend that can make custom voices, takes those records out of the
speech path: ``open`` does the work at once on the worker's thread (between two steps, so the voice
tables change only where the streams read them) and the record's one step hands out its answer. A
backend says which kinds it makes (``voice_kinds``) and implements ``add_voice`` / ``remove_voice``;
backends without the mixin refuse the records (``TtsBackendBase.check_request``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from realtime_gw.models.runtime import StepResult
from realtime_gw.records.voice import VoiceAdded, VoiceRegistration, VoiceRemoval

VOICE_RECORDS = (VoiceRegistration, VoiceRemoval)


@dataclass(eq=False)
class VoiceRecordState:
    """A voice record's answer, computed at ``open``; its one step hands it out."""

    outputs: list[Any] = field(default_factory=list)


class VoiceRecords:
    """Mixed in ahead of a TTS backend: routes the voice records, delegates speech streams."""

    name: str
    voice_kinds: tuple[str, ...] = ()

    def add_voice(self, request: VoiceRegistration) -> VoiceAdded:
        raise NotImplementedError

    def remove_voice(self, voice_id: str) -> None:
        raise NotImplementedError

    def check_voice_record(self, request: VoiceRegistration | VoiceRemoval) -> None:
        """ValueError for a registration of a kind this backend cannot make."""
        if isinstance(request, VoiceRegistration) and request.kind not in self.voice_kinds:
            can = " and ".join(self.voice_kinds) or "no custom voices"
            raise ValueError(f"this TTS model makes {can}, not {request.kind!r} voices")

    # -- Backend protocol ------------------------------------------------------------------------------
    def check_request(self, request: Any) -> Any:
        if isinstance(request, VOICE_RECORDS):
            return self.check_voice_record(request)
        return super().check_request(request)  # type: ignore[misc]

    def open(self, request: Any) -> Any:
        if isinstance(request, VoiceRegistration):
            self.check_voice_record(request)
            return VoiceRecordState([self.add_voice(request)])
        if isinstance(request, VoiceRemoval):
            self.remove_voice(request.voice_id)
            return VoiceRecordState()
        return super().open(request)  # type: ignore[misc]

    def has_work(self, state: Any) -> bool:
        return isinstance(state, VoiceRecordState) or super().has_work(state)  # type: ignore[misc]

    def release(self, state: Any) -> None:
        if not isinstance(state, VoiceRecordState):
            super().release(state)  # type: ignore[misc]

    def step(self, work: list[tuple[Any, list[Any]]]) -> list[StepResult]:
        records = {i: StepResult(outputs=st.outputs, done=True) for i, (st, _) in enumerate(work)
                   if isinstance(st, VoiceRecordState)}  # fmt: skip
        speech = [w for i, w in enumerate(work) if i not in records]
        done = iter(super().step(speech) if speech else [])  # type: ignore[misc]
        return [records[i] if i in records else next(done) for i in range(len(work))]
