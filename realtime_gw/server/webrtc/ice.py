"""Where a call's media sockets listen, and the one host candidate the SDP answer names.

aiortc (through aioice) gathers a host candidate on every interface but loopback, and ephemeral ports
only. A gateway must instead answer with the address it was told (``webrtc_host``, else the bind
address: 127.0.0.1 for a gateway on loopback, so one box works out of the box) and ports from
``webrtc_udp_ports`` (a firewall opens only those). No STUN server is contacted: the client's address
is learnt from its own connectivity checks (peer-reflexive), so offers without candidates connect.

aioice has no option for either, so each ICE connection's ``gather_candidates`` is replaced, before
gathering, by ``bind_host_candidates`` (it does what aioice's does for host candidates, on our address
and port).
"""

from __future__ import annotations

import asyncio
import random
import socket
from typing import Any

from aioice import turn
from aioice.candidate import Candidate, candidate_foundation, candidate_priority
from aioice.ice import Connection, StunProtocol, get_host_addresses
from aiortc import RTCPeerConnection

WILDCARD = frozenset({"", "0.0.0.0", "::"})


def parse_port_range(spec: str) -> range | None:
    """``"50000-50099"`` -> that range (inclusive); "" -> None (any free port). ValueError otherwise."""
    spec = spec.strip()
    if not spec:
        return None
    first, sep, last = spec.partition("-")
    try:
        lo, hi = int(first), int(last if sep else first)
    except ValueError:
        lo = hi = 0
    if not 1 <= lo <= hi <= 65535:
        raise ValueError(f"webrtc_udp_ports {spec!r}: expected first-last within 1-65535")
    return range(lo, hi + 1)


class HostCandidates:
    """How one gateway's calls bind: the address (None: every interface, as aioice would) and ports."""

    def __init__(self, address: str, ports: range | None) -> None:
        self.address = None if address in WILDCARD else address
        self.ports = ports

    def apply(self, pc: RTCPeerConnection) -> None:
        """Replace the gathering of each of ``pc``'s ICE connections (call after the remote offer is
        set, before the local answer: that is when aiortc has created them and gathers)."""
        transports = [t.receiver.transport for t in pc.getTransceivers()]
        if pc.sctp is not None:
            transports.append(pc.sctp.transport)
        seen: set[int] = set()
        for dtls in transports:
            if dtls is None:
                continue
            connection: Connection = dtls.transport.iceGatherer._connection
            if id(connection) not in seen:
                seen.add(id(connection))
                connection.gather_candidates = _gatherer(connection, self)  # type: ignore[method-assign]


def _gatherer(connection: Connection, hosts: HostCandidates) -> Any:
    async def gather_candidates() -> None:
        if connection._local_candidates_start:
            return
        connection._local_candidates_start = True
        addresses = [hosts.address] if hosts.address else get_host_addresses(use_ipv4=True, use_ipv6=False)
        for component in connection._components:
            for address in addresses:
                candidate = await bind_host_candidate(connection, component, address, hosts.ports)
                if candidate is not None:
                    connection._local_candidates.append(candidate)
        connection._local_candidates_end = True

    return gather_candidates


async def bind_host_candidate(
    connection: Connection, component: int, address: str, ports: range | None
) -> Candidate | None:
    """A UDP socket on ``address`` (a free port of ``ports``, tried in random order) as a host
    candidate of ``connection``; None when every port is taken (the call then fails to connect)."""
    loop = asyncio.get_running_loop()
    tries = random.sample(ports, len(ports)) if ports is not None else [0]
    for port in tries:
        try:
            transport, protocol = await loop.create_datagram_endpoint(
                lambda: StunProtocol(connection), local_addr=(address, port)
            )
        except OSError:
            continue
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, turn.UDP_SOCKET_BUFFER_SIZE)
        host, bound_port = transport.get_extra_info("sockname")[:2]
        protocol.local_candidate = Candidate(
            foundation=candidate_foundation("host", "udp", host),
            component=component,
            transport="udp",
            priority=candidate_priority(component, "host"),
            host=host,
            port=bound_port,
            type="host",
        )
        connection._protocols.append(protocol)
        return protocol.local_candidate
    return None
