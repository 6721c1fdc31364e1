"""The gateway <-> media worker wire: what one turn of the loop sends goes in one write, and comes out
message by message, in order, however the bytes were cut on the way; a frame too large breaks the read."""

from __future__ import annotations

import asyncio
import socket

import pytest

from realtime_gw.server.webrtc import media_wire as wire
from tests.server.webrtc.wire_sockets import socket_pair


async def test_a_turns_messages_go_in_one_write_and_are_read_one_by_one() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    stream, our_writer = await asyncio.open_unix_connection(sock=ours)
    _, their_writer = await asyncio.open_unix_connection(sock=theirs)
    out = wire.Writer(their_writer)
    writes: list[bytes] = []
    original = their_writer.write
    their_writer.write = lambda data: (writes.append(data), original(data))[1]  # type: ignore[method-assign]
    sent = [wire.Input(f"rtc_{i}", bytes([i]) * 1920, 48000) for i in range(5)] + [wire.ChannelGone("rtc_0")]
    for message in sent:
        out.send(message)
    assert writes == []  # nothing before the turn ends
    await asyncio.sleep(0)
    assert len(writes) == 1
    reader = wire.Reader(stream, wire.ToGateway)
    assert [await reader.read() for _ in sent] == sent
    their_writer.close()
    assert await reader.read() is None
    our_writer.close()


async def test_frames_cut_anywhere_on_the_way_read_whole() -> None:
    stream, writer, theirs = await socket_pair()
    messages: list[wire.ToWorker] = [
        wire.Push("rtc_a", f"resp_{i}", bytes(range(256)) * (i + 1), "audio/pcm") for i in range(6)
    ]
    messages.append(wire.InputRate("rtc_a", 8000))
    data = b"".join(wire.frame(m) for m in messages)
    reader = wire.Reader(stream, wire.ToWorker)

    def send_in_pieces() -> None:  # 7-byte pieces: headers and bodies split everywhere
        for start in range(0, len(data), 7):
            theirs.sendall(data[start : start + 7])
        theirs.close()

    sending = asyncio.create_task(asyncio.to_thread(send_in_pieces))
    assert [await reader.read() for _ in messages] == messages
    await sending
    assert await reader.read() is None
    writer.close()


async def test_an_oversized_frame_breaks_the_read() -> None:
    stream, writer, theirs = await socket_pair()
    theirs.sendall(wire.HEADER.pack(wire.MAX_FRAME + 1) + b"x")
    with pytest.raises(ValueError, match="byte frame"):
        await wire.Reader(stream, wire.ToWorker).read()
    theirs.close()
    writer.close()
