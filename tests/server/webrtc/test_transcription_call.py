"""A transcription session over a WebRTC call (``/v1/realtime/calls?intent=transcription``), with aiortc
as the caller: speech on the microphone track gives VAD events and transcript deltas before
``speech_stopped``, then the completed transcript; no response starts and the gateway's track stays
silent. Every data-channel event is validated against the openai SDK's types."""

from __future__ import annotations

import asyncio

from realtime_gw.testing.audio import synthesize, wer
from realtime_gw.testing.gateway import LiveServer
from tests.server.sdk_events import validate
from tests.server.webrtc.caller import RATE, Caller, call

TEXT = "I would like to book a table for two people tomorrow evening."
WER_BOUND = 0.25
"""pocketsphinx's own bound on Piper speech (tests/models/speech/test_asr_pocketsphinx.py)."""


async def test_a_transcription_call_captions_speech_and_never_answers(voice_server: LiveServer) -> None:
    caller = Caller(parse=validate)
    try:
        resp = await call(voice_server, caller, intent="transcription")
        assert resp.status_code == 201, resp.text
        created = await caller.wait_for(lambda e: e.type == "session.created")
        assert created.session.type == "transcription"
        heard = {"noise_reduction": {"type": "near_field"}, "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}
        caller.send({"type": "session.update", "session": {"type": "transcription", "audio": {"input": heard}}})
        updated = await caller.wait_for(lambda e: e.type in ("session.updated", "error"), timeout=10)
        assert updated.type == "session.updated" and updated.session.type == "transcription", updated
        caller.mic.say(bytes(RATE) + synthesize(TEXT, RATE) + bytes(3 * RATE))  # 0.5 s, speech, 1.5 s
        completed = await caller.wait_for(lambda e: e.type.endswith("input_audio_transcription.completed"))
        await asyncio.sleep(0.5)  # a response, were one started, would have begun by now
        kinds = caller.types()
        assert not [k for k in kinds if k.startswith(("response.", "output_audio_buffer."))], kinds
        first_delta = kinds.index("conversation.item.input_audio_transcription.delta")
        assert kinds.index("input_audio_buffer.speech_started") < first_delta < kinds.index("input_audio_buffer.speech_stopped")
        assert kinds.index("input_audio_buffer.committed") < kinds.index("conversation.item.input_audio_transcription.completed")
        assert wer(TEXT, completed.transcript) <= WER_BOUND, completed.transcript
        deltas = "".join(e.delta for _, e in caller.events if e.type.endswith("input_audio_transcription.delta"))
        assert wer(completed.transcript, deltas) <= WER_BOUND, deltas
        assert caller.loud_after(0.0) == []  # the gateway's track carried nothing but silence
    finally:
        await caller.close()
