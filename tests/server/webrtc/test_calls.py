"""WebRTC calls against a live gateway, with aiortc as the caller (offers stripped of candidates, as
browsers send them): both body formats (raw SDP, and the openai SDK's multipart with a client secret),
a spoken turn heard back on the track, the output buffer events in order, clear and barge-in, hangup,
refusals, CORS, and a PCMU-only caller. Every data-channel event is validated against the SDK's types."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import numpy as np
import psutil
import pytest
import websockets
from openai import AsyncOpenAI, NotFoundError

from realtime_gw.testing.audio import normalize, synthesize, transcribe, wer
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.server.sdk_events import validate
from tests.server.webrtc.caller import Caller, call

QUESTION_TEXT = "Please open the door for me."
QUESTION = synthesize(QUESTION_TEXT, 48000)
LONG_TEXT = "Please open the door and bring a cup of coffee to the table by the window in the kitchen."
SILENT_WITHIN_S = 0.1 + 4 * 0.02
"""The track is silent within 100 ms; heard here behind aiortc's receive jitter buffer (4 frames)."""
STOP = synthesize("Hold on, please stop talking now.", 48000)
ECHO_TONE = (np.sin(np.arange(48000 * 3 // 10) * 2 * np.pi * 440 / 48000) * 12000).astype("<i2").tobytes()


@pytest.fixture(scope="module")
def in_process_server() -> Iterator[LiveServer]:
    """The voice gateway with calls' media on its own event loop (the default: in worker processes)."""
    server = start_server(
        "--policy", "none", "--api-key", "test-key", "--max-input-buffer-bytes", "2000000",
        "--tts-deterministic", "--webrtc-media-workers", "0", "--no-cpu-backend-spare",
        name="media-in-process",
    )  # fmt: skip
    yield server
    stop_server(server)


@pytest.fixture(params=["in-process", "media-workers"])
def gateway(request: pytest.FixtureRequest, voice_server: LiveServer, in_process_server: LiveServer) -> LiveServer:
    """Each call test runs with the media on the gateway's loop and in media worker processes."""
    return in_process_server if request.param == "in-process" else voice_server


def ask(caller: Caller, text: str) -> None:
    """A typed user turn: the reply (the echo responder repeats it) is spoken on the track."""
    caller.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    caller.send({"type": "response.create"})


def said(caller: Caller) -> str:
    return next(e for _, e in caller.events if e.type == "response.output_audio_transcript.done").transcript


async def test_a_spoken_turn_is_answered_on_the_track(gateway: LiveServer) -> None:
    caller = Caller(parse=validate)
    try:
        resp = await call(gateway, caller)
        assert resp.status_code == 201, resp.text
        assert resp.headers["content-type"].startswith("application/sdp")
        assert resp.headers["location"].startswith("/v1/realtime/calls/rtc_")
        assert "a=candidate:" in resp.text and " 127.0.0.1 " in resp.text  # the bind address, no STUN
        assert caller.codec == "opus"
        await caller.wait_for(lambda e: e.type == "session.created")
        caller.mic.say(QUESTION)
        done = await caller.wait_for(lambda e: e.type == "response.done", timeout=60)
        stopped = await caller.wait_for(lambda e: e.type == "output_audio_buffer.stopped", timeout=20)
        assert done.response.status == "completed" and stopped.response_id == done.response.id
        kinds = caller.types()
        assert "response.output_audio.delta" not in kinds  # the audio is on the track
        order = ["input_audio_buffer.speech_started", "input_audio_buffer.committed", "output_audio_buffer.started"]
        assert [kinds.index(k) for k in order] == sorted(kinds.index(k) for k in order)
        assert kinds.index("output_audio_buffer.started") < kinds.index("output_audio_buffer.stopped")
        assert kinds.count("output_audio_buffer.started") == 1 == kinds.count("output_audio_buffer.stopped")
        reply = said(caller)
        assert wer(QUESTION_TEXT, reply) <= 0.4, reply  # the echo responder repeats what it heard
        t0 = caller.at(lambda e: e.type == "output_audio_buffer.started")
        t1 = caller.at(lambda e: e.type == "output_audio_buffer.stopped")
        await asyncio.sleep(0.3)  # the receiver's jitter buffer
        heard = await asyncio.to_thread(transcribe, caller.heard_between(t0 - 0.1, t1 + 0.3), 48000)
        assert wer(reply, heard) <= 0.5, heard
    finally:
        await caller.close()


async def test_clear_silences_the_track_and_truncates_then_hangup(gateway: LiveServer) -> None:
    client = AsyncOpenAI(base_url=gateway.http + "/v1", api_key="test-key")
    secret = await client.realtime.client_secrets.create(session={"type": "realtime", "instructions": "Echo."})
    caller = Caller(parse=validate)
    try:
        # the openai SDK's own multipart request, authorized by the ephemeral secret
        browser = AsyncOpenAI(base_url=gateway.http + "/v1", api_key=secret.value)
        raw = await browser.realtime.calls.with_raw_response.create(
            sdp=await caller.offer(), session={"type": "realtime", "output_modalities": ["audio"]}
        )
        assert raw.http_response.status_code == 201
        call_id = raw.headers["location"].rsplit("/", 1)[1]
        await caller.connect(raw.http_response.text)
        created = await caller.wait_for(lambda e: e.type == "session.created")
        assert created.session.instructions == "Echo."  # the secret's session config
        ask(caller, LONG_TEXT)
        started = await caller.wait_for(lambda e: e.type == "output_audio_buffer.started", timeout=60)
        await asyncio.sleep(1.0)
        mark = len(caller.events)
        caller.send({"type": "output_audio_buffer.clear"})
        cleared_at = time.monotonic()
        cleared = await caller.wait_for(lambda e: e.type == "output_audio_buffer.cleared", after=mark)
        truncated = await caller.wait_for(lambda e: e.type == "conversation.item.truncated", after=mark)
        assert cleared.response_id == started.response_id
        # cut at what the track actually sent: about the second that played
        assert 700 <= truncated.audio_end_ms <= 1600, truncated.audio_end_ms
        await asyncio.sleep(0.6)
        loud = [t for t in caller.loud_after(cleared_at) if t < cleared_at + 0.6]
        assert not loud or loud[-1] - cleared_at <= SILENT_WITHIN_S, (loud[-1] - cleared_at, caller.types()[mark:])
        assert "output_audio_buffer.stopped" not in caller.types()[mark:]
        # barge-in: speaking over the next reply stops it the same way
        mark = len(caller.events)
        ask(caller, LONG_TEXT)
        second = await caller.wait_for(lambda e: e.type == "output_audio_buffer.started", after=mark, timeout=60)
        await asyncio.sleep(0.8)
        caller.mic.say(STOP)
        cleared = await caller.wait_for(lambda e: e.type == "output_audio_buffer.cleared" and e.response_id == second.response_id, after=mark)
        cleared_at = caller.at(lambda e: e is cleared)
        truncated = await caller.wait_for(lambda e: e.type == "conversation.item.truncated", after=mark)
        assert 800 <= truncated.audio_end_ms <= 2500, truncated.audio_end_ms
        await asyncio.sleep(0.5)
        loud = [t for t in caller.loud_after(cleared_at) if t < cleared_at + 0.5]
        assert not loud or loud[-1] - cleared_at <= SILENT_WITHIN_S, (loud[-1] - cleared_at, caller.types()[mark:])
        # the sideband: the app's server joins the call with its deployment key and steers it
        sideband_url = f"{gateway.ws}/v1/realtime?call_id={call_id}"
        async with websockets.connect(sideband_url, additional_headers={"Authorization": "Bearer test-key"}) as side:
            await side.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "Steered."}}))
            seen = validate(await asyncio.wait_for(side.recv(), 10))
            while seen.type != "session.updated":  # the call's own events may come first
                seen = validate(await asyncio.wait_for(side.recv(), 10))
            assert seen.session.instructions == "Steered."
            on_call = await caller.wait_for(lambda e: e.type == "session.updated")
            assert on_call.session.instructions == "Steered."
        with pytest.raises(websockets.InvalidStatus):  # a client secret may not watch calls
            async with websockets.connect(sideband_url, additional_headers={"Authorization": f"Bearer {secret.value}"}):
                pass
        # hang up through the SDK: the call ends, the channel closes, the id is gone
        await client.realtime.calls.hangup(call_id)
        for _ in range(100):
            if caller.channel.readyState == "closed" or caller.pc.connectionState == "closed":
                break
            await asyncio.sleep(0.05)
        with pytest.raises(NotFoundError):
            await client.realtime.calls.hangup(call_id)
    finally:
        await caller.close()


async def test_a_pcmu_only_caller_is_heard_and_answered(voice_server: LiveServer) -> None:
    caller = Caller(codecs=["audio/PCMU"], parse=validate)
    try:
        resp = await call(voice_server, caller, multipart=True, session={"type": "realtime"}, max_message_size=32768)
        assert resp.status_code == 201, resp.text
        assert caller.codec == "PCMU"
        await caller.wait_for(lambda e: e.type == "session.created")
        caller.mic.say(QUESTION)
        await caller.wait_for(lambda e: e.type == "output_audio_buffer.stopped", timeout=60)
        # the turn was heard whole (VAD on the decoded 8 kHz audio), and understood in part: pocketsphinx
        # on telephone-band speech misses words from run to run
        started = await caller.wait_for(lambda e: e.type == "input_audio_buffer.speech_started")
        stopped = await caller.wait_for(lambda e: e.type == "input_audio_buffer.speech_stopped")
        spoken_ms = len(QUESTION) / 96
        assert 0.6 * spoken_ms <= stopped.audio_end_ms - started.audio_start_ms <= 1.6 * spoken_ms + 600
        assert set(normalize(QUESTION_TEXT).split()) & set(normalize(said(caller)).split()), said(caller)
        assert caller.loud_after(0.0)  # the reply reached the speaker
        # an event the peer could not take (over the max-message-size its offer named) is named in an error
        caller.send({"type": "session.update", "session": {"type": "realtime", "instructions": "x" * 40000}})
        refused = await caller.wait_for(lambda e: e.type == "error")
        assert refused.error.code == "message_too_large" and "session.updated" in refused.error.message
    finally:
        await caller.close()
    await all_calls_ended(voice_server)
    # the ended call left its media figures: how much of its audio the gateway had to make up, both ways
    assert voice_server.metric("realtime_gw_call_input_packets_total") > 100
    assert voice_server.metric("realtime_gw_call_frame_lateness_seconds_count") > 100
    assert voice_server.metric("realtime_gw_call_concealed_ratio_count", 'direction="input"') >= 1
    assert voice_server.metric("realtime_gw_call_concealed_ratio_count", 'direction="output"') >= 1
    assert voice_server.metric("realtime_gw_call_reply_frames_total") > 50
    assert voice_server.metric("realtime_gw_call_late_frames_ratio_count") >= 1


async def all_calls_ended(server: LiveServer) -> None:
    """Wait until no call and no realtime session is left on ``server``."""
    for _ in range(100):
        if server.metric("realtime_gw_sessions", 'kind="realtime"') == 0 == server.metric("realtime_gw_calls"):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("an ended or refused call kept its session")


OFFER_WITHOUT_AUDIO = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\nc=IN IP4 0.0.0.0\r\n"


async def test_refusals_and_cors(voice_server: LiveServer) -> None:
    sdp = await Caller(parse=validate).offer()
    url = voice_server.http + "/v1/realtime/calls"
    key = {"Authorization": "Bearer test-key"}
    async with httpx.AsyncClient(timeout=30) as http:
        as_json = await http.post(url, json={"sdp": sdp}, headers=key)
        assert as_json.status_code == 400 and "application/sdp" in as_json.json()["error"]["message"]
        for bad in ("wrong", "ek_expired_or_made_up"):
            refused = await http.post(url, content=sdp, headers={"Authorization": f"Bearer {bad}", "Content-Type": "application/sdp"})
            assert refused.status_code == 401
        big = await http.post(url, content=sdp + "a=x\r\n" * 20000, headers={**key, "Content-Type": "application/sdp"})
        assert big.status_code == 413
        no_audio = await http.post(url, content=OFFER_WITHOUT_AUDIO, headers={**key, "Content-Type": "application/sdp"})
        assert no_audio.status_code == 400 and "audio" in no_audio.json()["error"]["message"]
        bad_session = await http.post(url, files={"sdp": (None, sdp), "session": (None, '{"type": "realtime", "audio": {"output": {"voice": "nobody"}}}')}, headers=key)
        assert bad_session.status_code == 400
        assert (await http.post(url + "/rtc_nope/hangup", headers=key)).status_code == 404
        origin = f"http://localhost:{voice_server.port}"
        pre = await http.options(url, headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
        assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == origin
        assert "authorization" in pre.headers["access-control-allow-headers"]
        assert pre.headers["access-control-expose-headers"] == "Location"
        evil = await http.options(url, headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        assert evil.status_code == 403 and "access-control-allow-origin" not in evil.headers
    await all_calls_ended(voice_server)  # every refused call gave its session back


async def test_a_dead_media_worker_ends_its_calls_and_is_replaced(voice_server: LiveServer) -> None:
    caller = Caller(parse=validate)
    try:
        assert (await call(voice_server, caller)).status_code == 201
        await caller.wait_for(lambda e: e.type == "session.created")
        workers = [
            p for p in psutil.Process(voice_server.proc.pid).children()
            if "realtime_gw.server.webrtc.media_worker" in " ".join(p.cmdline())
        ]  # fmt: skip
        assert len(workers) == 2
        for p in workers:  # the call's worker, whichever it is
            p.kill()
        await all_calls_ended(voice_server)  # the dead worker's call gave its session back
    finally:
        await caller.close()
    caller = Caller(parse=validate)
    try:  # the next call gets a fresh worker, connects and has its session
        assert (await call(voice_server, caller)).status_code == 201
        await caller.wait_for(lambda e: e.type == "session.created")
    finally:
        await caller.close()


async def test_the_echo_model_says_the_callers_tone_back_on_the_track(voice_server: LiveServer) -> None:
    """``gateway-echo`` (the audio path check): what the caller's microphone sends comes back on the
    gateway's track, through the session's reply path, as a response of its own."""
    caller = Caller(parse=validate)
    try:
        resp = await call(voice_server, caller, multipart=True, session={"type": "realtime", "model": "gateway-echo"})
        assert resp.status_code == 201, resp.text
        created = await caller.wait_for(lambda e: e.type == "session.created", timeout=10)
        assert created.session.model == "gateway-echo"
        after_s, peak_hz = await echoed_tone(caller)
        assert after_s < 0.5, after_s  # loopback: well under half a second
        assert abs(peak_hz - 440) < 15, peak_hz  # the caller's own tone
        assert "error" not in caller.types()
    finally:
        await caller.close()


async def test_the_echo_comes_back_when_the_session_turns_to_g711_mid_call(gateway: LiveServer) -> None:
    """The session's audio formats change mid-call (PCM 24 kHz to G.711): the caller's audio reaches it at
    its new rate (resampled where the media runs) and its replies are converted from the format they were
    made in; the tone still comes back, with the media on the gateway's loop and in a worker."""
    caller = Caller(parse=validate)
    try:
        resp = await call(gateway, caller, multipart=True, session={"type": "realtime", "model": "gateway-echo"})
        assert resp.status_code == 201, resp.text
        await caller.wait_for(lambda e: e.type == "session.created", timeout=10)
        g711 = {"format": {"type": "audio/pcmu"}}
        caller.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": g711, "output": g711}}})
        updated = await caller.wait_for(lambda e: e.type == "session.updated", timeout=10)
        assert updated.session.audio.input.format.type == updated.session.audio.output.format.type == "audio/pcmu"
        _, peak_hz = await echoed_tone(caller)
        assert abs(peak_hz - 440) < 15, peak_hz
        assert "error" not in caller.types()
    finally:
        await caller.close()


async def test_a_reply_under_way_stays_whole_when_the_output_format_changes(voice_server: LiveServer) -> None:
    """A ``session.update`` to G.711 output while a reply plays: the reply's audio was encoded in the
    format its response opened with, and is converted for the track as such (heard as words, not as PCM
    read as mu-law)."""
    caller = Caller(parse=validate)
    try:
        resp = await call(voice_server, caller)
        assert resp.status_code == 201, resp.text
        await caller.wait_for(lambda e: e.type == "session.created")
        ask(caller, LONG_TEXT)
        await caller.wait_for(lambda e: e.type == "output_audio_buffer.started", timeout=60)
        pcmu = {"format": {"type": "audio/pcmu"}}
        caller.send({"type": "session.update", "session": {"type": "realtime", "audio": {"output": pcmu}}})
        stopped = await caller.wait_for(lambda e: e.type == "output_audio_buffer.stopped", timeout=60)
        updated_at = caller.at(lambda e: e.type == "session.updated")
        assert updated_at < caller.at(lambda e: e is stopped)  # the change came while the reply played
        t0 = caller.at(lambda e: e.type == "output_audio_buffer.started")
        await asyncio.sleep(0.3)  # the receiver's jitter buffer
        heard = await asyncio.to_thread(transcribe, caller.heard_between(updated_at, caller.at(lambda e: e is stopped) + 0.3), 48000)
        assert updated_at - t0 < 2.0 and wer(said(caller), heard) <= 0.6, heard  # the rest of the reply, in words
    finally:
        await caller.close()


async def echoed_tone(caller: Caller) -> tuple[float, float]:
    """The caller says ``ECHO_TONE`` and hears it back: seconds until the first loud frame, and the peak
    frequency of what came back (Hz)."""
    said_at = time.monotonic()
    caller.mic.say(ECHO_TONE)
    await caller.wait_for(lambda e: e.type == "output_audio_buffer.stopped", timeout=10, after=len(caller.events))
    loud = caller.loud_after(said_at, threshold=2000)
    assert loud, "nothing loud came back"
    heard = np.concatenate([s for t, s in caller.heard if loud[0] <= t <= loud[-1]]).astype(np.float32)
    return loud[0] - said_at, float(np.argmax(np.abs(np.fft.rfft(heard))) * 48000 / len(heard))
