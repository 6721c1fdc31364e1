"""A media worker process: the aiortc side of the calls the gateway assigns it, off the gateway's loop.

Started by ``media_pool.MediaPool`` as ``python -m realtime_gw.server.webrtc.media_worker FD`` with one
end of a Unix socket pair as FD. Each call is a ``peer.Peer`` (ICE, DTLS, SRTP, Opus/G.711, the data
channel, the paced reply track) driven by the gateway's messages (``media_wire.py``): the caller's audio
leaves decoded to mono PCM, data channel messages both ways, the track's playback reports and the
call's media figures go back. Sessions never run here; a stall here delays only this worker's calls,
and a stall of the gateway's loop no longer delays their frames. The worker ends when the gateway's end
of the socket closes, or when told to (``serve``): it hangs up its calls first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from typing import Any

from realtime_gw.server.webrtc import media_wire as wire
from realtime_gw.server.webrtc.ice import HostCandidates
from realtime_gw.server.webrtc.metrics import MediaLedger
from realtime_gw.server.webrtc.peer import Peer

log = logging.getLogger(__name__)

FIGURES_EVERY_S = 0.5
"""How often each call's new media figures go to the gateway (its /metrics lag by at most this)."""
HANG_UP_TIMEOUT_S = 3.0
"""As the worker ends: how long its calls' peer connections may take to close (within the gateway's
``media_pool.STOP_TIMEOUT_S``, after which it is terminated)."""


class WorkerCall:
    def __init__(self, worker: Worker, call_id: str, expect_channel: bool) -> None:
        self.worker, self.id = worker, call_id
        self.peer = Peer(expect_channel, MediaLedger(publish=False))
        self.peer.listener = self
        self.peer.on_connection_state = lambda state: self.worker.send(wire.State(self.id, state))
        self.outgoing: asyncio.Queue[str] = asyncio.Queue()
        self.tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def open(self, m: wire.Open) -> None:
        ports = range(*m.ports) if m.ports is not None else None
        try:
            answer = await self.peer.answer(m.sdp, HostCandidates(m.address, ports), m.input_prefetch_frames)
        except Exception as e:
            self.worker.calls.pop(self.id, None)
            self.worker.send(wire.Answered(self.id, "", f"{type(e).__name__}: {e}"))
            return
        self.worker.send(wire.Answered(self.id, answer))
        self.spawn(self._caller_audio())
        self.spawn(self._channel_in())
        self.spawn(self._channel_out())

    async def _caller_audio(self) -> None:
        async for mono, rate in self.peer.caller_audio():
            self.worker.send(wire.Input(self.id, mono, rate))

    async def _channel_in(self) -> None:
        channel = self.peer.channel
        await channel.opened.wait()
        if not channel.gone:
            self.worker.send(wire.ChannelOpened(self.id, channel.max_message_bytes))
        while True:
            message = await channel.receive()
            if message["type"] == "websocket.disconnect":
                self.worker.send(wire.ChannelGone(self.id))
                return
            self.worker.send(wire.Received(self.id, message.get("text"), message.get("bytes")))

    async def _channel_out(self) -> None:
        while True:
            text = await self.outgoing.get()
            try:
                await self.peer.channel.send_text(text)
            except RuntimeError:
                self.worker.send(wire.ChannelGone(self.id))
                return
            self.worker.send(wire.Delivered(self.id, len(text)))

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        rtp = await self.peer.close()
        self.worker.calls.pop(self.id, None)
        self.worker.send(wire.Closed(self.id, self.peer.ledger.report(), rtp))

    # PlaybackListener: the track's reports, as messages
    def playback_started(self, response_id: str) -> None:
        self.worker.send(wire.Playback(self.id, "started", response_id))

    def playback_sent(self, response_id: str, sent_ms: float) -> None:
        self.worker.send(wire.Playback(self.id, "sent", response_id, sent_ms))

    def playback_stopped(self, response_id: str) -> None:
        self.worker.send(wire.Playback(self.id, "stopped", response_id))


class Worker:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.out = wire.Writer(writer)
        self.calls: dict[str, WorkerCall] = {}
        self.closing: set[asyncio.Task[None]] = set()
        """Calls being closed (held here: the loop keeps only weak references to tasks)."""

    def send(self, message: wire.ToGateway) -> None:
        self.out.send(message)

    def handle(self, m: object) -> None:
        if isinstance(m, wire.Open):
            call = self.calls[m.call] = WorkerCall(self, m.call, m.expect_channel)
            call.spawn(call.open(m))
            return
        call = self.calls.get(getattr(m, "call", ""))
        if call is None:
            return  # a call that has ended here; the gateway learns so from its Closed
        try:
            self._apply(call, m)
        except Exception:  # one call's bad message (audio it cannot convert) ends that call, not the worker's
            log.exception("media worker: call %s ended on its %s", call.id, type(m).__name__)
            self.calls.pop(call.id, None)
            self.close_call(call)

    def close_call(self, call: WorkerCall) -> None:
        task = asyncio.ensure_future(call.close())
        self.closing.add(task)
        task.add_done_callback(self.closing.discard)

    def _apply(self, call: WorkerCall, m: object) -> None:
        reply = call.peer.reply
        match m:
            case wire.Push():
                reply.push(m.response_id, m.audio, m.output_format)
            case wire.InputRate():
                call.peer.want_input_rate(m.rate)
            case wire.Complete():
                reply.complete(m.response_id)
            case wire.Purge():
                reply.purge(m.response_id)
            case wire.Send():
                call.outgoing.put_nowait(m.text)
            case wire.Close():
                self.close_call(call)
            case _:
                log.warning("media worker: unexpected %s", type(m).__name__)

    async def hang_up_all(self) -> None:
        """Every call closed at once (bounded: a peer that does not close is left to the exit), each
        reported ``Closed``, and that flushed to the gateway before the socket closes."""
        calls = [call.close() for call in list(self.calls.values())]
        if calls:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), HANG_UP_TIMEOUT_S)
        self.out.flush()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.drain(), HANG_UP_TIMEOUT_S)
        self.writer.close()

    async def report_figures(self) -> None:
        while True:
            await asyncio.sleep(FIGURES_EVERY_S)
            for call in list(self.calls.values()):
                figures = call.peer.ledger.report()
                if figures.frames or figures.reply_frames or figures.input_s:
                    self.send(wire.Figures(call.id, figures))


async def serve(sock: socket.socket) -> None:
    """Until the gateway's end of the socket closes (or is shut for writing: the gateway asks it to end),
    or a SIGTERM/SIGINT comes: then every call is hung up (its peer connection closed, so the caller
    sees it end at once) and reported closed, and the worker exits."""
    stream, writer = await asyncio.open_unix_connection(sock=sock)
    worker = Worker(writer)
    reader = wire.Reader(stream, wire.ToWorker)
    figures = asyncio.create_task(worker.report_figures())
    asked_to_end = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, asked_to_end.set)

    async def read() -> None:
        while (message := await reader.read()) is not None:
            worker.handle(message)

    reading, ending = asyncio.create_task(read()), asyncio.create_task(asked_to_end.wait())
    try:
        await asyncio.wait({reading, ending}, return_when=asyncio.FIRST_COMPLETED)
        if reading.done() and not reading.cancelled() and (err := reading.exception()) is not None:
            log.error("the gateway's messages could not be read; hanging up every call", exc_info=err)
    finally:
        for task in (reading, ending, figures):
            task.cancel()
        await worker.hang_up_all()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="media-worker %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(socket.socket(fileno=int(sys.argv[1]))))


if __name__ == "__main__":
    main()
