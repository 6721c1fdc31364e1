"""A real WebRTC caller (aiortc) for tests: a microphone track that plays queued speech
(silence otherwise), a speaker that records what arrives on the gateway's track, and the ``oai-events``
data channel, each event read by ``parse`` (tests pass one that validates against the openai SDK)."""

from __future__ import annotations

import asyncio
import fractions
import json
import re
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame

from realtime_gw.server.webrtc.ice import HostCandidates
from realtime_gw.testing.gateway import LiveServer
from tests.event_wait import first_event

RATE = 48000
FRAME = 960  # 20 ms


class Microphone(MediaStreamTrack):
    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.queued = bytearray()
        self._start: float | None = None
        self._pts = 0

    def say(self, pcm48: bytes) -> None:
        self.queued += pcm48

    async def recv(self) -> AudioFrame:
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._pts += FRAME
            await asyncio.sleep(max(0.0, self._start + self._pts / RATE - time.monotonic()))
        chunk = bytes(self.queued[: FRAME * 2]).ljust(FRAME * 2, b"\x00")
        del self.queued[: FRAME * 2]
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME)
        frame.planes[0].update(chunk)
        frame.pts, frame.sample_rate, frame.time_base = self._pts, RATE, fractions.Fraction(1, RATE)
        return frame


def strip_candidates(sdp: str) -> str:
    """What a browser's first offer looks like: no candidates (trickle ICE)."""
    return "".join(line for line in sdp.splitlines(keepends=True) if not line.startswith(("a=candidate", "a=end-of-candidates")))


def answered_codec(sdp: str) -> str:
    """The audio codec an answer chose (its m=audio line's first payload type), e.g. "opus"."""
    lines = sdp.splitlines()
    first_pt = next(line for line in lines if line.startswith("m=audio ")).split()[3]
    rtpmap = next(line for line in lines if line.startswith(f"a=rtpmap:{first_pt} "))
    return rtpmap.split()[1].split("/")[0]


class Caller:
    def __init__(self, codecs: list[str] | None = None, parse: Callable[[str], Any] | None = None) -> None:
        self.parse = parse or (lambda raw: json.loads(raw, object_hook=lambda d: SimpleNamespace(**d)))
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.mic = Microphone()
        sender = self.pc.addTrack(self.mic)
        if codecs:
            transceiver = next(t for t in self.pc.getTransceivers() if t.sender is sender)
            caps = RTCRtpSender.getCapabilities("audio").codecs
            transceiver.setCodecPreferences([c for c in caps if c.mimeType in codecs])
        self.channel = self.pc.createDataChannel("oai-events")
        self.events: list[tuple[float, Any]] = []
        self.heard: list[tuple[float, np.ndarray]] = []  # (arrival, mono int16 at 48 kHz)
        self.heard_at_s: list[float] = []  # each heard frame's media time (its RTP timestamp), in seconds
        self.codec: str | None = None
        self._new = asyncio.Event()
        self._opened = asyncio.Event()
        self.channel.on("open", self._opened.set)
        self.channel.on("message", self._on_message)
        self.pc.on("track", lambda track: asyncio.ensure_future(self._speaker(track)))
        HostCandidates("127.0.0.1", None).apply(self.pc)

    def _on_message(self, raw: str) -> None:
        self.events.append((time.monotonic(), self.parse(raw)))
        self._new.set()

    async def _speaker(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            samples = frame.to_ndarray().reshape(-1, len(frame.layout.channels)).mean(axis=1)
            if frame.sample_rate != RATE:  # G.711: 8 kHz; count time, not samples
                samples = np.repeat(samples, RATE // frame.sample_rate)
            self.heard.append((time.monotonic(), samples.astype(np.int16)))
            self.heard_at_s.append(float(frame.pts * frame.time_base) if frame.pts is not None else 0.0)

    async def offer(self, max_message_size: int | None = None) -> str:
        """The offer as a browser sends it; ``max_message_size``: advertise a smaller one (as some do)."""
        await self.pc.setLocalDescription(await self.pc.createOffer())
        sdp = strip_candidates(self.pc.localDescription.sdp)
        if max_message_size is not None:
            sdp = re.sub(r"a=max-message-size:\d+", f"a=max-message-size:{max_message_size}", sdp)
        return sdp

    async def connect(self, answer: str) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await asyncio.wait_for(self._opened.wait(), 10)
        self.codec = answered_codec(answer)

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    async def wait_for(self, pred: Callable[[Any], bool], timeout: float = 60.0, after: int = 0) -> Any:
        return await first_event(self.events, self._new, pred, timeout, after)

    def types(self) -> list[str]:
        return [ev.type for _, ev in self.events]

    def at(self, pred: Callable[[Any], bool]) -> float:
        return next(t for t, ev in self.events if pred(ev))

    def heard_between(self, start: float, end: float) -> bytes:
        return b"".join(s.tobytes() for t, s in self.heard if start <= t <= end)

    def loud_after(self, t0: float, threshold: int = 300) -> list[float]:
        """Arrival times of frames with sound in them after ``t0``."""
        return [t for t, s in self.heard if t > t0 and np.abs(s).max(initial=0) > threshold]

    async def close(self) -> None:
        await self.pc.close()


async def call(server: LiveServer, caller: Caller, key: str = "test-key", multipart: bool = False,
               session: dict[str, Any] | None = None, max_message_size: int | None = None,
               intent: str | None = None, seed: int | None = None) -> httpx.Response:  # fmt: skip
    """POST the caller's offer (``intent``: ``?intent=``; ``seed``: ``?seed=``, a speech-to-speech model's
    sampling seed); on 201, connect with the answer."""
    sdp = await caller.offer(max_message_size)
    headers = {"Authorization": f"Bearer {key}"}
    params = {k: v for k, v in (("intent", intent), ("seed", None if seed is None else str(seed))) if v} or None
    async with httpx.AsyncClient(base_url=server.http, timeout=30, params=params) as http:
        if multipart:
            files: dict[str, Any] = {"sdp": (None, sdp)}
            if session is not None:
                files["session"] = (None, json.dumps(session))
            resp = await http.post("/v1/realtime/calls", files=files, headers=headers)
        else:
            resp = await http.post("/v1/realtime/calls", content=sdp, headers={**headers, "Content-Type": "application/sdp"})
    if resp.status_code == 201:
        await caller.connect(resp.text)
    return resp
