"""An in-process openpi policy object (``infer(obs)`` / ``metadata`` / ``reset()``) over a policy runner.

It lets the stock ``openpi_server.WebsocketPolicyServer`` serve exactly the model, preprocessing and
observation rules our gateway serves, for side-by-side tests and benchmarks. Calls run synchronously
on the caller's thread, one robot at a time (no batching), as the stock server does.

It drives the same ``OpenPISession`` as our socket (``server/openpi_ws.py``); only the execution of
its effects differs: the stock server calls ``infer`` synchronously inside its own event loop, so
the policy runs right here instead of on a stage worker, and a reply is returned, not sent.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from realtime_gw.models.policy.backend import PolicyRunner
from realtime_gw.sessions.openpi import (
    FrameReceived,
    Opened,
    OpenPIEffect,
    OpenPISession,
    PolicyDone,
    RunPolicy,
)
from realtime_gw.sessions.policy_request_reply import SendError, SendReply


class LocalPolicy:
    def __init__(self, runner: PolicyRunner, seed: int | None = None) -> None:
        self._runner = runner
        self._seed = seed
        """Used when an observation carries no ``seed``; fixed seeds make actions reproducible."""
        self._session = self._open()
        self._lock = threading.Lock()  # the session is single-owner; serialize callers

    @property
    def metadata(self) -> dict[str, Any]:
        return self._session.metadata

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self._seed is not None and isinstance(obs, dict) and "seed" not in obs:
                obs = {**obs, "seed": self._seed}
            now = time.monotonic()
            return self._reply(self._session.handle(FrameReceived(obs, now), now))

    def reset(self) -> None:
        with self._lock:
            self._session = self._open()

    def _open(self) -> OpenPISession:
        session = OpenPISession(self._runner.spec, streaming=False)
        session.handle(Opened(), time.monotonic())  # the stock server sends the metadata frame itself
        return session

    def _reply(self, effects: list[OpenPIEffect]) -> dict[str, Any]:
        """Run the session's effects until it answers: a reply is returned, an error raised."""
        pending = list(effects)
        while pending:
            effect = pending.pop(0)
            if isinstance(effect, SendReply):
                return dict(effect.payload)
            if isinstance(effect, SendError):
                raise ValueError(effect.message)
            if isinstance(effect, RunPolicy):
                req = effect.request
                try:
                    (actions,) = self._runner.run([self._runner.prepare(req)], req.num_steps)
                except BaseException:
                    # The stock server answers a fault by closing the connection; the next one starts
                    # afresh here too, instead of finding the session still waiting for this reply.
                    self._session = self._open()
                    raise
                pending += self._session.handle(PolicyDone(effect.job, actions), time.monotonic())
            else:
                raise RuntimeError(f"the request/reply session asked for {effect!r}")
        raise RuntimeError(f"no reply from the policy session for {effects!r}")
