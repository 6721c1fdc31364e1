"""A media worker applies each call's messages to that call alone: the session's input rate reaches its
peer, and a message one call cannot take ends that call (reported ``Closed``), not the worker's others."""

from __future__ import annotations

import asyncio

from realtime_gw.server.webrtc import media_wire as wire
from realtime_gw.server.webrtc.media_worker import Worker, WorkerCall
from tests.server.webrtc.wire_sockets import socket_pair


async def test_a_message_one_call_cannot_take_ends_that_call_only() -> None:
    stream, writer, theirs = await socket_pair()
    _, gateway_side = await asyncio.open_unix_connection(sock=theirs)
    worker = Worker(gateway_side)
    broken, fine = (WorkerCall(worker, call_id, True) for call_id in ("rtc_broken", "rtc_fine"))
    worker.calls = {"rtc_broken": broken, "rtc_fine": fine}

    def cannot_convert(*_: object) -> None:
        raise ValueError("audio it cannot convert")

    broken.peer.reply.push = cannot_convert  # type: ignore[method-assign]
    worker.handle(wire.InputRate("rtc_fine", 16000))
    worker.handle(wire.Push("rtc_broken", "resp_1", b"\x00\x01" * 480, "audio/pcm"))
    worker.handle(wire.Push("rtc_fine", "resp_2", b"\x00\x01" * 2400, "audio/pcm"))  # 100 ms

    assert fine.peer.input_rate == 16000
    assert fine.peer.track._replies["resp_2"].queued > 0
    assert list(worker.calls) == ["rtc_fine"]
    reader = wire.Reader(stream, wire.ToGateway)
    closed = await asyncio.wait_for(reader.read(), 10)  # the broken call's end, reported to the gateway
    assert isinstance(closed, wire.Closed) and closed.call == "rtc_broken"
    await fine.close()
    gateway_side.close()
    writer.close()
