"""The action contract of the OpenPI socket: what a robot client can check before it moves (pure, no I/O).

Additive to openpi's protocol, so a stock ``openpi-client`` is unaffected:

- the metadata frame's ``policy_server_config`` carries ``action_contract`` (``ActionContract.describe``):
  a version, the observation layout's id, the state and action dims and dtypes, the horizon, the control
  rate the server expects, and which steps real-time chunking freezes;
- an observation opts in with the key ``action_contract``: ``true`` (or the version number) asks for the
  reply fields below; a map states what the client expects (``version``, ``layout``, ``state_dim``,
  ``action_dim``, ``horizon``, ``control_hz``...) and any field that differs from the server's is an error
  naming that field, before the policy runs. An optional ``timestamp`` (a number, the client's clock)
  says when the observation was taken;
- a reply to an opted-in observation carries ``valid_steps`` (how many of the returned steps are actions
  to execute, from step 0), ``frozen_steps`` (RTC: the first ones, repeated bit for bit from
  ``rtc.prev_actions``), ``obs_timestamp`` (the observation's ``timestamp``, or None: step 0 is the action
  for that moment) and ``contract_version``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

CONTRACT_VERSION = 1
OPT_IN_KEY = "action_contract"
"""The observation key that asks for the reply fields (and may state the client's expectations)."""
TIMESTAMP_KEY = "timestamp"
"""The observation key with the time it was taken (a number, the client's clock), echoed back."""
LAYOUTS = {"generic": "generic", "droid": "openpi/droid", "libero": "openpi/libero", "aloha": "openpi/aloha"}
"""Layout ids per robot preset: the observation keys, image conventions, state and action spaces of
openpi's ``{droid,libero,aloha}_policy.py`` (``protocols/robots.py``)."""
CONTROL_HZ = {"droid": 15.0, "libero": 20.0, "aloha": 50.0}
"""The control rates the presets' robots run at (DROID's 15 Hz, LIBERO's simulator 20 Hz, ALOHA 50 Hz)."""
EXPECTABLE = (
    "version",
    "layout",
    "state_dim",
    "state_dtype",
    "action_dim",
    "action_dtype",
    "horizon",
    "control_hz",
)
"""Fields a client may state in its opt-in map; each must equal the server's."""


class ContractError(ValueError):
    """The client's expectation differs from the server's contract; the message names the field."""


@dataclass(frozen=True, slots=True)
class ActionContract:
    layout: str
    state_keys: tuple[str, ...]
    state_dim: int
    action_key: str
    action_dim: int
    horizon: int
    control_hz: float | None = None
    """The rate the server expects the robot to execute actions at; None where it is not configured."""
    state_dtype: str = "float32"
    action_dtype: str = "float32"
    version: int = CONTRACT_VERSION

    def describe(self) -> dict[str, Any]:
        """The ``action_contract`` of the metadata frame."""
        return {
            "version": self.version,
            "layout": self.layout,
            "state": {"keys": list(self.state_keys), "dim": self.state_dim, "dtype": self.state_dtype},
            "action": {
                "key": self.action_key,
                "dim": self.action_dim,
                "dtype": self.action_dtype,
                "horizon": self.horizon,
            },
            "control_hz": self.control_hz,
            "rtc": {
                "frozen_steps": "inference_delay",
                "max_inference_delay": self.horizon,
                "frozen_exact": True,
            },
            "reply": {
                "opt_in_key": OPT_IN_KEY,
                "timestamp_key": TIMESTAMP_KEY,
                "fields": ["valid_steps", "frozen_steps", "obs_timestamp", "contract_version"],
            },
        }

    def value(self, field: str) -> Any:
        return getattr(self, field)


@dataclass(frozen=True, slots=True)
class ReplyRequest:
    """An observation's opt-in: the reply gets the contract fields; ``timestamp`` is echoed."""

    timestamp: float | None = None


def parse_opt_in(contract: ActionContract, msg: dict[str, Any]) -> ReplyRequest | None:
    """The observation's opt-in (None: a stock observation). Raises ``ContractError`` naming the field
    where the client expects something else than the server serves."""
    if OPT_IN_KEY not in msg or msg[OPT_IN_KEY] is None or msg[OPT_IN_KEY] is False:
        return None
    ask = msg[OPT_IN_KEY]
    if isinstance(ask, dict):
        unknown = sorted(str(k) for k in ask if k not in EXPECTABLE)
        if unknown:
            raise ContractError(
                f"{OPT_IN_KEY}: unknown field(s) {unknown}; a client may state {', '.join(EXPECTABLE)}"
            )
        for field in EXPECTABLE:
            if field in ask and not _same(ask[field], contract.value(field)):
                raise ContractError(
                    f"{OPT_IN_KEY}.{field}: this server serves {contract.value(field)!r}, the client expects "
                    f"{_short(ask[field])}"
                )
    elif ask is not True and not (_is_int(ask) and int(ask) == contract.version):
        raise ContractError(
            f"{OPT_IN_KEY} must be true, the version number ({contract.version}) or a map of expected "
            f"fields ({', '.join(EXPECTABLE)}); got {_short(ask)}"
        )
    stamp = msg.get(TIMESTAMP_KEY)
    if stamp is not None:
        if not _number(stamp) or not math.isfinite(float(stamp)):
            raise ContractError(
                f"{TIMESTAMP_KEY!r} must be a finite number (the client's clock), got {_short(stamp)}"
            )
        stamp = float(stamp)
    return ReplyRequest(timestamp=stamp)


def reply_fields(contract: ActionContract, request: ReplyRequest, frozen_steps: int) -> dict[str, Any]:
    """What a reply to an opted-in observation adds beside its actions."""
    return {
        "valid_steps": contract.horizon,
        "frozen_steps": frozen_steps,
        "obs_timestamp": request.timestamp,
        "contract_version": contract.version,
    }


def _same(expected: Any, served: Any) -> bool:
    if isinstance(served, float) or isinstance(expected, float):
        return _number(expected) and served is not None and math.isclose(float(expected), float(served))
    if isinstance(served, int) and not isinstance(served, bool):
        return _is_int(expected) and int(expected) == served
    return bool(expected == served) if isinstance(expected, str) else expected is served


def _number(value: Any) -> bool:
    """A real number, NumPy scalars included (msgpack-numpy may deliver them), never a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and type(value).__name__ != "bool_"


def _is_int(value: Any) -> bool:
    return _number(value) and isinstance(value, numbers.Integral)


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = repr(value)
    except Exception:
        return type(value).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
