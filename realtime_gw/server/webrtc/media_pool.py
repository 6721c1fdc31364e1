"""Media worker processes (``webrtc_media_workers``): where calls' peer connections run, off the loop
that runs sessions.

``MediaPool`` starts the workers with the first call (a gateway that takes none spawns nothing; that
call waits the second a worker takes to start) and gives each new call to the one with the fewest calls
(a dead one is started again in its place). A call was admitted before it gets here, by the same
admission as a WebSocket session: the pool adds no limit of its own. ``RemotePeer`` is the call's
media side as ``CallConnection`` sees it (``call.CallMedia``): its data channel (``RemoteChannel``, with
the same inbox bounds and a send window in place of SCTP's buffered amount), its reply track
(``RemoteTrack``) and the caller's decoded audio, all through the worker's socket (``media_wire.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from collections.abc import AsyncIterator

from realtime_gw.server.webrtc import media_wire as wire
from realtime_gw.server.webrtc.channel import BUFFERED_HIGH, BUFFERED_LOW, EventChannel
from realtime_gw.server.webrtc.ice import HostCandidates
from realtime_gw.server.webrtc.metrics import MediaLedger, RtpFigures
from realtime_gw.server.webrtc.peer import PlaybackListener

log = logging.getLogger(__name__)

ANSWER_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 5.0
"""A worker asked to end has this long to hang up its calls and exit; then it is terminated (SIGTERM),
and killed ``TERMINATE_TIMEOUT_S`` later."""
TERMINATE_TIMEOUT_S = 1.0
MAX_INPUT_FRAMES = 500
"""The caller's decoded frames (20 ms) waiting for a session that does not take them (10 s): past it
the call is ended; a session that stuck is not fed forever."""
MAX_UNSENT_BYTES = 64 * 1024 * 1024
"""Bytes for a worker waiting in the gateway's socket buffer: past it the worker is stuck; it is ended."""
PURGED_REMEMBERED = 32
"""Purged replies whose late reports are still dropped. A report trails its purge by one trip through
the worker's socket, so only the last few purges can have any on their way; a call of hours keeps no
more than these."""


class MediaWorkerLost(RuntimeError):
    """The call's media worker ended before it answered."""


class RemoteChannel(EventChannel):
    """The worker's ``oai-events`` channel: messages arrive as ``Received``; what is sent waits while
    more than ``BUFFERED_HIGH`` characters are on their way (the worker acknowledges each send)."""

    def __init__(self, expect_channel: bool, peer: RemotePeer) -> None:
        super().__init__(expect_channel)
        self.peer = peer
        self.in_flight = 0

    def remote_opened(self, max_message_bytes: int) -> None:
        self.max_message_bytes = max_message_bytes
        self.opened.set()

    def remote_delivered(self, chars: int) -> None:
        self.in_flight -= chars
        if self.in_flight <= BUFFERED_LOW:
            self.drained.set()

    def received(self, text: str | None, data: bytes | None) -> None:
        self._received(text if text is not None else data or b"")

    def disconnected(self) -> None:
        super().disconnected()
        self.drained.set()

    async def send_text(self, data: str) -> None:
        if not self.expect_channel:
            return
        await self.opened.wait()
        while not self.gone and self.in_flight > BUFFERED_HIGH:
            self.drained.clear()
            await self.drained.wait()
        if self.gone:
            raise RuntimeError("the data channel is closed")
        self.in_flight += len(data)
        self.peer.send(wire.Send(self.peer.id, data))

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        """The session ended: let what is on its way go out (briefly); the call then hangs up."""
        with contextlib.suppress(asyncio.TimeoutError):
            async with asyncio.timeout(1.0):
                while self.in_flight > 0 and not self.gone:
                    self.drained.clear()
                    await self.drained.wait()


class RemoteTrack:
    """The worker's reply track; mirrors which replies are playing from its reports, so a purge knows
    (as ``ReplyTrack.purge`` does) whether it cut one. Reports about a purged reply that were already on
    their way are dropped (the last ``PURGED_REMEMBERED`` purged replies are remembered)."""

    def __init__(self, peer: RemotePeer) -> None:
        self.peer = peer
        self.playing: set[str] = set()
        self.purged: dict[str, None] = {}
        """An ordered set, oldest first."""

    def push(self, response_id: str, audio: bytes, output_format: str) -> None:
        if audio:
            self.purged.pop(response_id, None)
            self.peer.send(wire.Push(self.peer.id, response_id, audio, output_format))

    def complete(self, response_id: str) -> None:
        self.peer.send(wire.Complete(self.peer.id, response_id))

    def purge(self, response_id: str | None) -> bool:
        self.peer.send(wire.Purge(self.peer.id, response_id))
        cut = set(self.playing) if response_id is None else self.playing & {response_id}
        self.playing -= cut
        for rid in sorted(cut) if response_id is None else [response_id]:
            self.purged.pop(rid, None)
            self.purged[rid] = None
        while len(self.purged) > PURGED_REMEMBERED:
            del self.purged[next(iter(self.purged))]
        return bool(cut)

    def report(self, m: wire.Playback, listener: PlaybackListener) -> None:
        if m.response_id in self.purged:
            return
        if m.what == "started":
            self.playing.add(m.response_id)
            listener.playback_started(m.response_id)
        elif m.what == "sent":
            listener.playback_sent(m.response_id, m.sent_ms)
        else:
            self.playing.discard(m.response_id)
            listener.playback_stopped(m.response_id)


class RemotePeer:
    """A call whose peer connection runs in a media worker (``call.CallMedia``)."""

    def __init__(self, worker: MediaWorker, call_id: str, expect_channel: bool) -> None:
        self.worker, self.id = worker, call_id
        self.channel = RemoteChannel(expect_channel, self)
        self.reply = RemoteTrack(self)
        self.ledger = MediaLedger()
        self.listener: PlaybackListener | None = None
        self.answer = ""
        self.state = "new"
        self.answered: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[RtpFigures | None] = asyncio.get_running_loop().create_future()
        self.input: asyncio.Queue[tuple[bytes, int] | None] = asyncio.Queue(MAX_INPUT_FRAMES)
        self.input_rate: int | None = None
        """The rate the worker resamples the caller's audio to (the session's, once asked)."""
        self.starved = False
        """Its session took no audio for too long: the call is ending; its frames are dropped."""
        self._close_sent = False

    @property
    def connected(self) -> bool:
        return self.state == "connected"

    def send(self, message: wire.ToWorker) -> None:
        self.worker.send(message)

    def want_input_rate(self, rate: int) -> None:
        if rate != self.input_rate:
            self.input_rate = rate
            self.send(wire.InputRate(self.id, rate))

    async def caller_audio(self) -> AsyncIterator[tuple[bytes, int]]:
        """The worker's frames; those that queued up while the session was busy go on as one append."""
        held: tuple[bytes, int] | None = None
        ended = False
        while not ended:
            item = held or await self.input.get()
            held = None
            if item is None:
                return
            mono, rate = item
            chunks = [mono]
            while not self.input.empty():
                following = self.input.get_nowait()
                if following is None:
                    ended = True
                    break
                if following[1] != rate:  # the caller's codec changed: the next append
                    held = following
                    break
                chunks.append(following[0])
            yield b"".join(chunks), rate

    async def close(self) -> RtpFigures | None:
        if not self._close_sent:
            self._close_sent = True
            self.send(wire.Close(self.id))
        with contextlib.suppress(asyncio.TimeoutError):
            return await asyncio.wait_for(asyncio.shield(self.closed), CLOSE_TIMEOUT_S)
        return None

    def handle(self, m: object) -> None:
        match m:
            case wire.Answered():
                if not self.answered.done():
                    if m.error:  # the worker dropped the call already: nothing more will come of it
                        self.answered.set_exception(RuntimeError(m.error))
                        self.ended()
                    else:
                        self.answered.set_result(m.sdp)
            case wire.Input():
                if self.starved:
                    return  # frames the worker sent before it heard the call end
                try:
                    self.input.put_nowait((m.mono, m.rate))
                except asyncio.QueueFull:
                    self.starved = True
                    log.warning("call %s: its session took no audio for 10 s; ended", self.id)
                    self.channel.disconnected()
            case wire.ChannelOpened():
                self.channel.remote_opened(m.max_message_bytes)
            case wire.Received():
                self.channel.received(m.text, m.data)
            case wire.ChannelGone():
                self.channel.disconnected()
            case wire.Delivered():
                self.channel.remote_delivered(m.chars)
            case wire.Playback():
                if self.listener is not None:
                    self.reply.report(m, self.listener)
            case wire.State():
                self.state = m.connection
                if m.connection in ("failed", "closed"):
                    self.channel.disconnected()
            case wire.Figures():
                self.ledger.absorb(m.media)
            case wire.Closed():
                self.ledger.absorb(m.media)
                self.ended(m.rtp)
            case _:
                log.warning("media pool: unexpected %s", type(m).__name__)

    def ended(self, rtp: RtpFigures | None = None) -> None:
        """The worker is done with the call (or gone): everything that waits on it stops waiting."""
        self.channel.disconnected()
        if not self.answered.done():
            self.answered.set_exception(MediaWorkerLost("the media worker ended"))
        if not self.closed.done():
            self.closed.set_result(rtp)
        with contextlib.suppress(asyncio.QueueFull):
            self.input.put_nowait(None)
        self.worker.calls.pop(self.id, None)


class MediaWorker:
    """One worker process and its socket."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.calls: dict[str, RemotePeer] = {}
        self.proc: asyncio.subprocess.Process | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.out: wire.Writer | None = None
        self.reading: asyncio.Task[None] | None = None
        self.stopping = False

    @property
    def alive(self) -> bool:
        return (
            self.proc is not None
            and self.proc.returncode is None
            and self.writer is not None
            and not self.writer.is_closing()
            and self.reading is not None
            and not self.reading.done()
        )

    async def start(self) -> None:
        self.stopping = False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "realtime_gw.server.webrtc.media_worker", str(theirs.fileno()),
                pass_fds=(theirs.fileno(),),
                # not in the gateway's process group: a terminal's Ctrl-C (or a unit's SIGTERM to the
                # group) reaches the gateway, which hangs up its calls; a worker ends when its socket does
                start_new_session=True,
            )  # fmt: skip
        finally:
            theirs.close()
        stream, self.writer = await asyncio.open_unix_connection(sock=ours)
        self.out = wire.Writer(self.writer)
        self.reading = asyncio.create_task(self._read(wire.Reader(stream, wire.ToGateway)))

    def send(self, message: wire.ToWorker) -> None:
        out = self.out
        if out is None or out.stream.is_closing():
            return
        if out.unsent_bytes() > MAX_UNSENT_BYTES:
            log.error("media worker %d takes no messages; ending it and its calls", self.index)
            self.kill()
            return
        out.send(message)

    async def _read(self, reader: wire.Reader) -> None:
        broken = False
        try:
            while (message := await reader.read()) is not None:
                peer = self.calls.get(getattr(message, "call", ""))
                if peer is not None:
                    peer.handle(message)
        except Exception:
            broken = True
            log.exception("media worker %d: broken message; ending it", self.index)
        finally:
            if self.writer is not None:
                self.writer.close()  # no new call goes to it
            for peer in list(self.calls.values()):
                peer.ended()
            if not self.stopping:  # it ended (or broke) on its own: make sure it is gone
                if not broken and self.proc is not None:  # its socket closed as it exits: let it
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.proc.wait(), TERMINATE_TIMEOUT_S)
                self.kill()

    def kill(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()

    async def stop(self) -> None:
        """Asks the worker to end: its input ends (the socket shut for writing), so it hangs up its calls
        (each peer connection closed, which the caller sees at once), reports them closed and exits.
        One that has not exited within ``STOP_TIMEOUT_S`` is terminated, then killed."""
        self.stopping = True
        if self.writer is not None and not self.writer.is_closing():
            with contextlib.suppress(OSError, RuntimeError):
                if self.out is not None:
                    self.out.flush()
                self.writer.write_eof()
        if self.proc is not None:
            proc = self.proc
            for escalate, wait_s in ((None, STOP_TIMEOUT_S), (proc.terminate, TERMINATE_TIMEOUT_S), (proc.kill, None)):
                if proc.returncode is not None:
                    break
                if escalate is not None:
                    log.warning("media worker %d did not end when asked; %s", self.index, escalate.__name__)
                    with contextlib.suppress(ProcessLookupError):
                        escalate()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(proc.wait(), wait_s)
        if self.reading is not None:
            await asyncio.gather(self.reading, return_exceptions=True)
        if self.writer is not None:
            self.writer.close()


class MediaPool:
    def __init__(self, count: int) -> None:
        self.workers = [MediaWorker(i) for i in range(count)]
        self._restarts: dict[int, asyncio.Task[None]] = {}

    async def start(self) -> None:
        await asyncio.gather(*(w.start() for w in self.workers))

    async def stop(self) -> None:
        for task in self._restarts.values():
            task.cancel()
        await asyncio.gather(*(w.stop() for w in self.workers))

    async def _restart(self, worker: MediaWorker) -> None:
        again = worker.proc is not None
        await worker.stop()
        await worker.start()
        if again:
            log.warning("media worker %d started again", worker.index)
        else:
            log.info("media worker %d started", worker.index)

    def _restarting(self, worker: MediaWorker) -> asyncio.Task[None]:
        task = self._restarts.get(worker.index)
        if task is None or task.done():
            task = self._restarts[worker.index] = asyncio.create_task(self._restart(worker))
        return task

    async def open(
        self, call_id: str, sdp: str, expect_channel: bool, hosts: HostCandidates, input_prefetch_frames: int
    ) -> RemotePeer:
        """The call's peer connection in the least-loaded live worker, answered (or the worker's error).
        Dead workers are started again in the background; the call waits only when none is alive."""
        for dead in [w for w in self.workers if not w.alive]:
            self._restarting(dead)
        alive = [w for w in self.workers if w.alive]
        if not alive:
            await asyncio.shield(self._restarting(self.workers[0]))
            if not self.workers[0].alive:  # it died as it started: the call is not given to it
                raise MediaWorkerLost("no media worker could be started")
            alive = [self.workers[0]]
        worker = min(alive, key=lambda w: len(w.calls))
        peer = worker.calls[call_id] = RemotePeer(worker, call_id, expect_channel)
        ports = (hosts.ports.start, hosts.ports.stop) if hosts.ports is not None else None
        peer.send(wire.Open(call_id, sdp, expect_channel, hosts.address or "", ports, input_prefetch_frames))
        try:
            peer.answer = await asyncio.wait_for(asyncio.shield(peer.answered), ANSWER_TIMEOUT_S)
        except BaseException:
            await peer.close()
            raise
        return peer
