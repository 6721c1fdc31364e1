"""Transport floor on loopback, tone in -> tone out: the project's page (realtime_gw/web) in headless
Chromium, over a WebRTC call and over the WebSocket, against one gateway, in the same run.

The page's session runs the ``gateway-echo`` model (``?model=gateway-echo&vad=0&processing=0``: the
microphone unprocessed, so the tone's onset is the same sample at both ends): the gateway says
back what it hears, 20 ms at a time, through the session's normal output path (the call's paced track,
or ``response.output_audio.delta`` events), with no VAD, ASR, language model or TTS in the loop. So
the loop measured is both directions of the transport, the page's capture and playback, and the
session's own input/output path, which is the same for both transports.

Chromium's fake microphone (a WAV) plays ``--tones`` tone bursts (300 ms, 440 Hz) 2 s apart. Measured
per burst, on the page's clock: **loop** from the burst's onset at the page's capture to its echo's
first sound in the page's audio graph (the same threshold, 0.02 of full scale, at both ends), taken by
the same meter for both transports (the call's
received track; the WebSocket page's playback worklet output, after its 120 ms prebuffer); WebRTC also
Chromium's jitter buffer on the reply track (mean delay, share of samples concealed).

    .venv/bin/python -m loadtest.bench.transport_floor --tones 8 --rounds 2
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from loadtest.bench.log import append_run
from realtime_gw.client.audio import silence, write_wav
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.web.chromium import MISSING, chromium, wait_page

RATE = 24000
TONE_MS = 300
GAP_MS = 2000
ECHO = "gateway-echo"


def tone(ms: int, hz: float = 440.0) -> bytes:
    t = np.arange(RATE * ms // 1000) / RATE
    return (np.sin(2 * np.pi * hz * t) * 12000).astype("<i2").tobytes()


def track_figures(server: LiveServer) -> tuple[float, float, float]:
    """The gateway's call tracks so far: frames sent, of them > 20 ms late, reply frames underrun."""
    return (
        server.metric("realtime_gw_call_frame_lateness_seconds_count"),
        server.metric("realtime_gw_call_frame_lateness_seconds_count")
        - server.metric("realtime_gw_call_frame_lateness_seconds_bucket", 'le="0.02"'),
        server.metric("realtime_gw_call_reply_underrun_frames_total"),
    )


def run_page(server: LiveServer, transport: str, mic: Path, tones: int) -> dict[str, Any]:
    before = track_figures(server)
    driver = chromium(mic)
    try:
        query = f"model={ECHO}&vad=0&processing=0&transport={transport}"
        if transport == "webrtc":  # as an app does: a secret minted by its backend
            minted = httpx.post(
                server.http + "/v1/realtime/client_secrets", json={}, headers={"Authorization": "Bearer test-key"}
            ).json()
            driver.get(server.http + f"/?key={minted['value']}&{query}")
        else:
            driver.get(server.http + f"/?key=test-key&{query}")
        driver.find_element("id", "start").click()
        wait_page(  # an onset heard while the last echo is still awaited is not timed (see the page)
            driver, "window.rtgw", lambda s: len(s["micOnsetsMs"]) >= tones, 30 + tones * 3, f"{tones} tones sent"
        )
        time.sleep(GAP_MS / 1000 + 1.5)  # the last echo, and the last stats poll
        state = driver.execute_script("return window.rtgw")
        driver.find_element("id", "stop").click()  # hangs up: the next page load has the gateway to itself
        for _ in range(100):
            if server.metric("realtime_gw_calls") == 0 == server.metric("realtime_gw_sessions", 'kind="realtime"'):
                break
            time.sleep(0.1)
        frames, late, underruns = (b - a for a, b in zip(before, track_figures(server), strict=True))
        return {
            "track_frames": frames,
            "track_late": late,
            "reply_underruns": underruns,
            "loop_ms": state["echoLoopMs"],
            "jitter_buffer_ms": state["jitterBufferMs"],
            "concealed_pct": state["concealedPct"],
            "errors": state["errors"],
            "onsets": len(state["micOnsetsMs"]),
        }
    finally:
        driver.quit()


def summary(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.0f} (min {min(xs):.0f}, max {max(xs):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tones", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="each transport this many times, alternating")
    args = parser.parse_args()
    if MISSING:
        raise SystemExit(MISSING)
    pcm = silence(3000, RATE) + (tone(TONE_MS) + silence(GAP_MS, RATE)) * args.tones
    server = start_server("--policy", "none", "--api-key", "test-key", "--tts", "tone", name="transport-floor")
    results: dict[str, list[dict[str, Any]]] = {"webrtc": [], "websocket": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            mic = Path(tmp) / "mic.wav"
            write_wav(mic, pcm, RATE)
            for _ in range(args.rounds):
                for transport in results:
                    r = run_page(server, transport, mic, args.tones)
                    results[transport].append(r)
                    print(transport, r, flush=True)
    finally:
        stop_server(server)
    medians = {t: statistics.median([x for r in runs for x in r["loop_ms"]]) for t, runs in results.items()}
    table = [
        "| transport | loop: tone onset at the mic -> its echo's first sound, ms median (min, max) | echoes timed | / WebSocket | jitter buffer (mean delay, concealed) | gateway track: frames > 20 ms late, reply underruns | page errors |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for transport, runs in results.items():
        loops = [x for r in runs for x in r["loop_ms"]]
        jb = [r["jitter_buffer_ms"] for r in runs if r["jitter_buffer_ms"] is not None]
        conc = [r["concealed_pct"] for r in runs if r["concealed_pct"] is not None]
        buffer = f"{statistics.median(jb):.0f} ms, {max(conc):.2f} %" if jb else "page prebuffer 120 ms"
        ratio = medians[transport] / medians["websocket"]
        errors = sum(len(r["errors"]) for r in runs)
        frames = sum(r["track_frames"] for r in runs)
        track = (
            f"{sum(r['track_late'] for r in runs) / frames:.2%}, {sum(r['reply_underruns'] for r in runs):.0f}"
            if frames and transport == "webrtc"
            else "-"
        )
        timed = f"{len(loops)} of {sum(r['onsets'] for r in runs)}"
        table.append(f"| {transport} | {summary(loops)} | {timed} | {ratio:.2f}x | {buffer} | {track} | {errors} |")
    print("\n".join(table))
    load = " ".join(f"{x:.1f}" for x in psutil.getloadavg())
    append_run(
        f"\n## {dt.date.today()} Transport floor, tone in -> tone out, WebRTC vs WebSocket page "
        f"(`python -m loadtest.bench.transport_floor --tones {args.tones} --rounds {args.rounds}`)\n\n"
        f"{platform.processor() or platform.machine()}, {psutil.cpu_count()} cores (shared; load average {load} at "
        f"the end), Chromium headless, the `{ECHO}` model (no VAD, ASR, LLM or TTS in the loop), {TONE_MS} ms "
        f"tone bursts {GAP_MS / 1000:g} s apart, {args.tones} per page load, {args.rounds} page loads per "
        "transport, alternating; both loops timed by the same meter in the page's audio graph.\n\n"
        + "\n".join(table) + "\n"
    )


if __name__ == "__main__":
    main()
