"""A Unix socket pair as the gateway and a media worker hold theirs, for the wire's and the worker's tests."""

from __future__ import annotations

import asyncio
import socket


async def socket_pair() -> tuple[asyncio.StreamReader, asyncio.StreamWriter, socket.socket]:
    """Our reading end as a stream, its writing end as a stream, and the raw peer (for odd writes)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    stream, writer = await asyncio.open_unix_connection(sock=ours)
    return stream, writer, theirs
