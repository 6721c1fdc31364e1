"""Operational endpoints: health, readiness, Prometheus metrics, model list."""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from realtime_gw.server import auth
from realtime_gw.server.s2s_link import ECHO_SPEC


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """200 only after every worker has run one real warm-up inference. ``detail``: each backend's warm-up
    report from its description (what the warm-up ran and built; the policy's: its CUDA graphs, which
    batch buckets run the compiled expert step and which fall back to the uncompiled one, the compile
    cache it loaded)."""
    workers = request.app.state.gateway.workers
    status = {w.name: w.ready for w in workers.all}
    ready = bool(status) and all(status.values())
    body: dict[str, Any] = {"ready": ready, "workers": status}
    detail = {w.name: report for w in workers.all if (report := w.describe().warmup_report)}
    if detail:
        body["detail"] = detail
    return JSONResponse(body, status_code=200 if ready else 503)


async def metrics(request: Request) -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


async def models(request: Request) -> Response:
    gateway = request.app.state.gateway
    if gateway.access.identify(auth.presented_key(request.headers)) is None:
        return JSONResponse(
            {"error": {"message": "Invalid or missing API key", "type": "invalid_request_error", "code": "invalid_api_key"}},
            401,
        )
    w = gateway.workers
    data = [
        {"id": "realtime-gw", "object": "model", "owned_by": "realtime-gw", "tts": w.tts.name, "asr": w.asr.name},
    ]
    if w.policy is not None:
        data.append({"id": "openpi-policy", "object": "model", "owned_by": "realtime-gw", "policy": w.policy.name})
    spec = w.s2s.describe().s2s if w.s2s is not None else None
    if spec is not None:  # a realtime session of this model name is bound to the speech-to-speech stage
        data.append({
            "id": spec.model, "object": "model", "owned_by": "realtime-gw", "s2s": w.s2s.name,
            "capabilities": list(spec.capabilities), "frame_ms": spec.frame_ms, "context_frames": spec.context_frames,
        })  # fmt: skip
        if "voice_prompt" in spec.capabilities:  # PersonaPlex: the voices a session may name
            data[-1].update(voices=list(spec.voices), default_voice=spec.default_voice,
                            max_prompt_frames=spec.max_prompt_frames)  # fmt: skip
    data.append({  # every gateway's diagnostic model: says back what it hears (s2s_link.EchoStream)
        "id": ECHO_SPEC.model, "object": "model", "owned_by": "realtime-gw", "s2s": "echo",
        "capabilities": list(ECHO_SPEC.capabilities), "frame_ms": ECHO_SPEC.frame_ms,
    })  # fmt: skip
    return JSONResponse({"object": "list", "data": data})
