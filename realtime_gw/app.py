"""The composition root: builds the ``Gateway`` from the config and mounts the routes; nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Route, WebSocketRoute

from realtime_gw import web
from realtime_gw.config import ConfigError, GatewayConfig
from realtime_gw.models.registry import Workers, build_workers
from realtime_gw.server import (
    live_ws,
    log_hygiene,
    mcp_client,
    metrics,
    openpi_ws,
    ops,
    realtime_ws,
    speech,
    speech_stream,
    transcriptions,
    voices,
)
from realtime_gw.server.auth import Access, HostAllowlist, HostPolicy
from realtime_gw.server.client_secret_endpoint import client_secrets_endpoint
from realtime_gw.server.client_secrets import ClientSecrets, configured_keys, reloading_on_hangup
from realtime_gw.server.connections import GracefulServer, raise_open_files_limit, uvicorn_options
from realtime_gw.server.gateway import Gateway
from realtime_gw.server.responder import build_responder
from realtime_gw.server.voice_library import VoiceLibrary
from realtime_gw.server.webrtc import calls, sideband
from realtime_gw.server.webrtc.ice import parse_port_range
from realtime_gw.server.webrtc.media_pool import MediaPool

log = logging.getLogger(__name__)


def create_app(config: GatewayConfig, workers: Workers | None = None) -> Starlette:
    try:
        parse_port_range(config.webrtc_udp_ports)
        client_secrets = ClientSecrets(
            *configured_keys(
                config.webrtc_client_secret_key,
                config.webrtc_client_secret_previous_keys,
                config.webrtc_client_secret_key_file,
            )
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None
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
            client_secrets,
        ),
        voices=VoiceLibrary.open(config.voices_dir, config.max_voices_per_key),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        log_hygiene.install()  # here: after uvicorn has configured its loggers
        if config.gil_switch_interval_ms:
            sys.setswitchinterval(config.gil_switch_interval_ms / 1000)
        key_file = config.webrtc_client_secret_key_file
        # from the start: a SIGHUP of a rolling key rotation must not kill a gateway still warming up
        reloading = (
            reloading_on_hangup(client_secrets, config.webrtc_client_secret_previous_keys, key_file)
            if key_file
            else contextlib.nullcontext()
        )
        with reloading:
            if config.mcp_allowed_urls:
                mcp_client.load_package()
            await gateway.workers.start(warmup=config.warmup)
            await voices.restore_voices(gateway)
            loop_lag = asyncio.create_task(metrics.watch_event_loop(), name="event-loop-lag")
            log.info("gateway ready on %s:%s", config.host, config.port)
            try:
                yield
            finally:
                loop_lag.cancel()
                # at once: each waits (bounded) for its media worker to close the call
                await asyncio.gather(*(call.hangup() for call in list(app.state.calls.values())))
                if app.state.media_pool is not None:
                    await app.state.media_pool.stop()
                await gateway.workers.stop()

    routes: list[BaseRoute] = [
        Route("/healthz", ops.healthz),
        Route("/readyz", ops.readyz),
        Route("/metrics", ops.metrics),
        Route("/v1/models", ops.models),
        *web.routes(),  # the browser page at GET / and its files under /web
        WebSocketRoute("/v1/realtime", sideband.realtime_or_sideband),  # ?call_id=: a call's sideband
        Route("/v1/realtime/client_secrets", calls.with_cors(client_secrets_endpoint), methods=["POST", "OPTIONS"]),
        Route("/v1/realtime/calls", calls.with_cors(calls.create_call), methods=["POST", "OPTIONS"]),
        Route("/v1/realtime/calls/{call_id}/hangup", calls.with_cors(calls.hangup_call), methods=["POST", "OPTIONS"]),
        WebSocketRoute("/v1/duplex", realtime_ws.realtime_endpoint),
        WebSocketRoute("/v1/live/sessions", live_ws.live_endpoint),
        Route("/v1/audio/speech", speech.speech_endpoint, methods=["POST"]),
        Route("/v1/audio/transcriptions", transcriptions.transcriptions_endpoint, methods=["POST"]),
        WebSocketRoute("/v1/audio/speech/stream", speech_stream.speech_stream_endpoint),
        Route("/v1/audio/voices", voices.voices_endpoint, methods=["GET", "POST"]),
        Route("/v1/audio/voices/{voice_id}", voices.voice_endpoint, methods=["GET", "DELETE"]),
        Route("/v1/audio/voice_consents", voices.consents_endpoint, methods=["GET", "POST"]),
        Route("/v1/audio/voice_consents/{consent_id}", voices.consent_endpoint, methods=["GET", "POST", "DELETE"]),
    ]
    if gateway.workers.policy is not None:
        routes += [
            WebSocketRoute("/v1/realtime/robot/openpi", openpi_ws.openpi_endpoint),
            # openpi-client's WebsocketClientPolicy connects to ws://host:port/ with no path.
            WebSocketRoute("/", openpi_ws.openpi_endpoint),
        ]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(HostAllowlist, policy=hosts)])
    app.state.gateway = gateway
    app.state.calls = {}  # live WebRTC calls by id (server/webrtc)
    app.state.media_pool = MediaPool(config.webrtc_media_workers) if config.webrtc_media_workers > 0 else None
    return app


def serve(app: Starlette, config: GatewayConfig) -> None:
    """Run ``app`` under uvicorn with the gateway's connection bounds (``server/connections.py``)."""
    import uvicorn

    soft, hard = raise_open_files_limit()
    log.info("open files limit %s (hard %s)", soft, hard)
    gateway: Gateway = app.state.gateway
    # GPT-Live sessions end with session.closed, not a bare close (clients would take it for a fault)
    ending = lambda: gateway.sessions["live"] > 0  # noqa: E731
    GracefulServer(uvicorn.Config(app, **uvicorn_options(config)), gateway.stopping, ending).run()


def create_app_from_env() -> Starlette:
    """For running under uvicorn's own CLI (TLS, sockets, proxies): ``uvicorn --factory
    realtime_gw.app:create_app_from_env``. Reads ``REALTIME_GW_*`` and the TOML file named by
    ``REALTIME_GW_CONFIG``."""
    import os

    from realtime_gw.config import load_config

    raise_open_files_limit()
    return create_app(load_config(os.environ.get("REALTIME_GW_CONFIG")))
