"""An in-process openpi policy object (``infer(obs)`` / ``metadata`` / ``reset()``) over a policy runner.

It lets the stock ``openpi_server.WebsocketPolicyServer`` serve exactly the model, preprocessing and
observation rules our gateway serves, for side-by-side tests and benchmarks. Calls run synchronously
on the caller's thread, one robot at a time (no batching), as the stock server does.
"""

from __future__ import annotations

import threading
from typing import Any

from realtime_gw.models.policy.backend import PolicyRunner
from realtime_gw.sessions.policy import Infer, PolicyConnection, Send, SendError, StartStream


class LocalPolicy:
    def __init__(self, runner: PolicyRunner, seed: int | None = None) -> None:
        self._runner = runner
        self._seed = seed
        """Used when an observation carries no ``seed``; fixed seeds make actions reproducible."""
        self._conn = PolicyConnection(runner.spec)
        self._lock = threading.Lock()  # the session is single-owner; serialize callers

    @property
    def metadata(self) -> dict[str, Any]:
        return self._conn.metadata

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self._seed is not None and isinstance(obs, dict) and "seed" not in obs:
                obs = {**obs, "seed": self._seed}
            effects = self._conn.handle(obs)
            for effect in effects:
                if isinstance(effect, SendError):
                    raise ValueError(effect.message)
                if isinstance(effect, StartStream):
                    raise ValueError(
                        "streamed actions need the gateway's socket; this policy is request/reply"
                    )
                if isinstance(effect, Send):
                    return dict(effect.payload)
                if isinstance(effect, Infer):
                    req = effect.request
                    (actions,) = self._runner.run([self._runner.prepare(req)], req.num_steps)
                    (reply,) = self._conn.on_actions(actions)
                    assert isinstance(reply, Send)
                    return dict(reply.payload)
            raise RuntimeError(f"no reply from the policy session for {effects!r}")

    def reset(self) -> None:
        with self._lock:
            self._conn.robots.clear()
