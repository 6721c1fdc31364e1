"""``POST /v1/realtime/client_secrets`` (OpenAI's GA shape): a deployment key mints an ``ek_…`` secret
that may start sessions until it expires and carries their session config (validated here, as a
``session.update`` would be)."""

from __future__ import annotations

import secrets
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from realtime_gw.models.registry import accepted_voices
from realtime_gw.protocols import realtime as rt
from realtime_gw.server.admission import Admission
from realtime_gw.server.client_secrets import SecretTooLarge
from realtime_gw.server.s2s_link import binding, checked_prompt
from realtime_gw.server.speech import bounded_body, openai_error
from realtime_gw.sessions.mcp import check_allowed
from realtime_gw.sessions.s2s import check_update
from realtime_gw.sessions.settings import SessionError, SessionSettings, TextLimits, apply_session_update

MIN_SECONDS, MAX_SECONDS, DEFAULT_SECONDS = 10, 7200, 600
MAX_BODY_BYTES = 256 * 1024


class _ExpiresAfter(msgspec.Struct, forbid_unknown_fields=True):
    anchor: str = "created_at"
    seconds: int = DEFAULT_SECONDS


class _CreateBody(msgspec.Struct):
    expires_after: _ExpiresAfter | None = None
    session: rt.SessionParams | None = None


def error_response(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    """OpenAI's error shape (``speech.openai_error``), code first as these routes name it."""
    return openai_error(status, message, param, code)


def settings_of(
    session: rt.SessionParams | None, voices: frozenset[str], limits: TextLimits, mcp_allowed_urls: tuple[str, ...]
) -> SessionSettings:
    """The settings a secret's session config gives a new session; raises ``SessionError``. Its MCP
    servers' URLs must be on the allow-list; the session lists them when it starts."""
    settings = SessionSettings()
    if session is None:
        return settings
    settings = apply_session_update(settings, session, voices, limits)
    check_allowed(settings.tools, mcp_allowed_urls, "tools")
    return settings


async def config_settings(gateway: Any, session: rt.SessionParams | None, key: str | None = None) -> SessionSettings:
    """The settings a client secret's or a call's session config gives a new session of ``key``
    (``settings_of``); raises ``SessionError``. A config naming a speech-to-speech model is checked as
    that model's session would check it: its voices (the key's own too), its refusals, and its prompt
    against the stage's budget."""
    cfg = gateway.config
    model = session.model if session is not None and isinstance(session.model, str) else None
    s2s = binding(gateway.workers.s2s, cfg, model, own_voices=gateway.s2s_voices_of(key))
    voices = s2s.voices() if s2s is not None else accepted_voices(gateway.workers.tts.describe())
    if s2s is not None and session is not None:
        check_update(s2s, session)
    limits = TextLimits(cfg.max_instructions_chars, cfg.max_tools)
    settings = settings_of(session, voices, limits, tuple(cfg.mcp_allowed_urls))
    if s2s is not None and (why := await checked_prompt(gateway.workers.s2s, s2s.request(settings))) is not None:
        raise SessionError(f"Model '{s2s.spec.model}' cannot take this persona and voice: {why}", "invalid_value", "instructions")
    return settings


async def client_secrets_endpoint(request: Request) -> Response:
    gateway = request.app.state.gateway
    admission = Admission(gateway, "realtime")
    refusal = admission.check(request.headers)
    if refusal is not None:
        return error_response(refusal.status, refusal.message, refusal.code)
    if admission.secret is not None:  # a secret cannot mint secrets: that would extend its life
        return error_response(
            401, "a client secret cannot mint client secrets; use a deployment key", "invalid_api_key"
        )
    body = await bounded_body(request, MAX_BODY_BYTES)
    if body is None:
        return error_response(413, f"body over {MAX_BODY_BYTES} bytes", "request_too_large")
    try:
        parsed = msgspec.json.decode(body or b"{}", type=_CreateBody)
    except msgspec.ValidationError as e:
        return error_response(400, f"invalid request body: {e}", "invalid_value")
    except msgspec.DecodeError:
        return error_response(400, "the body must be a JSON object", "invalid_json")
    expires = parsed.expires_after or _ExpiresAfter()
    if expires.anchor != "created_at":
        return error_response(
            400, "expires_after.anchor must be 'created_at'", "invalid_value", "expires_after.anchor"
        )
    if not MIN_SECONDS <= expires.seconds <= MAX_SECONDS:
        return error_response(
            400,
            f"expires_after.seconds must be between {MIN_SECONDS} and {MAX_SECONDS}",
            "invalid_value",
            "expires_after.seconds",
        )
    try:
        settings = await config_settings(gateway, parsed.session, admission.key)
    except SessionError as e:
        return error_response(400, str(e), e.code, e.param and f"session.{e.param}")
    try:
        value, record = gateway.access.client_secrets.mint(admission.key, expires.seconds, parsed.session)
    except SecretTooLarge as e:
        return error_response(400, str(e), "invalid_value", "session")
    model = parsed.session.model if parsed.session and isinstance(parsed.session.model, str) else "realtime-gw"
    wire: dict[str, Any] = msgspec.to_builtins(settings.to_wire("sess_" + secrets.token_hex(8), model))
    wire.pop("id", None)
    return JSONResponse({"value": value, "expires_at": record.expires_at, "session": wire})
