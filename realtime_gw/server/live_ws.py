"""``/v1/live/sessions``: GPT-Live on the realtime connection's machinery.

The same reader (limits, input budget, backpressure), mailbox, outbox (pacing, purge on barge-in),
writer and worker pumps as ``/v1/realtime``; what differs is the protocol face: the session is a
``LiveSession`` (the realtime session behind a GPT-Live face), frames are decoded by
``protocols.live`` and written through ``LiveWire``, which keeps the output audio one continuous
stream. A filler task asks the wire for silence every half frame, so the stream keeps up with the
session clock while the voice is quiet. Expiry, idleness and the server's shutdown end the session with
``session.closed``.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

from starlette.websockets import WebSocket

from realtime_gw.protocols import live
from realtime_gw.server.admission import Admission, admit_socket
from realtime_gw.server.auth import Refusal
from realtime_gw.server.gateway import Gateway
from realtime_gw.server.realtime_input import ClientInput
from realtime_gw.server.realtime_ws import RealtimeConnection, serve_admitted, session_limits
from realtime_gw.server.s2s_link import duplex_models
from realtime_gw.sessions.events import Send, ServerStopping
from realtime_gw.sessions.live import LiveSession
from realtime_gw.sessions.live_wire import FRAME_MS, LiveWire

NO_LIMIT_S = 365 * 24 * 3600.0
"""``expires_at`` of a session without a maximum duration (``realtime_max_session_s = 0``)."""


class LiveConnection(RealtimeConnection):
    session: LiveSession

    def __init__(self, ws: WebSocket, gateway: Gateway, session: LiveSession) -> None:
        super().__init__(ws, gateway, session)  # type: ignore[arg-type]
        self.input = ClientInput(
            ws,
            self.config,
            self.mailbox,
            lambda: len(self.outbox),
            decode=live.decode_client_event,
            audio_events=(live.InputAudioAppendEvent,),
            refusal=live.error_event,
        )
        self.wire = LiveWire()

    async def run(self) -> None:
        self.spawn(self._fill_silence(), "silence")
        self.spawn(self._on_server_stopping(), "stopping")
        await super().run()

    async def _on_server_stopping(self) -> None:
        await self.gateway.stopping.wait()
        await self.mailbox.put(ServerStopping())

    async def _write(self, event: Any) -> None:
        """The outbox let ``event`` go: write its GPT-Live form, if the protocol has one."""
        out = self.wire.translate(event, time.monotonic())
        if out is not None:
            await super()._write(out)  # type: ignore[arg-type]

    def _expired(self) -> bool:
        """Past the idle timeout or the maximum duration: ``session.closed`` (expired), then close."""
        if self.input.lifetime.expired(time.monotonic()) is None:
            return False
        self._run_effects(self.session.end("expired", time.monotonic()))
        return True

    async def _fill_silence(self) -> None:
        try:
            while self.close_reason is None:
                await asyncio.sleep(FRAME_MS / 2000)
                for frame in self.wire.silence(time.monotonic(), self.outbox.queued_audio > 0):
                    self._enqueue(Send(frame))  # type: ignore[arg-type]
        except Exception:  # the outbox is full (the client is not reading): the connection ends
            self._signal_disconnect()


def _refusal_frame(r: Refusal) -> str:
    event = live.error_event(r.message, r.code)
    event.event_id = "event_" + secrets.token_hex(6)
    return live.encode_server_event(event).decode()


async def live_endpoint(ws: WebSocket) -> None:
    gateway: Gateway = ws.app.state.gateway
    admission = Admission(gateway, "live")
    if not await admit_socket(ws, admission, _refusal_frame):
        return
    now = time.monotonic()
    session = LiveSession(
        "sess_" + secrets.token_hex(8),
        # the model the voice and the Responses backend run on: what info and Responses snapshots name
        session_limits(gateway, getattr(gateway.responder, "model", gateway.responder.name), admission.key),
        now,
        gateway.config.realtime_max_session_s or NO_LIMIT_S,
        unix_offset_s=time.time() - now,
        duplex_models=duplex_models(gateway.workers.s2s, gateway.config, gateway.s2s_voices_of(admission.key)),
    )
    await serve_admitted(ws, admission, LiveConnection(ws, gateway, session))
