"""Where calls' media sockets listen: the configured address and port range, one host candidate."""

from __future__ import annotations

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from realtime_gw.config import ConfigError, GatewayConfig
from realtime_gw.server.webrtc.ice import HostCandidates, parse_port_range


def test_port_ranges() -> None:
    assert parse_port_range("") is None
    assert parse_port_range("50000-50009") == range(50000, 50010)
    assert parse_port_range("40000") == range(40000, 40001)
    for bad in ("abc", "9-1", "0-10", "60000-70000"):
        with pytest.raises(ValueError, match="webrtc_udp_ports"):
            parse_port_range(bad)


def test_a_bad_range_stops_the_gateway_at_start() -> None:
    from realtime_gw.app import create_app

    with pytest.raises(ConfigError, match="webrtc_udp_ports"):
        create_app(GatewayConfig(webrtc_udp_ports="9-1"))


async def test_one_loopback_candidate_in_the_range() -> None:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.addTransceiver("audio")
        pc.createDataChannel("oai-events")
        HostCandidates("127.0.0.1", range(41000, 41050)).apply(pc)
        await pc.setLocalDescription(await pc.createOffer())
        candidates = [line for line in pc.localDescription.sdp.splitlines() if line.startswith("a=candidate:")]
        assert candidates  # bundled: one transport, one candidate per m-line
        for line in candidates:
            parts = line.split()
            assert parts[4] == "127.0.0.1" and 41000 <= int(parts[5]) < 41050 and parts[7] == "host"
    finally:
        await pc.close()
