"""Helpers for the OpenPI socket tests: in-process gateways (uvicorn in a thread), DROID-like observations
and raw socket connections.

The gateway is built with ``create_app(config, workers=...)`` holding only the policy worker (the voice
fields get an unstarted placeholder worker), so these tests never load Piper, pocketsphinx or Silero.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import uvicorn
import websockets.sync.client as ws_client
from openpi_client import msgpack_numpy
from prometheus_client import REGISTRY

from realtime_gw.app import Gateway, create_app
from realtime_gw.config import GatewayConfig
from realtime_gw.models import faults
from realtime_gw.models.contract import BackendInfo
from realtime_gw.models.policy.backend import PolicyBackend, PolicyRunner
from realtime_gw.models.registry import Workers
from realtime_gw.models.runtime import StageWorker, StepResult
from realtime_gw.testing.gateway import free_port

API_KEY = "robot-key"
CAMERAS = ("observation/exterior_image_1_left", "observation/wrist_image_left")


class _Unused:
    """Placeholder backend for the voice worker fields; never started."""

    name = "unused"

    def open(self, request: Any) -> None:
        raise RuntimeError("not a voice gateway")

    def step(self, work: list[tuple[Any, list[Any]]]) -> list[StepResult]:
        return []

    def release(self, state: Any) -> None:
        pass

    def has_work(self, state: Any) -> bool:
        return False

    def warmup(self) -> None:
        pass

    def describe(self) -> BackendInfo:
        return BackendInfo(name=self.name)


@dataclass
class Served:
    port: int
    gateway: Gateway
    worker: StageWorker

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


@contextmanager
def serve(config: GatewayConfig, runner: PolicyRunner) -> Iterator[Served]:
    """A live gateway on a free loopback port serving ``runner`` as the policy worker (with any
    ``fault_injection`` for the policy applied, as the registry does)."""
    backend = faults.wrap(
        "policy", PolicyBackend(runner, slots=config.openpi_max_sessions * 2), config.fault_injection
    )
    worker = StageWorker(
        backend,
        step_timeout_s=config.worker_step_timeout_s,
        device=config.policy_device,
        max_batch=config.policy_max_batch,
        max_wait_ms=config.policy_max_wait_ms,
        max_active=config.openpi_max_sessions * 2,
    )
    unused = StageWorker(_Unused())
    workers = Workers(tts=unused, asr=unused, vad=unused, policy=worker, all=[worker])
    app = create_app(config, workers=workers)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            ws_max_size=max(config.max_frame_bytes, config.openpi_max_frame_bytes) + 1024,
            lifespan="on",
        )
    )
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (server.started and worker.ready):
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("test gateway did not start")
        time.sleep(0.02)
    try:
        yield Served(port, app.state.gateway, worker)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@functools.lru_cache(maxsize=2)
def tiny_model(policy: str = "pi0") -> tuple[Any, Any]:
    """The tiny random-init PI0 (or π0.5) and its tokenizer, built once per test process."""
    from realtime_gw.models.policy.factory import load_model

    model, tok, _, _ = load_model(GatewayConfig(policy=policy))  # type: ignore[arg-type]
    return model, tok


def tiny_runner(config: GatewayConfig) -> Any:
    """A runner of ``config``'s policy (PI0 or π0.5) over the shared tiny model, with ``config``'s
    observation scheme and history (π0.5: the state in its 200-token prompt, openpi's default)."""
    from realtime_gw.models.policy.factory import policy_spec
    from realtime_gw.models.policy.pi0 import Pi0Runner

    policy = config.policy if config.policy == "pi05" else "pi0"
    model, tok = tiny_model(policy)
    pi05 = policy == "pi05"
    spec = policy_spec(
        config,
        model=f"{policy}-tiny (random init)",
        action_horizon=model.config.chunk_size,
        tokenizer=tok.name,
        state_in_prompt=pi05,
        max_prompt_tokens=200 if pi05 else 48,
    )
    return Pi0Runner(model, tok, spec, config.policy_device)


def droid_obs(
    i: int, prompt: str = "pick up the red cup", size: tuple[int, int] = (224, 224), **extra: Any
) -> dict:
    """A DROID-like observation; ``i`` picks the (deterministic) pixels and state."""
    rng = np.random.default_rng(i)
    h, w = size
    obs: dict[str, Any] = {key: rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for key in CAMERAS}
    obs["observation/state"] = rng.standard_normal(8)
    obs["prompt"] = prompt
    obs.update(extra)
    return obs


def batch_histogram(worker: str = "policy") -> tuple[float, float]:
    """(steps observed, steps that advanced exactly one request) of ``realtime_gw_worker_batch_size``."""
    count = REGISTRY.get_sample_value("realtime_gw_worker_batch_size_count", {"worker": worker}) or 0.0
    ones = (
        REGISTRY.get_sample_value("realtime_gw_worker_batch_size_bucket", {"worker": worker, "le": "1.0"})
        or 0.0
    )
    return count, ones


def wait_for(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def raw_connection(gw: Served, key: str = API_KEY) -> Any:
    """A plain WebSocket to the policy socket, past the metadata frame, for hand-built frames."""
    conn = ws_client.connect(
        gw.url, additional_headers={"Authorization": f"Api-Key {key}"}, max_size=None, compression=None
    )
    msgpack_numpy.unpackb(conn.recv())  # metadata
    return conn
