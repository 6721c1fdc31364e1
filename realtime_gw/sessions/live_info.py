"""GPT-Live ``info`` notices: what the gateway knows and the client should, that is no error. Pure.

- ``session_expiring``: the session reaches its maximum duration (``expires_at``) within a minute
  (or half its length, when shorter); sent once, so the app can wrap up or open the next session.
- ``model_mapped``: the model names of ``session.start`` (the voice's, and the Responses backend's)
  run on this gateway's configured stages and responder; says which.
- ``settings_ignored``: Responses delegation settings the gateway accepts but cannot apply (its
  responder is a chat-completions endpoint: no reasoning, text verbosity, service tier or parallel
  tool-call switch).
"""

from __future__ import annotations

from realtime_gw.protocols import live

EXPIRY_WARNING_S = 60.0
UNAPPLIED = ("reasoning", "text", "service_tier", "parallel_tool_calls")


class ExpiryWarning:
    def __init__(self, started_at: float, max_session_s: float, expires_at_unix: int) -> None:
        self.due_at: float | None = started_at + max_session_s - min(EXPIRY_WARNING_S, max_session_s / 2)
        self.expires_at_unix = expires_at_unix
        self.left_s = min(EXPIRY_WARNING_S, max_session_s / 2)

    def due(self, now: float) -> list[live.InfoEvent]:
        if self.due_at is None or now < self.due_at:
            return []
        self.due_at = None
        message = f"The session expires in {round(self.left_s)} s (expires_at {self.expires_at_unix}) and then closes."
        return [live.InfoEvent(code="session_expiring", message=message)]


def start_notices(config: live.SessionConfig, responder_model: str) -> list[live.InfoEvent]:
    names = f"'{config.model}'"
    delegation = config.delegation
    responses = delegation.responses if isinstance(delegation, live.ResponsesDelegation) else None
    if responses is not None and responses.model:
        names += f" and the backend '{responses.model}'"
    out = [
        live.InfoEvent(
            code="model_mapped",
            message=f"{names} run on this gateway's voice stages, with the responder model '{responder_model}'.",
        )
    ]
    ignored = [name for name in UNAPPLIED if responses is not None and getattr(responses, name) is not None]
    if ignored:
        message = f"Accepted but not applied by this gateway's backend: {', '.join(ignored)}."
        out.append(live.InfoEvent(code="settings_ignored", message=message))
    return out
