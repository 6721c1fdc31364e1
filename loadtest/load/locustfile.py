"""Locust load for realtime_gw: voice users on /v1/realtime and robot users on the OpenPI socket.

    locust -f loadtest/load/locustfile.py --host http://127.0.0.1:8000 RealtimeUser RobotUser

``RealtimeUser`` opens a session, speaks a WAV paced in real time (server VAD ends the turn), takes the
whole reply, checks that the reply's frame ``seq`` numbers run 0, 1, 2, ... without a gap or a repeat,
and does 1..``LOAD_TURNS`` turns per connection (connection churn is part of the load).
``RobotUser`` runs an OpenPI observation loop at ``LOAD_ROBOT_HZ``; if the robot socket does not
answer (``--policy none``) it stops quietly.

Custom metrics (locust request entries): ``realtime connect``, ``realtime time_to_first_audio``
(response.created -> first frame), ``realtime turn_latency`` (speech_stopped -> first frame),
``realtime frame_lateness_max`` (worst frame behind its real-time slot, per reply), ``realtime
frame_seq`` (a failure per lost/duplicated frame run), ``openpi action_latency`` (round trip).

Environment: ``LOAD_WAV`` (the utterance; default: the server's own TTS says ``LOAD_TEXT``),
``REALTIME_GW_API_KEY``, ``LOAD_TURNS`` (3), ``LOAD_CHUNK_MS`` (40: audio per append), ``LOAD_THINK_S`` ("1,3": pause between turns), ``LOAD_START_JITTER`` (1: first turn after a random
share of the think time),
``LOAD_ROBOT_USERS`` (pins the robot user count), ``LOAD_ROBOT_HZ`` (10), ``LOAD_REPORT`` (a JSON
summary written at exit, read by ``loadtest/load/soak.py``).
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import gevent
from locust import User, between, constant_pacing, events, task
from locust.exception import StopUser

from realtime_gw.client.audio import read_wav, silence
from realtime_gw.client.openpi import OpenPIClient, PolicyServerError, sample_observation
from realtime_gw.client.protocol import input_session
from realtime_gw.client.sync import SyncRealtimeClient
from realtime_gw.protocols import realtime as rt

API_KEY = os.environ.get("REALTIME_GW_API_KEY") or None
TURNS = int(os.environ.get("LOAD_TURNS", "3"))
THINK = tuple(float(x) for x in os.environ.get("LOAD_THINK_S", "1,3").split(","))
START_JITTER = os.environ.get("LOAD_START_JITTER", "0") == "1"
TURN_TIMEOUT_S = float(os.environ.get("LOAD_TURN_TIMEOUT_S", "60"))
ROBOT_HZ = float(os.environ.get("LOAD_ROBOT_HZ", "10"))
ROBOT_RECONNECT_STEPS = int(os.environ.get("LOAD_ROBOT_RECONNECT_STEPS", "200"))
TEXT = os.environ.get("LOAD_TEXT", "Please open the door for me.")
CHUNK_MS = int(
    os.environ.get("LOAD_CHUNK_MS", "40")
)  # 40 ms appends: half the messages of 20 ms, still a mic's pace
TAIL_MS = 1000  # silence after the speech, as a microphone keeps sending: server VAD needs it to end the turn


@dataclass
class Totals:
    """Counted across all users of this process; written to ``LOAD_REPORT`` at exit."""

    sessions: int = 0
    turns: int = 0
    turn_failures: int = 0
    responses: int = 0
    responses_cancelled: int = 0
    frames: int = 0
    frames_lost: int = 0
    frames_duplicated: int = 0
    bad_replies: list[str] = field(default_factory=list)
    robot_sessions: int = 0
    robot_steps: int = 0
    robot_errors: int = 0
    robot_unavailable: bool = False
    errors: dict[str, int] = field(default_factory=dict)
    ttfa_ms: list[float] = field(default_factory=list)
    turn_latency_ms: list[float] = field(default_factory=list)
    lateness_ms: list[float] = field(default_factory=list)
    action_ms: list[float] = field(default_factory=list)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


TOTALS = Totals()
_utterance: tuple[bytes, int] | None = None


def _fire(kind: str, name: str, ms: float, length: int = 0, exc: Exception | None = None) -> None:
    events.request.fire(
        request_type=kind, name=name, response_time=ms, response_length=length, exception=exc, context={}
    )


def utterance(host: str) -> tuple[bytes, int]:
    """The PCM16 the realtime users speak (loaded once per process), speech + trailing silence."""
    global _utterance
    if _utterance is None:
        path = os.environ.get("LOAD_WAV")
        if path:
            pcm, rate = read_wav(path)
        else:  # no file given: let the server's TTS make one (needs a speech TTS, not --tts tone)
            with SyncRealtimeClient(host, API_KEY, keep_audio=True) as c:
                c.update_session({"audio": {"input": {"turn_detection": None}}})
                reply = c.say(TEXT)
            pcm, rate = bytes(reply.audio or b""), 24000
        _utterance = (silence(300, rate) + pcm + silence(TAIL_MS, rate), rate)
    return _utterance


class FrameSeqError(Exception):
    pass


class RealtimeUser(User):
    weight = 5
    wait_time = between(*THINK)

    def on_start(self) -> None:
        # Staggered arrivals: without this, every user's first turn lands within the spawn ramp.
        if START_JITTER:
            gevent.sleep(random.uniform(0, THINK[1]))

    @task
    def conversation(self) -> None:
        pcm, rate = utterance(self.host)
        t0 = time.perf_counter()
        client = SyncRealtimeClient(self.host, API_KEY, keep_audio=False)
        try:
            client.connect()
            client.update_session(input_session(rate))
        except Exception as e:
            TOTALS.error(f"connect: {type(e).__name__}")
            _fire("realtime", "connect", (time.perf_counter() - t0) * 1000, exc=e)
            client.close()
            return
        _fire("realtime", "connect", (time.perf_counter() - t0) * 1000)
        TOTALS.sessions += 1
        try:
            for n in range(random.randint(1, TURNS)):
                if n:
                    gevent.sleep(random.uniform(*THINK))
                if not self._turn(client, pcm, rate):
                    break
        finally:
            client.close()

    def _turn(self, client: SyncRealtimeClient, pcm: bytes, rate: int) -> bool:
        """One spoken turn; False when the connection should be dropped."""
        TOTALS.turns += 1
        t0 = time.perf_counter()
        speaker = gevent.spawn(client.stream_pcm, pcm, rate, CHUNK_MS)
        try:
            ev = client.recv_until(lambda e: isinstance(e, rt.ResponseDoneEvent), TURN_TIMEOUT_S)
        except Exception as e:  # timeout, closed socket
            TOTALS.turn_failures += 1
            TOTALS.error(f"turn: {type(e).__name__}")
            _fire("realtime", "turn", (time.perf_counter() - t0) * 1000, exc=e)
            speaker.kill()
            return False
        speaker.join()
        assert isinstance(ev, rt.ResponseDoneEvent)
        _fire("realtime", "turn", (time.perf_counter() - t0) * 1000)
        reply = client.state.replies.get(ev.response.id)
        if reply is None:
            return True
        self._check(reply)
        return True

    def _check(self, reply: Any) -> None:
        TOTALS.responses += 1
        TOTALS.frames += reply.frames
        if reply.status == "cancelled":
            TOTALS.responses_cancelled += 1
        elif reply.status != "completed":
            TOTALS.error(f"response {reply.status}: {reply.status_reason}")
        if reply.seqs_lost or reply.seqs_duplicated or reply.frames != reply.next_seq:
            TOTALS.frames_lost += reply.seqs_lost
            TOTALS.frames_duplicated += reply.seqs_duplicated
            msg = f"{reply.id}: {reply.frames} frames, next seq {reply.next_seq}, lost {reply.seqs_lost}, dup {reply.seqs_duplicated}"
            if len(TOTALS.bad_replies) < 50:
                TOTALS.bad_replies.append(msg)
            _fire("realtime", "frame_seq", 0, exc=FrameSeqError(msg))
        else:
            _fire("realtime", "frame_seq", 0, reply.frames)
        if reply.time_to_first_audio is not None:
            ms = reply.time_to_first_audio * 1000
            TOTALS.ttfa_ms.append(ms)
            _fire("realtime", "time_to_first_audio", ms)
        if reply.turn_latency is not None:
            ms = reply.turn_latency * 1000
            TOTALS.turn_latency_ms.append(ms)
            _fire("realtime", "turn_latency", ms)
        if reply.frames > 1:
            TOTALS.lateness_ms.append(reply.max_lateness_ms)
            _fire("realtime", "frame_lateness_max", reply.max_lateness_ms)


class RobotUser(User):
    weight = 1
    wait_time = constant_pacing(1.0 / ROBOT_HZ)
    if os.environ.get("LOAD_ROBOT_USERS"):
        fixed_count = int(os.environ["LOAD_ROBOT_USERS"])

    client: OpenPIClient | None = None
    steps = 0

    def on_start(self) -> None:
        self._connect()

    def _connect(self) -> None:
        t0 = time.perf_counter()
        self.client = OpenPIClient(self.host, API_KEY)
        try:
            metadata = self.client.connect()
        except Exception as e:
            # No robot socket on this server (policy=none answers 503): not an error of the load test.
            TOTALS.robot_unavailable = True
            self.client = None
            raise StopUser() from e
        _fire("openpi", "connect", (time.perf_counter() - t0) * 1000)
        TOTALS.robot_sessions += 1
        self.obs = sample_observation(metadata, seed=random.randrange(1 << 30))
        self.steps = 0

    @task
    def step(self) -> None:
        if self.client is None:
            raise StopUser()
        if self.steps >= ROBOT_RECONNECT_STEPS:  # churn: a robot reconnects now and then
            self.client.close()
            self._connect()
        try:
            out = self.client.infer(self.obs, timeout=30)
        except PolicyServerError as e:
            TOTALS.robot_errors += 1
            TOTALS.error(f"openpi: {str(e)[:80]}")
            _fire("openpi", "action_latency", (self.client.last_rtt_s or 0) * 1000, exc=e)
            return
        except Exception as e:
            TOTALS.robot_errors += 1
            TOTALS.error(f"openpi: {type(e).__name__}")
            _fire("openpi", "action_latency", 0, exc=e)
            self.client.close()
            self._connect()
            return
        self.steps += 1
        TOTALS.robot_steps += 1
        ms = (self.client.last_rtt_s or 0) * 1000
        TOTALS.action_ms.append(ms)
        _fire("openpi", "action_latency", ms, len(out))

    def on_stop(self) -> None:
        if self.client is not None:
            self.client.close()


@events.quitting.add_listener
def _write_report(environment: Any, **kwargs: Any) -> None:
    path = os.environ.get("LOAD_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(asdict(TOTALS), f)
