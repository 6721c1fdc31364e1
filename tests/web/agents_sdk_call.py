"""A call from @openai/agents-realtime (npm) in headless Chromium to a gateway, all inside this process's
network namespace: run as ``unshare -rn python -m tests.web.agents_sdk_call BUNDLE_DIR OUT.json [FLAG...]``
(FLAGs: more gateway flags, e.g. ``--webrtc-media-workers 1``).

Inside: loopback is brought up (it is all there is), a gateway boots on it, a small HTTP server serves
``agents_sdk_page.html`` and the SDK's browser bundle (``BUNDLE_DIR``: the package's ``dist/bundle``) from
another origin, the app's backend role mints an ``ek_`` secret, and Chromium (its microphone a WAV)
runs the page: connect, a spoken turn answered on the track, then a long typed turn interrupted with
``session.interrupt()``. What was seen goes to OUT.json for the test to judge; a wait that ran out is
recorded under ``failed`` with the page's state.
"""

from __future__ import annotations

import fcntl
import functools
import http.server
import json
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from realtime_gw.client.audio import silence, write_wav
from realtime_gw.testing.audio import synthesize
from realtime_gw.testing.gateway import ARTIFACTS, LiveServer, free_port, start_server, stop_server
from tests.web.chromium import PageTimeout, chromium, wait_page

SPOKEN = "Please open the door for me."
LONG_TEXT = "I would like a cup of coffee. " * 6
PAGE = Path(__file__).with_name("agents_sdk_page.html")


def bring_up_loopback() -> None:
    """A fresh network namespace has ``lo`` down; up it (SIOCSIFFLAGS, as ``ip link set lo up`` does)."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, siocgifflags, struct.pack("16sH", b"lo", 0))[:18])[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH", b"lo", flags | iff_up))


class _Files(http.server.SimpleHTTPRequestHandler):
    """``/`` is the page, ``/sdk/<file>`` the SDK bundle's files; nothing else."""

    extensions_map = {".mjs": "text/javascript", ".js": "text/javascript", ".html": "text/html"}

    def __init__(self, *args: Any, bundle: Path, **kwargs: Any) -> None:
        self.bundle = bundle
        super().__init__(*args, directory=str(bundle), **kwargs)

    def translate_path(self, path: str) -> str:
        path = path.split("?")[0]
        if path == "/":
            return str(PAGE)
        name = path.removeprefix("/sdk/")
        return str(self.bundle / name) if name != path and "/" not in name else str(self.bundle / "-")

    def log_message(self, *args: Any) -> None:
        pass


def serve_page(bundle: Path) -> tuple[http.server.ThreadingHTTPServer, int]:
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), functools.partial(_Files, bundle=bundle))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, port


def wait_calls(gateway: LiveServer, count: float, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while gateway.metric("realtime_gw_calls") != count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def energy(state: dict[str, Any]) -> float:
    inbound = state.get("inbound") or {}
    return float(inbound.get("energy", 0.0))


def drive(driver: Any, gateway: LiveServer, page_url: str, seen: dict[str, Any]) -> None:
    def wait(pred: Any, timeout: float, what: str) -> dict[str, Any]:
        return wait_page(driver, "window.sdk", pred, timeout, what)

    driver.get(page_url)
    state = wait(lambda s: s["status"] in ("connected", "failed"), 30, "connect() settled")
    seen["connected"] = {"status": state["status"], "call_id": state["callId"], "errors": state["errors"]}
    seen["calls_while_connected"] = gateway.metric("realtime_gw_calls")
    if state["status"] != "connected":
        return
    # The microphone speaks; server VAD ends the turn; the (echo) reply plays on the track to its end.
    state = wait(
        lambda s: s["transcripts"] and "output_audio_buffer.stopped" in s["events"],
        60,
        "a spoken turn answered and played out",
    )
    seen["first_reply"] = {"transcripts": state["transcripts"], "inbound": state["inbound"]}
    # A long typed turn, interrupted while it plays: the SDK sends response.cancel and output_audio_buffer.clear.
    driver.execute_script("window.sdkSend(arguments[0])", LONG_TEXT)
    state = wait(
        lambda s: s["events"].count("output_audio_buffer.started") >= 2, 60, "the long reply playing"
    )
    time.sleep(1.0)
    playing = driver.execute_script("return window.sdk")
    seen["energy_while_playing_1s"] = energy(playing) - energy(state)
    driver.execute_script("window.sdkInterrupt()")
    state = wait(
        lambda s: "output_audio_buffer.cleared" in s["events"] and s["truncated"], 15, "cleared and truncated"
    )
    time.sleep(0.3)  # what the jitter buffer still held plays out
    settled = driver.execute_script("return window.sdk")
    time.sleep(1.0)
    after = driver.execute_script("return window.sdk")
    seen["energy_after_clear_1s"] = energy(after) - energy(settled)
    seen["after_interrupt"] = {
        "events": after["events"], "truncated": after["truncated"], "errors": after["errors"],
        "inbound": after["inbound"],
    }  # fmt: skip
    driver.execute_script("window.sdkClose()")
    seen["call_ended"] = wait_calls(gateway, seen["calls_while_connected"] - 1, 10)


def main(bundle: Path, out: Path, flags: list[str]) -> None:
    bring_up_loopback()
    seen: dict[str, Any] = {"interfaces": [name for _, name in socket.if_nameindex()]}
    page_server, page_port = serve_page(bundle)
    origin = f"http://127.0.0.1:{page_port}"
    gateway = start_server(
        "--policy", "none", "--api-key", "test-key", "--tts-deterministic", "--host", "127.0.0.1",
        "--allowed-origins", origin, *flags, "--no-cpu-backend-spare", name="agents-sdk",
    )  # fmt: skip
    driver = None
    try:
        # The app's backend: mints a short-lived secret with its deployment key and hands it to the page.
        minted = httpx.post(
            gateway.http + "/v1/realtime/client_secrets",
            json={"expires_after": {"anchor": "created_at", "seconds": 120}},
            headers={"Authorization": "Bearer test-key"},
        ).json()
        seen["secret_prefix"] = minted["value"][:3]
        mic = out.with_suffix(".mic.wav")
        # Silence first: Chromium opens the device before the call is up and the session configured.
        write_wav(mic, silence(3000, 24000) + synthesize(SPOKEN, 24000) + silence(1500, 24000), 24000)
        driver = chromium(mic)
        try:
            drive(driver, gateway, f"{origin}/?gateway={gateway.http}&key={minted['value']}", seen)
        except PageTimeout as e:
            seen["failed"] = str(e)
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "agents-sdk-page.png"))
        seen["gateway_errors"] = [line for line in gateway.logs().splitlines() if "Traceback" in line]
    finally:
        if driver is not None:
            driver.quit()
        stop_server(gateway)
        page_server.shutdown()
        out.write_text(json.dumps(seen, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
