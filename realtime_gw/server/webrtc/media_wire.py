"""What the gateway and a media worker say to each other about calls, over one Unix socket each.

Frames are a 4-byte big-endian length and a msgpack-encoded message (a tagged msgspec struct); every
message names its call. The gateway sends offers, reply audio and its control (``Push``, ``Complete``,
``Purge``), and data channel text (``Send``); the worker answers, and sends the caller's decoded audio
(``Input``), the data channel's life and messages, the track's playback reports, the connection's
state, and the call's media figures (as they accrue and at its end).
"""

from __future__ import annotations

import asyncio
import struct

import msgspec

from realtime_gw.server.webrtc.metrics import MediaFigures, RtpFigures

HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024
"""Above this a frame is a broken peer, not a message (an SDP offer is capped far below)."""


class _Msg(msgspec.Struct, tag_field="t", array_like=True):
    call: str


# -- gateway -> worker ---------------------------------------------------------------------------------
class Open(_Msg, tag="open"):
    sdp: str
    expect_channel: bool
    address: str
    ports: tuple[int, int] | None
    """``range(start, stop)`` of UDP ports, or None for any free port."""
    input_prefetch_frames: int


class Push(_Msg, tag="push"):
    response_id: str
    pcm48: bytes


class Complete(_Msg, tag="complete"):
    response_id: str


class Purge(_Msg, tag="purge"):
    response_id: str | None


class Send(_Msg, tag="send"):
    text: str


class Close(_Msg, tag="close"):
    pass


# -- worker -> gateway ---------------------------------------------------------------------------------
class Answered(_Msg, tag="answered"):
    sdp: str
    error: str = ""


class Input(_Msg, tag="input"):
    mono: bytes
    rate: int


class ChannelOpened(_Msg, tag="opened"):
    max_message_bytes: int


class Received(_Msg, tag="received"):
    text: str | None
    data: bytes | None


class ChannelGone(_Msg, tag="gone"):
    pass


class Delivered(_Msg, tag="delivered"):
    """Data channel text of this many characters was handed to SCTP (the gateway's send window)."""

    chars: int


class Playback(_Msg, tag="playback"):
    what: str
    """``started``, ``sent`` or ``stopped``."""
    response_id: str
    sent_ms: float = 0.0


class State(_Msg, tag="state"):
    connection: str
    """The peer connection's state (``connecting``, ``connected``, ``failed``, ``closed``)."""


class Figures(_Msg, tag="figures"):
    media: MediaFigures


class Closed(_Msg, tag="closed"):
    media: MediaFigures
    rtp: RtpFigures | None


ToWorker = Open | Push | Complete | Purge | Send | Close
ToGateway = Answered | Input | ChannelOpened | Received | ChannelGone | Delivered | Playback | State | Figures | Closed

_encoder = msgspec.msgpack.Encoder()


def frame(message: ToWorker | ToGateway) -> bytes:
    body = _encoder.encode(message)
    return HEADER.pack(len(body)) + body


class Reader:
    """Reads one side's messages off a stream (``None`` at its end)."""

    def __init__(self, stream: asyncio.StreamReader, kind: type) -> None:
        self.stream = stream
        self.decoder: msgspec.msgpack.Decoder[object] = msgspec.msgpack.Decoder(kind)

    async def read(self) -> object | None:
        try:
            (size,) = HEADER.unpack(await self.stream.readexactly(HEADER.size))
            if size > MAX_FRAME:
                raise ValueError(f"a {size}-byte frame")
            return self.decoder.decode(await self.stream.readexactly(size))
        except asyncio.IncompleteReadError:
            return None
