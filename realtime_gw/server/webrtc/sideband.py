"""The sideband: ``WS /v1/realtime?call_id=rtc_…`` (a deployment key, not a client secret) joins a live
call's session, as an app's server does to watch and steer a browser's call (tools, instructions).

It sees every event the call's data channel gets (not the audio, which is on the track) and its events
go into the same session mailbox as the caller's. It ends with the call, or on its own.
"""

from __future__ import annotations

import asyncio

from starlette.websockets import WebSocket, WebSocketDisconnect

from realtime_gw.protocols import realtime as rt
from realtime_gw.server import auth, realtime_ws
from realtime_gw.server.admission import Admission
from realtime_gw.server.realtime_input import OFFLOAD_DECODE_BYTES
from realtime_gw.server.webrtc.call import Call


async def realtime_or_sideband(ws: WebSocket) -> None:
    """``/v1/realtime``: a session of its own, or with ``call_id`` the sideband of a call."""
    call_id = ws.query_params.get("call_id")
    if call_id is None:
        await realtime_ws.realtime_endpoint(ws)
    else:
        await sideband_endpoint(ws, call_id)


async def sideband_endpoint(ws: WebSocket, call_id: str) -> None:
    admission = Admission(ws.app.state.gateway, "realtime")
    refusal = admission.check(ws.headers)
    if refusal is not None or admission.secret is not None:
        await ws.close(
            code=1008, reason=refusal.message if refusal else "the sideband needs a deployment key"
        )
        return
    subprotocol = "realtime" if "realtime" in auth.offered_subprotocols(ws.headers) else None
    await ws.accept(subprotocol=subprotocol)
    call: Call | None = ws.app.state.calls.get(call_id)
    if call is None or call.owner != admission.key:
        error = rt.error_event(f"No live call '{call_id}'", code="call_not_found", param="call_id")
        await ws.send_text(rt.encode_server_event(error).decode())
        await ws.close(code=1008, reason="no such call")
        return
    connection = call.connection
    connection.sidebands.add(ws)
    max_bytes = connection.config.max_frame_bytes
    try:
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            text = msg.get("text")
            if text is None or len(text) > max_bytes:
                event = rt.error_event("Send JSON text events within max_frame_bytes", code="invalid_frame")
            elif len(text) > OFFLOAD_DECODE_BYTES:  # big JSON and base64 stay off the event loop
                event = await asyncio.to_thread(rt.decode_client_event, text)
            else:
                event = rt.decode_client_event(text)
            # The call's session task drains the mailbox; once the call has ended nobody does.
            await asyncio.wait_for(connection.mailbox.put(event), connection.config.send_timeout_s)
    except (WebSocketDisconnect, RuntimeError, TimeoutError):
        return
    finally:
        connection.sidebands.discard(ws)
