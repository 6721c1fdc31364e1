"""``POST /v1/realtime/calls`` (an SDP offer in, the answer out), ``.../calls/{id}/hangup``, and CORS.

The offer comes as ``application/sdp`` or as ``multipart/form-data`` (an ``sdp`` part and an optional
``session`` JSON part, what the openai SDK sends). The call is admitted like a WebSocket session (the
same key or client secret, origin, and session limits); its session starts now and its events wait for
the data channel. The answer is sent once every local candidate is gathered (one host candidate,
``ice.py``), so offers without candidates connect: the caller's address is learnt from its checks.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

import msgspec
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response

from realtime_gw.protocols import realtime as rt
from realtime_gw.server.admission import Admission
from realtime_gw.server.client_secret_endpoint import config_settings, error_response
from realtime_gw.server.gateway import Gateway
from realtime_gw.server.realtime_ws import open_session
from realtime_gw.server.s2s_link import session_seed
from realtime_gw.server.speech import bounded_body
from realtime_gw.server.webrtc.call import Call, CallConnection, CallMedia
from realtime_gw.server.webrtc.ice import HostCandidates, parse_port_range
from realtime_gw.server.webrtc.media_pool import MediaPool, MediaWorkerLost
from realtime_gw.server.webrtc.metrics import MediaLedger
from realtime_gw.server.webrtc.peer import Peer
from realtime_gw.sessions.settings import SessionError

CORS_HEADERS = "authorization, content-type, x-openai-agents-sdk, openai-beta"
Endpoint = Callable[[Request], Awaitable[Response]]


class OfferError(Exception):
    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def calls_of(request: Request) -> dict[str, Call]:
    calls: dict[str, Call] = request.app.state.calls
    return calls


def with_cors(endpoint: Endpoint) -> Endpoint:
    """Answers the preflight and marks the response for an allowed browser origin (the gateway's
    origin rules: its own page, ``allowed_origins``, the hosts it serves by name)."""

    async def handle(request: Request) -> Response:
        origin = request.headers.get("origin")
        access = request.app.state.gateway.access
        allowed = origin is not None and access.origin_allowed(origin, request.headers.get("host"))
        response = (
            Response(status_code=204 if allowed else 403)
            if request.method == "OPTIONS"
            else await endpoint(request)
        )
        if allowed:
            assert origin is not None
            response.headers.update({
                "access-control-allow-origin": origin,
                "access-control-allow-methods": "POST, OPTIONS",
                "access-control-allow-headers": CORS_HEADERS,
                "access-control-expose-headers": "Location",
                "access-control-max-age": "600",
                "vary": "Origin",
            })  # fmt: skip
        return response

    return handle


async def _read_capped(request: Request, limit: int) -> bytes:
    body = await bounded_body(request, limit)
    if body is None:
        raise OfferError(413, f"offer over {limit} bytes (webrtc_max_offer_bytes)", "request_too_large")
    request._body = body  # what request.form() parses
    return body


async def _offer(request: Request, limit: int) -> tuple[str, rt.SessionParams | None]:
    """The SDP offer and the optional session config, or ``OfferError``."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await _read_capped(request, limit)
    session: rt.SessionParams | None = None
    if kind == "application/sdp":
        sdp = body.decode("utf-8", "replace")
    elif kind == "multipart/form-data":
        form = await request.form()
        part, raw_session = form.get("sdp"), form.get("session")
        if part is None:
            raise OfferError(400, "the multipart body has no 'sdp' part", "missing_required_parameter")
        sdp = (await part.read()).decode("utf-8", "replace") if isinstance(part, UploadFile) else part
        if raw_session is not None:
            raw = await raw_session.read() if isinstance(raw_session, UploadFile) else raw_session.encode()
            try:
                session = msgspec.json.decode(raw, type=rt.SessionParams)
            except msgspec.DecodeError as e:
                raise OfferError(400, f"invalid 'session' part: {e}", "invalid_value") from None
    else:
        raise OfferError(
            400,
            "send the SDP offer as application/sdp, or multipart/form-data with an 'sdp' part",
            "invalid_request",
        )
    if not sdp.lstrip().startswith("v=0"):
        raise OfferError(400, "the body is not an SDP offer", "invalid_offer")
    if "\nm=audio " not in sdp.replace("\r\n", "\n"):
        raise OfferError(400, "the offer has no audio m-line: a call needs an audio track", "invalid_offer")
    return sdp, session


async def create_call(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    admission = Admission(gateway, "realtime")
    refusal = admission.check(request.headers)
    if refusal is not None:
        return error_response(refusal.status, refusal.message, refusal.code)
    try:
        seed = session_seed(request.query_params.get("seed", ""))
    except ValueError as e:
        return error_response(400, str(e), "invalid_value", "seed")
    try:
        sdp, session_params = await _offer(request, gateway.config.webrtc_max_offer_bytes)
        if session_params is not None:
            await config_settings(gateway, session_params, admission.key)  # refused here, not after the answer
    except OfferError as e:
        return error_response(e.status, str(e), e.code)
    except SessionError as e:
        return error_response(400, str(e), e.code, e.param and f"session.{e.param}")
    refusal = admission.enter()
    if refusal is not None:
        return error_response(refusal.status, refusal.message, refusal.code)
    try:
        call = await _answer(request, gateway, sdp, session_params, admission, seed)
    except MediaWorkerLost as e:
        admission.leave()
        return error_response(503, f"the call's media worker failed ({e}); try again", "server_error")
    except Exception as e:
        admission.leave()
        return error_response(400, f"the offer could not be answered: {e}", "invalid_offer")
    except BaseException:  # cancelled (the client left): its session slot comes back all the same
        admission.leave()
        raise
    call.start(admission, calls_of(request))
    return Response(call.answer, 201, {"location": f"/v1/realtime/calls/{call.id}"}, media_type="application/sdp")


async def _answer(
    request: Request,
    gateway: Gateway,
    sdp: str,
    session_params: rt.SessionParams | None,
    admission: Admission,
    seed: int | None = None,
) -> Call:
    config = gateway.config
    call_id = "rtc_" + secrets.token_hex(12)
    expect_channel = "\nm=application " in sdp.replace("\r\n", "\n")
    hosts = HostCandidates(config.webrtc_host or config.host, parse_port_range(config.webrtc_udp_ports))
    pool: MediaPool | None = request.app.state.media_pool
    media: CallMedia
    if pool is None:
        peer = Peer(expect_channel, MediaLedger())
        answer = await peer.answer(sdp, hosts, config.webrtc_input_prefetch_frames)
        media = peer
    else:
        remote = await pool.open(call_id, sdp, expect_channel, hosts, config.webrtc_input_prefetch_frames)
        answer, media = remote.answer, remote
    try:
        session = open_session(
            gateway,
            request.query_params.get("model"),
            admission.key,
            admission.secret,
            session_params,
            transcription=request.query_params.get("intent") == "transcription",
            seed=seed,
        )
    except BaseException:
        await media.close()
        raise
    assert admission.key is not None
    call = Call(call_id, admission.key, CallConnection(media, gateway, session))
    call.answer = answer
    return call


async def hangup_call(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    admission = Admission(gateway, "realtime")
    refusal = admission.check(request.headers)
    if refusal is not None:
        return error_response(refusal.status, refusal.message, refusal.code)
    call = calls_of(request).get(request.path_params["call_id"])
    if call is None or call.owner != admission.key:  # another key's call is none of its business
        return error_response(404, "no such call (it ended, or never was)", "call_not_found")
    await call.hangup()
    return Response(status_code=200)
