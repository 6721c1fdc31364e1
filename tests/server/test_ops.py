"""Health, readiness, metrics, model list and the session limit."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets

from realtime_gw.testing.gateway import LiveServer


def test_health_ready_models(tone_server: LiveServer) -> None:
    assert httpx.get(tone_server.http + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(tone_server.http + "/readyz")
    assert ready.status_code == 200
    assert ready.json()["ready"] is True and all(ready.json()["workers"].values())
    models = httpx.get(tone_server.http + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "realtime-gw"


def test_metrics_expose_gateway_series(tone_server: LiveServer) -> None:
    text = httpx.get(tone_server.http + "/metrics").text
    for name in (
        "realtime_gw_sessions",
        "realtime_gw_time_to_first_audio_seconds",
        "realtime_gw_frame_lateness_seconds",
        "realtime_gw_worker_queue_depth",
        "realtime_gw_worker_batch_size",
        "realtime_gw_worker_active_requests",
    ):
        assert name in text, name


async def test_session_limit_sends_error_then_1013(tone_server: LiveServer) -> None:
    url = tone_server.ws + "/v1/realtime"
    async with websockets.connect(url) as a, websockets.connect(url) as b:
        for ws in (a, b):
            assert json.loads(await ws.recv())["type"] == "session.created"
        async with websockets.connect(url) as c:
            err = json.loads(await c.recv())
            assert err["type"] == "error" and err["error"]["code"] == "session_limit_reached"
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await c.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    # the slots come back once those sessions end (the server notices the closes asynchronously)
    for _ in range(40):
        async with websockets.connect(url) as d:
            if json.loads(await d.recv())["type"] == "session.created":
                return
        await asyncio.sleep(0.05)
    raise AssertionError("session slots were not freed")


async def test_binary_frame_is_an_error_not_a_crash(tone_server: LiveServer) -> None:
    async with websockets.connect(tone_server.ws + "/v1/realtime") as ws:
        await ws.recv()
        await ws.send(b"\x00\x01")
        err = json.loads(await ws.recv())
        assert err["type"] == "error" and err["error"]["code"] == "invalid_frame"
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        assert json.loads(await ws.recv())["type"] == "input_audio_buffer.cleared"


def test_readyz_says_which_policy_buckets_are_compiled() -> None:
    """The fast PI0 sampler asked for CUDA graphs where there is no GPU: every capture fails, the steps
    run eagerly, and /readyz says so instead of claiming compiled graphs."""
    from starlette.testclient import TestClient

    from realtime_gw.app import create_app
    from realtime_gw.config import GatewayConfig
    from realtime_gw.models.policy.backend import PolicyBackend
    from realtime_gw.models.policy.factory import build_pi0_runner
    from realtime_gw.models.registry import Workers
    from realtime_gw.models.runtime import StageWorker

    config = GatewayConfig(policy_impl="fast", policy_graph_buckets=[1, 2])
    runner = build_pi0_runner(config)
    runner.cuda_graphs = runner.slots.cuda_graphs = True
    worker = StageWorker(PolicyBackend(runner))
    workers = Workers(tts=worker, asr=worker, vad=worker, policy=worker, all=[worker])
    with TestClient(create_app(config, workers=workers), base_url="http://127.0.0.1:8000") as client:
        ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["workers"] == {"policy": True}
    report = ready.json()["detail"]["policy"]
    assert report["graphs"] == 0 and report["buckets_compiled"] == [] and report["buckets_uncompiled"] == [1, 2]
    assert "('plain', 1)" in report["failed"] and "('prefix', 2)" in report["failed"]
