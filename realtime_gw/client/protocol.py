"""Client side of /v1/realtime, without I/O: encode client events, decode server events, track replies.

Both transports (``realtime.RealtimeClient`` on asyncio, ``sync.SyncRealtimeClient`` for gevent/locust
and threads) are thin loops around ``ClientState.feed(event, now)``, the way the server's transport is a
thin loop around its session. Everything a client wants to measure lives here: time to first audio,
frame lateness against the real-time schedule, lost and duplicated ``seq`` numbers. So does what every
transport (the OpenPI one too) would otherwise write again: the WebSocket URL, the auth header, the
connect options and the real-time pacing of audio sends.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import msgspec

from realtime_gw.protocols import realtime as rt
from realtime_gw.protocols.audio import FRAME_SAMPLES, OUTPUT_RATE

FRAME_MS = FRAME_SAMPLES * 1000.0 / OUTPUT_RATE  # 80 ms
DEFAULT_URL = "http://127.0.0.1:8000"
REALTIME_PATH = "/v1/realtime"
REALTIME_SUBPROTOCOL = "realtime"


class ServerError(RuntimeError):
    """The server answered with an ``error`` event while we waited for something else."""

    def __init__(self, detail: rt.ErrorDetail) -> None:
        super().__init__(f"{detail.code or detail.type}: {detail.message}")
        self.detail = detail


# -- connecting --------------------------------------------------------------------------------------
def ws_url(base: str, path: str, **query: str) -> str:
    """``http://h:p`` / ``ws://h:p`` / a full URL -> the WebSocket URL of ``path`` (kept if one is given)."""
    parts = urlsplit(base if "://" in base else "ws://" + base)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    use_path = parts.path if parts.path not in ("", "/") else path
    q = "&".join(p for p in (parts.query, urlencode({k: v for k, v in query.items() if v})) if p)
    return urlunsplit((scheme, parts.netloc, use_path, q, ""))


def realtime_url(base: str, model: str | None = None, duplex: bool = False) -> str:
    """The ``/v1/realtime`` URL for a base URL; ``model`` and ``duplex`` ride in the query when set."""
    return ws_url(base, REALTIME_PATH, model=model or "", duplex="1" if duplex else "")


def auth_headers(api_key: str | None, scheme: str = "Bearer") -> dict[str, str] | None:
    """The ``Authorization`` header for a key, or None without one.

    ``Bearer`` is OpenAI's; the robot socket takes ``Api-Key`` because that is what openpi-client sends.
    """
    return {"Authorization": f"{scheme} {api_key}"} if api_key else None


def realtime_connect_options(api_key: str | None, open_timeout: float) -> dict[str, Any]:
    """Keyword arguments for ``websockets`` ``connect`` on /v1/realtime (asyncio and sync take the same)."""
    return {
        "additional_headers": auth_headers(api_key),
        "subprotocols": [REALTIME_SUBPROTOCOL],
        "max_size": None,
        "open_timeout": open_timeout,
    }


# -- pacing ------------------------------------------------------------------------------------------
def pcm_chunks(pcm: bytes, rate: int, chunk_ms: int = 20) -> Iterator[bytes]:
    """PCM16 mono in ``chunk_ms`` pieces, the way a microphone delivers it (the last may be shorter)."""
    step = rate * chunk_ms // 1000 * 2
    return (pcm[pos : pos + step] for pos in range(0, len(pcm), step))


def pace_delay(start: float, sent: int, chunk_ms: int, speed: float, now: float) -> float:
    """Seconds to wait after the ``sent``-th chunk so that chunk n leaves at ``start + n x chunk_ms / speed``.

    The schedule is absolute (not a sleep per chunk), so sleep overshoot does not accumulate into drift;
    ``speed`` 0 (or below) means as fast as possible. Pure: each transport owns its clock and its sleep.
    """
    if speed <= 0:
        return 0.0
    return max(0.0, start + sent * chunk_ms / 1000.0 / speed - now)


class PlaybackAckEvent(msgspec.Struct, tag="playback.ack", tag_field="type", kw_only=True):
    """Duplex extension: how much of a response the client has actually played (not just received).

    Only sent when ``session.created`` advertises ``capabilities.supports_playback_ack``.
    """

    response_id: str
    played_ms: int
    event_id: str | None = None


class UnknownEvent(msgspec.Struct, kw_only=True):
    """A server event this client has no struct for (e.g. a newer server's extension); kept raw."""

    type: str
    raw: dict[str, Any]


Event = rt.ServerEvent | UnknownEvent
"""What a client receives: a known server event, or one kept raw."""


# -- codec -----------------------------------------------------------------------------------------
def _server_event_types() -> dict[str, type[rt.ServerEvent]]:
    found: dict[str, type[rt.ServerEvent]] = {}
    stack: list[type[rt.ServerEvent]] = [rt.ServerEvent]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        tag = cls.__struct_config__.tag
        if isinstance(tag, str) and "." in tag or tag == "error":
            found[str(tag)] = cls
    return found


_SERVER_TYPES = _server_event_types()
_DECODERS = {t: msgspec.json.Decoder(cls) for t, cls in _SERVER_TYPES.items()}
_ENCODER = msgspec.json.Encoder()


class _TypeOnly(msgspec.Struct):
    type: str = ""


_TYPE_DECODER = msgspec.json.Decoder(_TypeOnly)


def decode_server_event(raw: str | bytes) -> rt.ServerEvent | UnknownEvent:
    """One server frame -> its struct (fields the struct lacks are ignored, so additions never break us)."""
    kind = _TYPE_DECODER.decode(raw).type
    decoder = _DECODERS.get(kind)
    if decoder is None:
        return UnknownEvent(type=kind, raw=msgspec.json.decode(raw))
    return decoder.decode(raw)


def encode_client_event(event: rt.ClientEvent | PlaybackAckEvent) -> str:
    if event.event_id is None:
        event.event_id = "evt_" + secrets.token_hex(6)
    return _ENCODER.encode(event).decode()


def session_update(session: dict[str, Any] | rt.SessionParams) -> rt.SessionUpdateEvent:
    """``session.update`` from a plain dict, validated here so a typo fails before it is sent."""
    params = (
        session
        if isinstance(session, rt.SessionParams)
        else msgspec.convert({"type": "realtime", **session}, rt.SessionParams)
    )
    return rt.SessionUpdateEvent(session=params)


def append_audio(pcm: bytes) -> rt.InputAudioBufferAppendEvent:
    return rt.InputAudioBufferAppendEvent(audio=pcm)  # msgspec base64-encodes bytes


def user_text(text: str) -> rt.ConversationItemCreateEvent:
    return rt.ConversationItemCreateEvent(
        item=rt.Item(type="message", role="user", content=[rt.ContentPart(type="input_text", text=text)])
    )


def text_turn(text: str) -> list[rt.ClientEvent]:
    """A text turn: the user's message, then the request for a response, in the order to send them."""
    return [user_text(text), rt.ResponseCreateEvent()]


def input_session(
    rate: int = OUTPUT_RATE,
    vad: bool = True,
    transcription: bool = True,
    silence_duration_ms: int = 500,
    voice: str | None = None,
) -> dict[str, Any]:
    """The usual session for a microphone client: PCM16 in, server VAD, input transcription."""
    audio_in: dict[str, Any] = {
        "format": {"type": "audio/pcm", "rate": rate},
        "turn_detection": {"type": "server_vad", "silence_duration_ms": silence_duration_ms} if vad else None,
    }
    if transcription:
        audio_in["transcription"] = {"model": "default"}
    session: dict[str, Any] = {"audio": {"input": audio_in}}
    if voice:
        session["audio"]["output"] = {"voice": voice}
    return session


# -- state -------------------------------------------------------------------------------------------
@dataclass
class Reply:
    """One response as the client saw it."""

    id: str
    created_at: float
    item_id: str | None = None
    status: str = "in_progress"
    status_reason: str | None = None
    transcript: str = ""
    text: str = ""
    frames: int = 0
    audio_ms: float = 0.0
    audio: bytearray | None = None
    """The PCM16 24 kHz audio received (kept only when the state was made with ``keep_audio``)."""
    first_audio_at: float | None = None
    done_at: float | None = None
    seqs_lost: int = 0
    seqs_duplicated: int = 0
    next_seq: int = 0
    max_lateness_ms: float = 0.0
    """Worst arrival of a frame after its real-time slot (first frame's arrival + seq x 80 ms)."""
    turn_end_at: float | None = None
    """When the server said the user's turn ended (speech_stopped), if this reply answers one."""

    @property
    def done(self) -> bool:
        return self.done_at is not None

    @property
    def time_to_first_audio(self) -> float | None:
        """response.created -> first audio frame, seconds."""
        return None if self.first_audio_at is None else self.first_audio_at - self.created_at

    @property
    def turn_latency(self) -> float | None:
        """speech_stopped -> first audio frame, seconds: what a speaker waits for after pausing."""
        if self.first_audio_at is None or self.turn_end_at is None:
            return None
        return self.first_audio_at - self.turn_end_at


@dataclass
class ClientState:
    """Everything learned from the server events of one session (feed every event, in order)."""

    keep_audio: bool = True
    max_replies: int = 64
    session: rt.SessionOut | rt.TranscriptionSessionOut | None = None
    replies: dict[str, Reply] = field(default_factory=dict)
    current: Reply | None = None
    """The response in progress (between response.created and response.done)."""
    last: Reply | None = None
    transcripts: dict[str, str] = field(default_factory=dict)
    """Input transcription per user item id."""
    errors: list[rt.ErrorDetail] = field(default_factory=list)
    speech_started_at: float | None = None
    speech_stopped_at: float | None = None
    speaking: bool = False
    """Between the server's speech_started and its speech_stopped."""
    commits: int = 0
    responses_created: int = 0
    responses_done: int = 0

    @property
    def capabilities(self) -> dict[str, Any]:
        return (self.session.capabilities if isinstance(self.session, rt.SessionOut) else None) or {}

    @property
    def supports_playback_ack(self) -> bool:
        return bool(self.capabilities.get("supports_playback_ack"))

    def feed(self, ev: rt.ServerEvent | UnknownEvent, now: float) -> Reply | None:
        """Update from one event; returns the reply it belongs to, if any."""
        if isinstance(ev, rt.ResponseAudioDeltaEvent):
            return self._audio(ev, now)
        if isinstance(ev, (rt.SessionCreatedEvent, rt.SessionUpdatedEvent)):
            self.session = ev.session
        elif isinstance(ev, rt.ResponseCreatedEvent):
            reply = Reply(ev.response.id, now, audio=bytearray() if self.keep_audio else None)
            if self.speech_stopped_at is not None:
                reply.turn_end_at = self.speech_stopped_at
                self.speech_stopped_at = None
            self.replies[reply.id] = reply
            self.current = reply
            self.responses_created += 1
            while len(self.replies) > self.max_replies:  # bounded for long (soak) sessions
                del self.replies[next(iter(self.replies))]
            return reply
        elif isinstance(ev, rt.ResponseOutputItemAddedEvent):
            reply = self.replies.get(ev.response_id)
            if reply is not None:
                reply.item_id = ev.item.id
            return reply
        elif isinstance(ev, rt.ResponseAudioTranscriptDeltaEvent):
            reply = self.replies.get(ev.response_id)
            if reply is not None:
                reply.transcript += ev.delta
            return reply
        elif isinstance(ev, rt.ResponseTextDeltaEvent):
            reply = self.replies.get(ev.response_id)
            if reply is not None:
                reply.text += ev.delta
            return reply
        elif isinstance(ev, rt.ResponseDoneEvent):
            reply = self.replies.get(ev.response.id)
            if reply is not None:
                reply.status = ev.response.status
                details = ev.response.status_details
                reply.status_reason = details.reason if details is not None else None
                reply.done_at = now
                self.last = reply
            if self.current is not None and self.current.id == ev.response.id:
                self.current = None
            self.responses_done += 1
            return reply
        elif isinstance(ev, rt.InputAudioBufferSpeechStartedEvent):
            self.speech_started_at = now
            self.speaking = True
        elif isinstance(ev, rt.InputAudioBufferSpeechStoppedEvent):
            self.speech_stopped_at = now
            self.speaking = False
        elif isinstance(ev, rt.InputAudioBufferCommittedEvent):
            self.commits += 1
        elif isinstance(ev, rt.ConversationItemInputAudioTranscriptionCompletedEvent):
            self.transcripts[ev.item_id] = ev.transcript
        elif isinstance(ev, rt.ErrorEvent):
            self.errors.append(ev.error)
        return None

    def _audio(self, ev: rt.ResponseAudioDeltaEvent, now: float) -> Reply | None:
        reply = self.replies.get(ev.response_id)
        if reply is None:
            return None
        if ev.seq < reply.next_seq:
            reply.seqs_duplicated += 1
            return reply
        reply.seqs_lost += ev.seq - reply.next_seq
        reply.next_seq = ev.seq + 1
        if reply.first_audio_at is None:
            reply.first_audio_at = now
        else:
            slot = reply.first_audio_at + ev.seq * FRAME_MS / 1000.0
            reply.max_lateness_ms = max(reply.max_lateness_ms, (now - slot) * 1000.0)
        reply.frames += 1
        reply.audio_ms += len(ev.delta) / 2 * 1000.0 / ev.sample_rate_hz
        if reply.audio is not None:
            reply.audio += ev.delta
        return reply
