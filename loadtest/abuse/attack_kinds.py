"""Attacks on the gateway, as an attacker would run them, each bounded by its size and a deadline.

Each attack is ``async def attack(port, sizes) -> dict`` and returns its own outcome (``outcome``: one
line for the table, plus details). ``loadtest/abuse/attacks.py`` runs each in a child process (so the
attacker's own CPU work does not delay the measuring bystander's event loop) while a bystander
measures the gateway. Every attack connection comes from ``ATTACKER_ADDR`` (127.0.0.2, still
loopback), so per-address caps limit the attacker and not the bystander on 127.0.0.1.

Raw sockets are used where a library would refuse to misbehave (deflate bombs, headers that never
end, sockets that never read); frames are masked with a zero key so a 16 MB payload costs the
attacker no CPU to mask.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import httpx
import websockets
from websockets.protocol import State

ATTACKER_ADDR = "127.0.0.2"
MIB = 1024 * 1024


@dataclass
class Sizes:
    """CI-sized defaults; ``Sizes.full()`` is the size of docs/reliability.md's table."""

    noise_s: float = 8.0
    bomb_frames: int = 3
    bomb_inflated_mb: float = 15.5
    plain_appends: int = 1
    plain_append_mb: float = 15.5
    stream_text_chars: int = 20_000
    huge_input_text_mb: float = 0.5
    item_text_mb: float = 2.0
    idle_streams: int = 256
    silent_sockets: int = 300
    half_upgrades: int = 50
    huge_header_mb: float = 4.0
    hold_s: float = 12.0
    item_burst: int = 10_000
    cancel_pairs: int = 300
    instructions_mb: float = 4.0
    session_updates: int = 20

    @classmethod
    def full(cls) -> Sizes:
        return cls(
            noise_s=40.0, bomb_frames=10, plain_appends=10, stream_text_chars=50_000, huge_input_text_mb=2.4,
            item_text_mb=8.0, silent_sockets=3000, half_upgrades=200, huge_header_mb=48.0, hold_s=30.0,
            instructions_mb=15.9, session_updates=100,
        )  # fmt: skip

    @classmethod
    def from_json(cls, raw: str) -> Sizes:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in json.loads(raw).items() if k in known})

    def to_json(self) -> str:
        return json.dumps(asdict(self))


# -- raw WebSocket client pieces ------------------------------------------------------------------------


def frame(payload: bytes, opcode: int = 0x1, rsv1: bool = False) -> bytes:
    """One client frame, FIN set, masked with a zero key (the payload bytes go out as they are)."""
    n = len(payload)
    head = bytes([0x80 | (0x40 if rsv1 else 0) | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    return head + b"\x00\x00\x00\x00" + payload


def event(kind: str, **body: Any) -> bytes:
    return json.dumps({"type": kind, **body}).encode()


async def attacker_socket(port: int, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((ATTACKER_ADDR, 0))
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


@dataclass
class RawWs:
    """A WebSocket as bare socket calls: nothing is read unless asked (a client that does not read)."""

    sock: socket.socket
    status: int
    headers: str

    async def send(
        self, payload: bytes, opcode: int = 0x1, rsv1: bool = False, timeout: float = 30.0
    ) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(loop.sock_sendall(self.sock, frame(payload, opcode, rsv1)), timeout)

    def close(self) -> None:
        self.sock.close()


def upgrade_request(port: int, path: str, extra: str = "", host: str | None = None) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET {path} HTTP/1.1\r\nHost: {host or f'127.0.0.1:{port}'}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    ).encode()


async def raw_ws(
    port: int, path: str, extra: str = "", rcvbuf: int | None = None, timeout: float = 30.0
) -> RawWs:
    sock = await attacker_socket(port, rcvbuf)
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, upgrade_request(port, path, extra))
    head = b""
    async with asyncio.timeout(timeout):
        while b"\r\n\r\n" not in head:
            chunk = await loop.sock_recv(sock, 1)  # byte by byte: leave the first frames unread
            if not chunk:
                break
            head += chunk
    text = head.decode(errors="replace")
    return RawWs(sock, int(text.split(" ", 2)[1]) if " " in text else 0, text)


async def ws_client(port: int, path: str = "/v1/realtime", **kw: Any) -> Any:
    """A library client (for attacks that read what they are sent), from the attacker's address."""
    return await websockets.connect(
        f"ws://127.0.0.1:{port}{path}",
        max_size=None,
        compression=None,
        local_addr=(ATTACKER_ADDR, 0),
        open_timeout=30,
        **kw,
    )


async def recv_until(ws: Any, kinds: set[str], timeout: float) -> tuple[dict[str, Any] | None, list[str]]:
    """Events until one of ``kinds`` (returned) or the deadline (None); also the error codes seen."""
    errors: list[str] = []
    async with asyncio.timeout(timeout):
        while True:
            ev = json.loads(await ws.recv())
            if ev["type"] == "error":
                errors.append(str(ev["error"].get("code")))
            if ev["type"] in kinds:
                return ev, errors
    return None, errors  # pragma: no cover (asyncio.timeout raises)


def closed_how(e: BaseException) -> str:
    if isinstance(e, websockets.ConnectionClosed):
        rcvd = e.rcvd
        return f"closed {rcvd.code} {rcvd.reason!r}" if rcvd else "connection dropped"
    return f"{type(e).__name__}: {e}"[:120]


MANUAL = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}


async def read_frames(
    sock: socket.socket, quiet_s: float, limit_s: float, until: tuple[bytes, int] | None = None
) -> tuple[int, str]:
    """Read server frames (unmasked) until EOF, ``quiet_s`` of silence, ``limit_s``, or the ``until[1]``-th
    frame holding ``until[0]``: (frames read, how it ended)."""
    seen = 0
    loop = asyncio.get_running_loop()
    buf = bytearray()
    count = 0
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            data = await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), quiet_s)
        except TimeoutError:
            return count, "still open"
        except OSError as e:
            return count, f"reset ({type(e).__name__})"
        if not data:
            return count, "connection dropped"
        buf += data
        while len(buf) >= 2:
            n, at = buf[1] & 0x7F, 2
            if n == 126:
                n, at = int.from_bytes(buf[2:4], "big"), 4
            elif n == 127:
                n, at = int.from_bytes(buf[2:10], "big"), 10
            if len(buf) < at + n:
                break
            opcode, payload = buf[0] & 0x0F, bytes(buf[at : at + n])
            del buf[: at + n]
            count += 1
            if opcode == 0x8:
                code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                return count, f"closed {code} {payload[2:].decode(errors='replace')!r}"
            if until is not None and until[0] in payload:
                seen += 1
                if seen == until[1]:
                    return count, "answered"
    return count, "still sending"


async def wait_for_gauge(port: int, labels: str, value: float, timeout: float) -> float | None:
    """Seconds until the server's ``realtime_gw_sessions{labels}`` reads ``value``; None if it did not."""
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=5) as client:
        while time.monotonic() - t0 < timeout:
            total = 0.0
            for line in (await client.get(f"http://127.0.0.1:{port}/metrics")).text.splitlines():
                if line.startswith("realtime_gw_sessions{") and labels in line:
                    total += float(line.rsplit(" ", 1)[1])
            if total == value:
                return time.monotonic() - t0
            await asyncio.sleep(0.25)
    return None


# -- 1: noisy commit ------------------------------------------------------------------------------------


async def noisy_commit(port: int, sizes: Sizes) -> dict[str, Any]:
    """N s of loud noise, manual turns, commit, response.create: the ASR decodes it all at once."""
    rng = __import__("numpy").random.default_rng(13)
    pcm = (rng.integers(-12000, 12000, int(24000 * sizes.noise_s), dtype="int16")).tobytes()
    t0 = time.monotonic()
    status = None
    async with await ws_client(port) as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "session.update", "session": MANUAL}))
        second = 48000
        for i in range(0, len(pcm), second):
            await ws.send(
                json.dumps(
                    {
                        "type": "input_audio_buffer.append",
                        "audio": base64.b64encode(pcm[i : i + second]).decode(),
                    }
                )
            )
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        sent = time.monotonic()
        await ws.send(json.dumps({"type": "response.create"}))
        try:
            done, errors = await recv_until(ws, {"response.done"}, 60 + 2 * sizes.noise_s)
            assert done is not None
            status = done["response"]["status"]
            how = f"response {status} after {time.monotonic() - sent:.1f} s"
            if errors:
                how += f" (errors: {', '.join(sorted(set(errors)))})"
        except TimeoutError:
            how = f"no response.done within {60 + 2 * sizes.noise_s:.0f} s"
        except websockets.ConnectionClosed as e:
            how = closed_how(e)
    return {"outcome": how, "elapsed_s": time.monotonic() - t0, "status": status}


# -- 2: permessage-deflate bombs and plain big appends ------------------------------------------------


def _append_body(mb: float) -> bytes:
    n = int(mb * 1_000_000) // 4 * 4
    return b'{"type":"input_audio_buffer.append","audio":"' + b"A" * n + b'"}'


async def deflate_bombs(port: int, sizes: Sizes) -> dict[str, Any]:
    """Small compressed frames that inflate to ~16 MB each, then plain ~16 MB appends, each burst in one
    write; the attacker stays until the server has answered every frame (or 120 s)."""
    body = _append_body(sizes.bomb_inflated_mb)
    deflater = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = deflater.compress(body) + deflater.flush(zlib.Z_SYNC_FLUSH)
    bomb = bomb[:-4]  # RFC 7692: the 00 00 ff ff tail of a sync flush is left off
    clear = event("input_audio_buffer.clear")
    loop = asyncio.get_running_loop()
    parts: list[str] = []
    negotiated = False
    t0 = time.monotonic()
    for label, payload, rsv1, count in (
        ("deflate bombs", bomb, True, sizes.bomb_frames),
        ("plain appends", body, False, sizes.plain_appends),
    ):
        t1 = time.monotonic()
        extension = "Sec-WebSocket-Extensions: permessage-deflate\r\n" if rsv1 else ""
        ws = await raw_ws(port, "/v1/realtime", extension)
        try:
            if rsv1:
                negotiated = ws.status == 101 and "permessage-deflate" in ws.headers.lower()
                if not negotiated:
                    parts.append(f"deflate not negotiated (upgrade {ws.status})")
                    continue
            blob = (
                frame(event("session.update", session=MANUAL))
                + (frame(payload, rsv1=rsv1) + frame(clear)) * count
            )
            reader = asyncio.create_task(
                read_frames(ws.sock, 120.0, 120.0, (b"input_audio_buffer.cleared", count))
            )
            try:
                await asyncio.wait_for(loop.sock_sendall(ws.sock, blob), 120)
            except (OSError, TimeoutError) as e:
                parts.append(f"{label}: send stopped ({type(e).__name__})")
            _, how = await reader
            size = (
                f"{len(payload) // 1024} KiB -> {len(body) / 1e6:.1f} MB"
                if rsv1
                else f"{len(body) / 1e6:.1f} MB"
            )
            parts.append(f"{count} {label} ({size}): {how} in {time.monotonic() - t1:.1f} s")
        finally:
            ws.close()
    return {"outcome": "; ".join(parts), "elapsed_s": time.monotonic() - t0, "deflate_negotiated": negotiated}


# -- 3: speech stream that never reads, one huge input.text, a huge text item ----------------------


async def speech_floods(port: int, sizes: Sizes) -> dict[str, Any]:
    parts: list[str] = []
    t0 = time.monotonic()
    # (a) lots of text, never read (a 4 KiB receive buffer, nothing read until the end)
    ws = await raw_ws(port, "/v1/audio/speech/stream", rcvbuf=4096)
    chunk = "This is a sentence that a client sends and never listens to. " * 8
    sent = 0
    try:
        while sent < sizes.stream_text_chars:
            await ws.send(event("input.text", text=chunk), timeout=5)
            sent += len(chunk)
        note = f"{sent} chars unread"
    except (OSError, TimeoutError) as e:
        note = f"unread stream stopped after {sent} chars ({type(e).__name__})"
    # Whether the server gave up on it: its speech-session gauge (reading the socket would un-stall it).
    freed_after = await wait_for_gauge(port, 'kind="speech"', 0, sizes.hold_s)
    unread = "closed" if freed_after is not None else "open"
    parts.append(
        f"{note}: "
        + (
            f"freed {freed_after:.1f} s later"
            if freed_after is not None
            else f"open {sizes.hold_s:.0f} s later"
        )
    )
    ws.close()
    # (b) one huge input.text on the speech stream
    big = ("word " * 9 + "word. ") * int(sizes.huge_input_text_mb * 1e6 / 50)
    async with await ws_client(port, "/v1/audio/speech/stream") as sws:
        t1 = time.monotonic()
        await sws.send(json.dumps({"type": "input.text", "text": big}))
        await sws.send(json.dumps({"type": "input.done"}))
        first = None
        try:
            async with asyncio.timeout(20):
                while first is None:
                    msg = await sws.recv()
                    if isinstance(msg, bytes):
                        first = "first audio"
                    elif json.loads(msg)["type"] == "error":
                        first = "error " + str(json.loads(msg).get("code"))
        except TimeoutError:
            first = "nothing"
        except websockets.ConnectionClosed as e:
            first = closed_how(e)
        parts.append(f"{len(big) / 1e6:.1f} MB input.text: {first} after {time.monotonic() - t1:.1f} s")
    # (c) a huge text item + response.create on /v1/realtime, cancelled after 2 s
    text = "Hello there. " * int(sizes.item_text_mb * MIB / 13)
    async with await ws_client(port) as rws:
        await rws.recv()
        await rws.send(json.dumps({"type": "session.update", "session": MANUAL}))
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        await rws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await rws.send(json.dumps({"type": "response.create"}))
        try:
            ev, errors = await recv_until(rws, {"response.output_audio.delta", "response.done"}, 2.0)
            got = ev["type"] if ev else "nothing"
        except TimeoutError:
            got, errors = "nothing in 2 s", []
        except websockets.ConnectionClosed as e:
            got, errors = closed_how(e), []
        with contextlib.suppress(websockets.ConnectionClosed):
            await rws.send(json.dumps({"type": "response.cancel"}))
        parts.append(
            f"{len(text) / MIB:.0f} MiB item: {got}"
            + (f" (errors: {','.join(sorted(set(errors)))})" if errors else "")
        )
    return {"outcome": "; ".join(parts), "elapsed_s": time.monotonic() - t0, "unread_stream": unread}


# -- 4: many idle speech streams -------------------------------------------------------------------------


async def idle_streams(port: int, sizes: Sizes) -> dict[str, Any]:
    """Speech streams that start an utterance and then say nothing more, holding whatever they got."""
    t0 = time.monotonic()
    opened: list[Any] = []
    refused = 0

    async def one() -> None:
        nonlocal refused
        try:
            ws = await ws_client(port, "/v1/audio/speech/stream")
        except (OSError, websockets.WebSocketException, TimeoutError):
            refused += 1
            return
        opened.append(ws)
        with contextlib.suppress(websockets.ConnectionClosed):
            await ws.send(json.dumps({"type": "input.text", "text": "Hold"}))

    # 8 at a time, 10 batches a second: the slots they hold are the attack, not a handshake storm
    for i in range(0, sizes.idle_streams, 8):
        await asyncio.gather(*(one() for _ in range(min(8, sizes.idle_streams - i))))
        await asyncio.sleep(0.1)
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(
            f"http://127.0.0.1:{port}/v1/audio/speech",
            json={"model": "tts", "input": "Hi.", "voice": "alloy"},
        )
    await asyncio.sleep(sizes.hold_s)
    alive = sum(1 for ws in opened if ws.state == State.OPEN)
    for ws in opened:
        ws.transport.abort()
    return {
        "outcome": f"{len(opened)} opened, {refused} refused, {alive} open after {sizes.hold_s:.0f} s; POST /v1/audio/speech {r.status_code}",
        "elapsed_s": time.monotonic() - t0,
        "speech_post_status": r.status_code,
    }


# -- 5: sockets that never finish ----------------------------------------------------------------------


async def slow_sockets(port: int, sizes: Sizes) -> dict[str, Any]:
    """Silent TCP connections, upgrades that never finish their headers, one endless header and URL."""
    with contextlib.suppress(ValueError, OSError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(
            resource.RLIMIT_NOFILE,
            (min(hard, max(soft, sizes.silent_sockets + sizes.half_upgrades + 512)), hard),
        )
    t0 = time.monotonic()
    silent: list[socket.socket] = []
    for _ in range(sizes.silent_sockets):
        try:
            silent.append(await attacker_socket(port))
        except OSError:
            break
    half: list[socket.socket] = []
    for _ in range(sizes.half_upgrades):
        try:
            s = await attacker_socket(port)
            s.send(upgrade_request(port, "/v1/realtime")[:60])
            half.append(s)
        except OSError:
            break

    async def endless(prefix: bytes, mb: float) -> str:
        s = await attacker_socket(port)
        try:
            return await sent_and_answered(s, prefix, mb)
        finally:
            s.close()

    async def sent_and_answered(s: socket.socket, prefix: bytes, mb: float) -> str:
        loop = asyncio.get_running_loop()
        sent = 0
        chunk = b"a" * 65536
        try:
            await loop.sock_sendall(s, prefix)
            async with asyncio.timeout(60):
                while sent < mb * MIB:
                    await loop.sock_sendall(s, chunk)
                    sent += len(chunk)
        except TimeoutError:
            return f"stalled after {sent / MIB:.1f} MiB"
        except OSError as e:
            return f"cut off after {sent / MIB:.1f} MiB ({type(e).__name__})"
        # All of it went out: to the server, or only into the kernel's buffers (~4 MiB on loopback) after
        # the server hung up. Its answer tells which: a hang-up or an error status, or nothing at all.
        try:
            async with asyncio.timeout(5):
                answer = await loop.sock_recv(s, 64)
        except TimeoutError:
            return f"{sent / MIB:.0f} MiB taken"
        except OSError as e:
            return f"cut off: {sent / MIB:.1f} MiB sent, into buffers ({type(e).__name__})"
        if not answer or answer.startswith((b"HTTP/1.1 4", b"HTTP/1.1 5", b"HTTP/1.0 4", b"HTTP/1.0 5")):
            return f"cut off: {sent / MIB:.1f} MiB sent, into buffers ({answer[:12]!r})"
        return f"{sent / MIB:.0f} MiB taken (answered {answer[:12]!r})"

    header = await endless(
        f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Long: ".encode(), sizes.huge_header_mb
    )
    url = await endless(b"GET /healthz?", sizes.huge_header_mb)
    await asyncio.sleep(sizes.hold_s)

    def open_count(socks: list[socket.socket]) -> int:
        """Sockets the server still holds: reading what it sent (a 408, say) ends in EOF if it closed."""
        n = 0
        for s in socks:
            try:
                while s.recv(65536, socket.MSG_DONTWAIT):
                    pass
            except BlockingIOError:
                n += 1
            except OSError:
                pass
        return n

    silent_open, half_open = open_count(silent), open_count(half)
    for s in silent + half:
        s.close()
    return {
        "outcome": (
            f"after {sizes.hold_s:.0f} s: {silent_open}/{len(silent)} silent and {half_open}/{len(half)} half-upgrades "
            f"still open; {sizes.huge_header_mb:.0f} MiB header: {header}; URL: {url}"
        ),
        "elapsed_s": time.monotonic() - t0,
        "silent_open": silent_open,
        "half_open": half_open,
        "header": header,
        "url": url,
    }


# -- 6: bursts from a client that reads ------------------------------------------------------------------


async def bursts(port: int, sizes: Sizes) -> dict[str, Any]:
    """Back-to-back events in one write, from a client that reads everything it is sent."""
    t0 = time.monotonic()
    parts = []
    endings: list[str] = []
    for label, frames in (
        (f"{sizes.item_burst} item.create", [_item_create(i) for i in range(sizes.item_burst)]),
        (
            f"{sizes.cancel_pairs} create+cancel",
            [event(t) for _ in range(sizes.cancel_pairs) for t in ("response.create", "response.cancel")],
        ),
    ):
        ws = await raw_ws(port, "/v1/realtime")
        loop = asyncio.get_running_loop()
        blob = frame(event("session.update", session=MANUAL)) + b"".join(frame(f) for f in frames)
        reader = asyncio.create_task(read_frames(ws.sock, quiet_s=3.0, limit_s=60.0))
        try:
            await asyncio.wait_for(loop.sock_sendall(ws.sock, blob), 60)
        except (OSError, TimeoutError) as e:
            parts.append(f"{label}: send stopped ({type(e).__name__})")
        count, how = await reader
        ws.close()
        endings.append(how)
        parts.append(f"{label}: {how}, {count} events read")
    return {"outcome": "; ".join(parts), "elapsed_s": time.monotonic() - t0, "endings": endings}


def _item_create(i: int) -> bytes:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"burst {i}"}]}
    return event("conversation.item.create", item=item)


# -- 7: amplification ------------------------------------------------------------------------------------


async def amplification(port: int, sizes: Sizes) -> dict[str, Any]:
    t0 = time.monotonic()
    instructions = "x" * int(sizes.instructions_mb * MIB)
    sent = received = 0
    async with await ws_client(port) as ws:
        await ws.recv()
        first = json.dumps(
            {"type": "session.update", "session": {"type": "realtime", "instructions": instructions}}
        )
        small = json.dumps(
            {"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"speed": 1.0}}}}
        )
        try:
            for frame_text in [first] + [small] * sizes.session_updates:
                await ws.send(frame_text)
                sent += len(frame_text)
                async with asyncio.timeout(30):
                    while True:
                        msg = await ws.recv()
                        received += len(msg)
                        kind = json.loads(msg)["type"]
                        if kind in ("session.updated", "error"):
                            break
            how = f"sent {sent / MIB:.1f} MiB, got back {received / MIB:.1f} MiB ({received / max(sent, 1):.1f}x)"
        except (TimeoutError, websockets.ConnectionClosed) as e:
            how = f"sent {sent / MIB:.1f} MiB, got back {received / MIB:.1f} MiB, then {closed_how(e)}"
    return {"outcome": how, "elapsed_s": time.monotonic() - t0, "ratio": received / max(sent, 1)}


# -- 8: DNS rebinding ------------------------------------------------------------------------------------


async def rebinding(port: int, sizes: Sizes) -> dict[str, Any]:
    """A page at evil.example:PORT that resolves to the gateway: foreign Host, matching Origin."""
    parts = []
    accepted = []
    for path in ("/v1/realtime", "/v1/audio/speech/stream"):
        host = f"evil.example:{port}"
        sock = await attacker_socket(port)
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(
            upgrade_request(port, path + "?api_key=sk-leak-canary", f"Origin: http://{host}\r\n", host=host)
        )
        try:
            head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode(errors="replace")
            status = head.split(" ", 2)[1]
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
            status = type(e).__name__
        writer.transport.abort()
        parts.append(f"{path} {'accepted (101)' if status == '101' else 'refused ' + status}")
        if status == "101":
            accepted.append(path)
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.get(f"http://127.0.0.1:{port}/v1/models", headers={"Host": f"evil.example:{port}"})
    parts.append(f"HTTP with foreign Host: {r.status_code}")
    return {
        "outcome": "; ".join(parts),
        "elapsed_s": 0.0,
        "canary": "sk-leak-canary",
        "accepted": accepted,
        "http_status": r.status_code,
    }


ATTACKS: dict[str, tuple[Callable[[int, Sizes], Awaitable[dict[str, Any]]], Callable[[Sizes], str]]] = {
    "noisy_commit": (noisy_commit, lambda s: f"{s.noise_s:.0f} s noise, manual commit"),
    "deflate_bombs": (
        deflate_bombs,
        lambda s: (
            f"{s.bomb_frames} deflate bombs -> {s.bomb_inflated_mb:.1f} MB + {s.plain_appends} plain {s.plain_append_mb:.1f} MB appends"
        ),
    ),
    "speech_floods": (
        speech_floods,
        lambda s: (
            f"{s.stream_text_chars} chars unread; {s.huge_input_text_mb:.1f} MB input.text; {s.item_text_mb:.0f} MiB item"
        ),
    ),
    "idle_streams": (idle_streams, lambda s: f"{s.idle_streams} idle speech streams"),
    "slow_sockets": (
        slow_sockets,
        lambda s: (
            f"{s.silent_sockets} silent TCP, {s.half_upgrades} half upgrades, {s.huge_header_mb:.0f} MiB header and URL"
        ),
    ),
    "bursts": (bursts, lambda s: f"{s.item_burst} item.create; {s.cancel_pairs} create+cancel (reading)"),
    "amplification": (
        amplification,
        lambda s: f"{s.instructions_mb:.0f} MiB instructions + {s.session_updates} updates",
    ),
    "rebinding": (rebinding, lambda s: "foreign Host + its Origin; key in query"),
}
