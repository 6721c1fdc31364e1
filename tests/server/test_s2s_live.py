"""Live ``/v1/realtime`` sessions on a tiny random-init Moshi through the official ``openai`` SDK: audio
in and out at the model's 80 ms cadence, replies opened and closed by the model's text stream, cancel
and truncate (the model held silent until the user's turn ends, the user's words from the ASR stage
beside it), refusals naming the model's capabilities, and sessions joining and leaving the stage; and
a GPT-Live session (``client.live``) and a WebRTC call (aiortc) on the same model.

The random model's text is noise but its steps are real: with a fixed seed and silent input its tokens
are the same in every run. Replies end on the text stream alone here (``--s2s-silence-dbfs 0``: its
noise voice always counts as quiet; ``--s2s-reply-end-ms 80``: one padding step ends a reply)."""

from __future__ import annotations

import asyncio
import base64
import statistics
from collections.abc import Iterator

import httpx
import pytest
import websockets
from openai import AsyncOpenAI

from realtime_gw.testing.audio import synthesize, wer
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.server.live_sdk_client import live_session
from tests.server.realtime_sdk_client import recv
from tests.server.s2s_call import STEP_BYTES, call, live_call
from tests.server.sdk_events import validate
from tests.server.webrtc.caller import Caller
from tests.server.webrtc.caller import call as webrtc_call

SEED = 3
"""Silent input under this seed: the first reply is nine text steps, then a padding step ends it."""
CAPABILITIES = "audio_in, audio_out, text_out"


@pytest.fixture(scope="module")
def s2s_server() -> Iterator[LiveServer]:
    server = start_server(
        "--policy", "none", "--tts", "tone", "--api-key", "test-key",
        "--s2s", "moshi", "--s2s-config", "tiny", "--s2s-slots", "2",
        "--s2s-reply-end-ms", "80", "--s2s-silence-dbfs", "0", "--no-cpu-backend-spare", name="s2s",
    )  # fmt: skip
    yield server
    stop_server(server)


@pytest.fixture(autouse=True)
async def stage_free(s2s_server: LiveServer) -> None:
    """Each test starts on an empty stage: the sessions of the test before have given their slots back
    (two slots only; a closed connection frees its slot a moment after the client has moved on)."""
    for _ in range(200):
        if s2s_server.metric("realtime_gw_worker_active_requests", 'worker="s2s-moshi"') == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the sessions of the test before kept their slots on the stage")


def is_(kind: str, status: str | None = None) -> object:
    return lambda e: e.type == kind and (status is None or e.response.status == status)


async def test_the_model_is_listed_with_its_capabilities(s2s_server: LiveServer) -> None:
    models = httpx.get(s2s_server.http + "/v1/models", headers={"Authorization": "Bearer test-key"}).json()
    [moshi] = [m for m in models["data"] if m["id"] == "moshi"]
    assert moshi["capabilities"] == ["audio_in", "audio_out", "text_out"] and moshi["frame_ms"] == 80
    async with call(s2s_server, SEED) as c:
        assert c.session.model == "moshi"
        assert c.session.model_extra["capabilities"]["model_capabilities"] == moshi["capabilities"]
        await c.wait(is_("response.output_audio.delta"))


async def test_audio_in_and_out_at_80_ms_with_replies_opened_and_closed_by_the_text_stream(s2s_server: LiveServer) -> None:
    async with call(s2s_server, SEED) as c:
        done = await c.wait(is_("response.done"))
        second = await c.wait(is_("response.created"), after=len(c.events))
        await c.wait(lambda e: e.type == "response.output_audio.delta" and e.response_id == second.response.id)
        await asyncio.sleep(1.2)  # the second reply, in its steady pace
    first = done.response
    assert first.status == "completed"
    deltas = c.of("response.output_audio.delta", first.id)
    assert {len(base64.b64decode(d.delta)) for d in deltas} == {STEP_BYTES}
    assert [d.model_extra["seq"] for d in deltas] == list(range(len(deltas)))
    pieces = [d.delta for d in c.of("response.output_audio_transcript.delta", first.id)]
    # one step a piece, then the padding step that ended it: audio with no piece
    assert len(pieces) >= 1 and len(deltas) == len(pieces) + 1
    transcript = "".join(pieces)
    assert c.of("response.output_audio_transcript.done", first.id)[0].transcript == transcript
    assert first.output[0].content[0].transcript == transcript
    # audio leaves at the model's cadence (after the transport's lead): one 80 ms step every ~80 ms
    at = c.times("response.output_audio.delta", second.response.id)[6:]
    assert len(at) >= 6
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    assert 0.06 <= statistics.median(gaps) <= 0.1, gaps
    assert c.appended >= 20  # the microphone's 80 ms frames went in all along
    assert c.appended > 3 * c.session.model_extra["capabilities"]["context_frames"]  # the ring wrapped; it goes on


async def test_truncate_cuts_the_reply_at_the_steps_heard(s2s_server: LiveServer) -> None:
    async with call(s2s_server, SEED) as c:
        rid = (await c.wait(is_("response.created"))).response.id
        await c.wait(lambda e: e.type == "response.output_audio.delta" and e.response_id == rid and e.model_extra["seq"] == 4)
        item_id = c.of("response.output_item.added", rid)[0].item.id
        await c.conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=240)
        assert (await c.wait(is_("conversation.item.truncated"))).audio_end_ms == 240
        assert (await c.wait(is_("response.done"))).response.status == "cancelled"
        mark = len(c.events)
        await c.conn.conversation.item.retrieve(item_id=item_id)
        item = (await c.wait(is_("conversation.item.retrieved"), after=mark)).item
    steps = [d.delta for d in c.of("response.output_audio_transcript.delta", rid)]
    assert item.content[0].transcript == " ".join(p.strip() for p in steps[:3])  # exactly the three steps heard


async def test_cancel_holds_the_model_silent_until_the_users_turn_ends(s2s_server: LiveServer) -> None:
    manual = {"audio": {"input": {"turn_detection": None, "transcription": {"model": "gateway"}}}}
    async with call(s2s_server, SEED, **manual) as c:
        rid = (await c.wait(is_("response.created"))).response.id
        await c.wait(lambda e: e.type == "response.output_audio.delta" and e.response_id == rid and e.model_extra["seq"] == 2)
        await c.conn.response.cancel()
        assert (await c.wait(is_("response.done"))).response.status == "cancelled"
        # held silent: the model goes on listening, and says nothing while the user has not spoken
        await asyncio.sleep(1.0)
        assert len(c.of("response.created")) == 1
        # the user speaks and ends the turn: the ASR stage beside the model writes it down; the model may answer
        sentence = "Please open the door for me."
        c.speech += synthesize(sentence)
        await c.said()
        mark = len(c.events)
        await c.conn.input_audio_buffer.commit()
        heard = await c.wait(is_("conversation.item.input_audio_transcription.completed"), after=mark)
        assert wer(sentence, heard.transcript) <= 0.5, heard.transcript
        await c.wait(is_("response.created"), after=mark)


async def test_what_the_model_cannot_take_is_refused(s2s_server: LiveServer) -> None:
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    async with call(s2s_server, SEED) as c:
        await c.conn.session.update(session={"type": "realtime", "tools": [tool]})
        error = await c.wait(is_("error"))
        assert error.error.param == "session.tools" and CAPABILITIES in error.error.message
        mark = len(c.events)
        await c.conn.response.create(response={"instructions": "Say hello."})
        error = await c.wait(is_("error"), after=mark)
        assert "response.create" in error.error.message and CAPABILITIES in error.error.message
        await c.wait(is_("response.output_audio.delta"))  # the call goes on


async def refused_at_once(server: LiveServer) -> str:
    """A session the full stage refuses: its one error's code (the socket then closes 1013)."""
    url = server.ws + "/v1/realtime?model=moshi"
    async with websockets.connect(url, additional_headers={"Authorization": "Bearer test-key"}) as ws:
        error = await asyncio.wait_for(ws.recv(), 5)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    return str(error)


async def test_sessions_join_and_leave_the_stage_and_a_full_stage_refuses_at_once(s2s_server: LiveServer) -> None:
    async with call(s2s_server, SEED) as b:
        async with call(s2s_server, SEED + 1) as a:
            await a.wait(is_("response.output_audio.delta"))
            await b.wait(is_("response.output_audio.delta"))
            assert "server_busy" in await refused_at_once(s2s_server)
        # A left: its slot is free again (at the stage's next step), and B talks on throughout
        mark = len(b.events)
        for _ in range(50):
            try:
                async with call(s2s_server, SEED + 2) as joined:
                    await joined.wait(is_("response.output_audio.delta"))
                break
            except AssertionError:  # refused: A's slot not back yet
                await asyncio.sleep(0.1)
        else:
            pytest.fail("the slot of a session that left never came back")
        await b.wait(is_("response.output_audio.delta"), after=mark)


async def test_other_models_and_gpt_live_stay_cascaded_beside_the_stage(s2s_server: LiveServer) -> None:
    client = AsyncOpenAI(base_url=s2s_server.http + "/v1", api_key="test-key")
    async with client.realtime.connect(model="gpt-realtime") as conn:
        created = await recv(conn)
    assert created.type == "session.created" and created.session.model_extra.get("capabilities") is None
    async with live_session(s2s_server) as conn:
        assert conn.started.session.status == "active"


async def test_a_bad_seed_is_refused_at_connect(s2s_server: LiveServer) -> None:
    client = AsyncOpenAI(base_url=s2s_server.http + "/v1", api_key="test-key")
    async with client.realtime.connect(model="moshi", extra_query={"seed": "x"}) as conn:
        error = await recv(conn)
    assert error.type == "error" and error.error.param == "seed"



async def test_gpt_live_runs_on_the_model_with_its_own_events(s2s_server: LiveServer) -> None:
    """What LiveKit's GPTLiveModel sends by default (instructions, Responses delegation with tools) is
    accepted and named not applied; the model's voice and words are one continuous output stream at
    its cadence; a fixture interrupts it and holds it silent until the user's turn ends."""
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    delegation = {"type": "responses", "responses": {"model": "gpt-5.4-mini", "tools": [tool]}}
    async with live_call(s2s_server, instructions="Be brief.", delegation=delegation) as c:
        assert c.session.model == "moshi"
        ignored = await c.wait(lambda e: e.type == "info" and e.code == "settings_ignored")
        assert "instructions" in ignored.message and CAPABILITIES in ignored.message
        await c.wait(is_("session.output_transcript.delta"))
        await asyncio.sleep(1.2)
        audio = [(t, e) for t, e in c.events if e.type == "session.output_audio.delta"]
        frames = [e for _, e in audio]
        assert {len(base64.b64decode(e.delta)) for e in frames} == {STEP_BYTES}
        assert all(b.start_ms == a.end_ms for a, b in zip(frames, frames[1:], strict=False))  # one stream
        gaps = [b - a for (a, _), (b, _) in zip(audio[5:], audio[6:], strict=False)]
        assert 0.06 <= statistics.median(gaps) <= 0.1, gaps
        words = c.of("session.output_transcript.delta")
        assert all(frames[0].start_ms <= w.start_ms <= frames[-1].end_ms for w in words)
        # the fixture cuts the model off; it stays silent while the user has not spoken
        mark = len(c.events)
        await c.conn.session.output_audio.fixture.play(audio=base64.b64encode(bytes(STEP_BYTES * 3)).decode(), event_id="clip")
        await c.wait(is_("session.output_audio.fixture.played"), after=mark)
        held = len(c.events)
        await asyncio.sleep(1.0)
        assert not c.of("session.output_transcript.delta", after=held)
        # the user speaks: server VAD ends the turn, the ASR stage writes it down, the model may answer
        sentence = "Please open the door for me."
        c.speech += synthesize(sentence)
        await c.said()
        await c.wait(is_("session.input_transcript.delta"), after=held, timeout=20)
        await c.wait(is_("session.output_transcript.delta"), after=held, timeout=20)
        assert not c.of("error")


async def test_a_webrtc_call_naming_the_model_talks_on_the_track(s2s_server: LiveServer) -> None:
    """The openai SDK's multipart offer whose session names the model: the model's voice is paced on
    the call's track, its events (output buffer ones too) on the data channel; a cancel clears the track."""
    caller = Caller(parse=validate)
    try:
        resp = await webrtc_call(s2s_server, caller, multipart=True, session={"type": "realtime", "model": "moshi"})
        assert resp.status_code == 201, resp.text
        created = await caller.wait_for(is_("session.created"), timeout=15)
        assert created.session.model == "moshi" and created.session.model_extra["capabilities"]["speech_to_speech"]
        first = await caller.wait_for(is_("response.created"), timeout=15)
        rid = first.response.id
        started = await caller.wait_for(lambda e: e.type == "output_audio_buffer.started" and e.response_id == rid)
        await caller.wait_for(lambda e: e.type == "response.done" and e.response.id == rid)
        await caller.wait_for(lambda e: e.type == "output_audio_buffer.stopped" and e.response_id == rid)
        assert "response.output_audio.delta" not in caller.types()  # the voice is on the track
        words = [e for _, e in caller.events if e.type == "response.output_audio_transcript.delta" and e.response_id == rid]
        assert words and started.response_id == rid
        t0 = caller.at(lambda e: e.type == "output_audio_buffer.started")
        assert caller.loud_after(t0, threshold=1)  # its voice came in on the track
        # a cancel while the model speaks: the reply is cancelled and the track cleared
        for _ in range(5):  # a reply may end as the cancel goes out: then the next one is cancelled
            mark = len(caller.events)
            live = await caller.wait_for(is_("output_audio_buffer.started"), after=mark, timeout=20)
            caller.send({"type": "response.cancel"})
            done = await caller.wait_for(lambda e, rid=live.response_id: e.type == "response.done" and e.response.id == rid, after=mark)
            if done.response.status == "cancelled":
                break
        assert done.response.status == "cancelled"
        await caller.wait_for(lambda e: e.type == "output_audio_buffer.cleared", after=mark, timeout=5)
        assert not [e for _, e in caller.events if e.type == "error"]
    finally:
        await caller.close()
