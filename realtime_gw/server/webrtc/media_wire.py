"""What the gateway and a media worker say to each other about calls, over one Unix socket each.

Frames are a 4-byte big-endian length and a msgpack-encoded message (a tagged msgspec struct); every
message names its call. The gateway sends offers, reply audio in the session's format and its control
(``Push``, ``Complete``, ``Purge``), the session's input rate (``InputRate``), and data channel text
(``Send``); the worker answers, and sends the caller's decoded audio at that rate (``Input``), the data
channel's life and messages, the track's playback reports, the connection's state, and the call's media
figures (as they accrue and at its end).
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque

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
    audio: bytes
    output_format: str
    """The session's: the worker converts it for the track."""


class InputRate(_Msg, tag="input_rate"):
    """The rate the session takes the caller's audio at: the worker resamples ``Input`` to it."""

    rate: int


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


ToWorker = Open | Push | InputRate | Complete | Purge | Send | Close
ToGateway = Answered | Input | ChannelOpened | Received | ChannelGone | Delivered | Playback | State | Figures | Closed

_encoder = msgspec.msgpack.Encoder()
READ_CHUNK = 256 * 1024


def frame(message: ToWorker | ToGateway) -> bytes:
    body = _encoder.encode(message)
    return HEADER.pack(len(body)) + body


class Writer:
    """One side's messages onto its stream, the frames of one turn of the loop in one write: each call
    sends a message every 20 ms (its caller's audio; the gateway, its reply's), so a worker of many
    calls would otherwise make a system call per message."""

    def __init__(self, stream: asyncio.StreamWriter) -> None:
        self.stream = stream
        self._pending: list[bytes] = []

    def send(self, message: ToWorker | ToGateway) -> None:
        if self.stream.is_closing():
            return
        if not self._pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self._pending.append(frame(message))

    def flush(self) -> None:
        """What waits goes to the stream now (before it is drained or closed)."""
        pending, self._pending = self._pending, []
        if pending and not self.stream.is_closing():
            self.stream.write(b"".join(pending))

    def unsent_bytes(self) -> int:
        """Bytes in the stream's buffer that the peer has not taken yet."""
        return self.stream.transport.get_write_buffer_size()


class Reader:
    """Reads one side's messages off a stream (``None`` at its end), every frame that has arrived at
    once (the stream's buffer taken in one read, not two reads a message)."""

    def __init__(self, stream: asyncio.StreamReader, kind: type) -> None:
        self.stream = stream
        self.decoder: msgspec.msgpack.Decoder[object] = msgspec.msgpack.Decoder(kind)
        self._buffer = bytearray()
        self._decoded: deque[object] = deque()

    async def read(self) -> object | None:
        while not self._decoded:
            chunk = await self.stream.read(READ_CHUNK)
            if not chunk:
                return None  # its end (a partial frame at the end is a peer that died mid-write)
            self._buffer += chunk
            self._split()
        return self._decoded.popleft()

    def _split(self) -> None:
        buffer, start = self._buffer, 0
        view = memoryview(buffer)
        try:
            while len(buffer) - start >= HEADER.size:
                (size,) = HEADER.unpack_from(buffer, start)
                if size > MAX_FRAME:
                    raise ValueError(f"a {size}-byte frame")
                end = start + HEADER.size + size
                if end > len(buffer):
                    break
                self._decoded.append(self.decoder.decode(view[start + HEADER.size : end]))
                start = end
        finally:
            view.release()
        del buffer[:start]
