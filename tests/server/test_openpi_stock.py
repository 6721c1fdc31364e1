"""Our socket and openpi's stock ``WebsocketPolicyServer`` give the same actions for the same PI0."""

from __future__ import annotations

import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from realtime_gw.config import GatewayConfig
from realtime_gw.server.openpi_local import LocalPolicy
from tests.server.openpi_harness import droid_obs, serve, tiny_runner
from tests.server.openpi_stock_server import connect_stock, stock_server


def test_same_actions_as_the_stock_openpi_server() -> None:
    config = GatewayConfig()
    runner = tiny_runner(config)
    adapter = LocalPolicy(runner, seed=42)  # the stock server passes no seed; the adapter fixes it
    observations = [droid_obs(20), droid_obs(21, prompt="open the drawer", size=(240, 320))]
    with serve(config, runner) as gw, stock_server(adapter) as stock_port:
        ours = WebsocketClientPolicy(host="127.0.0.1", port=gw.port)
        stock = connect_stock(stock_port)
        assert ours.get_server_metadata() == stock.get_server_metadata()
        for obs in observations:
            a = ours.infer({**obs, "seed": 42})
            b = stock.infer(obs)
            np.testing.assert_array_equal(a["actions"], b["actions"])
            assert set(a["server_timing"]) == set(b["server_timing"])
        ours._ws.close()
        stock._ws.close()
