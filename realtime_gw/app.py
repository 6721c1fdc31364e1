"""The composition root: builds the ``Gateway`` from the config and mounts the routes; nothing else."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Route, WebSocketRoute

from realtime_gw import web
from realtime_gw.config import GatewayConfig
from realtime_gw.models.registry import Workers, build_workers
from realtime_gw.server import live_ws, log_hygiene, openpi_ws, ops, realtime_ws, speech, speech_stream
from realtime_gw.server.auth import Access, HostAllowlist, HostPolicy
from realtime_gw.server.connections import raise_open_files_limit, uvicorn_options
from realtime_gw.server.gateway import Gateway
from realtime_gw.server.responder import build_responder

log = logging.getLogger(__name__)


def create_app(config: GatewayConfig, workers: Workers | None = None) -> Starlette:
    hosts = HostPolicy(config.allowed_hosts, config.host)
    gateway = Gateway(
        config=config,
        workers=workers or build_workers(config),
        responder=build_responder(config),
        access=Access(
            ([config.api_key] if config.api_key else []) + config.api_keys,
            config.max_sessions_per_key,
            config.allowed_origins,
            config.session_starts_per_key_per_min,
            hosts,
        ),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        log_hygiene.install()  # here: after uvicorn has configured its loggers
        await gateway.workers.start(warmup=config.warmup)
        log.info("gateway ready on %s:%s", config.host, config.port)
        try:
            yield
        finally:
            await gateway.workers.stop()

    routes: list[BaseRoute] = [
        Route("/healthz", ops.healthz),
        Route("/readyz", ops.readyz),
        Route("/metrics", ops.metrics),
        Route("/v1/models", ops.models),
        *web.routes(),  # the browser page at GET / and its files under /web
        WebSocketRoute("/v1/realtime", realtime_ws.realtime_endpoint),
        WebSocketRoute("/v1/duplex", realtime_ws.realtime_endpoint),
        WebSocketRoute("/v1/live/sessions", live_ws.live_endpoint),
        Route("/v1/audio/speech", speech.speech_endpoint, methods=["POST"]),
        WebSocketRoute("/v1/audio/speech/stream", speech_stream.speech_stream_endpoint),
    ]
    if gateway.workers.policy is not None:
        routes += [
            WebSocketRoute("/v1/realtime/robot/openpi", openpi_ws.openpi_endpoint),
            # openpi-client's WebsocketClientPolicy connects to ws://host:port/ with no path.
            WebSocketRoute("/", openpi_ws.openpi_endpoint),
        ]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(HostAllowlist, policy=hosts)])
    app.state.gateway = gateway
    return app


def serve(app: Starlette, config: GatewayConfig) -> None:
    """Run ``app`` under uvicorn with the gateway's connection bounds (``server/connections.py``)."""
    import uvicorn

    soft, hard = raise_open_files_limit()
    log.info("open files limit %s (hard %s)", soft, hard)
    uvicorn.run(app, **uvicorn_options(config))


def create_app_from_env() -> Starlette:
    """For running under uvicorn's own CLI (TLS, sockets, proxies): ``uvicorn --factory
    realtime_gw.app:create_app_from_env``. Reads ``REALTIME_GW_*`` and the TOML file named by
    ``REALTIME_GW_CONFIG``."""
    import os

    from realtime_gw.config import load_config

    raise_open_files_limit()
    return create_app(load_config(os.environ.get("REALTIME_GW_CONFIG")))
