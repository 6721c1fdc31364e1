"""Transport floor on loopback: the project's page (realtime_gw/web) in headless Chromium, over a WebRTC
call and over the WebSocket, against one gateway with the cheapest server path (tone TTS, echo
responder), in the same run.

Chromium's fake microphone (a WAV) says a short sentence ``--turns`` times, 5 s apart; server VAD ends
each turn and the tone reply plays. Measured per turn, on the page's clock:
- **loop**: from the end of the sentence at the microphone (its onset as the page's capture sees it,
  plus the sentence's length) to the first sound of the reply at the page's speaker: both directions of
  the transport plus the server's work (VAD's silence wait, the recogniser's final, the tone), which is
  the same for both transports, so the difference between them is the transports';
- **reply path**: from the page's receipt of ``input_audio_buffer.speech_stopped`` to the first sound;
- WebRTC: Chromium's jitter buffer on the reply track (mean delay, share of samples concealed).
"First sound": WebRTC, the page's meter worklet on the received track; WebSocket, the page's playback
worklet starting the reply (after its 120 ms prebuffer).

    .venv/bin/python -m loadtest.bench.transport_floor --turns 4
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
from realtime_gw.testing.audio import synthesize
from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.web.chromium import MISSING, chromium, wait_page

SENTENCE = "Please open the door for me."
RATE = 24000
GAP_MS = 5000


def speech_ms(pcm: bytes) -> float:
    """From the first to the last sample the page's capture would call loud (its threshold)."""
    loud = np.flatnonzero(np.abs(np.frombuffer(pcm, dtype="<i2")) > 1600)
    return (loud[-1] - loud[0]) / RATE * 1000 if len(loud) else 0.0


def run_page(server: LiveServer, transport: str, mic: Path, turns: int, sentence_ms: float) -> dict[str, Any]:
    driver = chromium(mic)
    try:
        if transport == "webrtc":
            minted = httpx.post(
                server.http + "/v1/realtime/client_secrets", json={}, headers={"Authorization": "Bearer test-key"}
            ).json()
            driver.get(server.http + f"/?key={minted['value']}")
        else:
            driver.get(server.http + "/?key=test-key&transport=websocket")
        driver.find_element("id", "start").click()
        state = wait_page(
            driver, "window.rtgw", lambda s: len(s["heardAtMs"]) >= turns, 30 + turns * 8, f"{turns} replies heard"
        )
        time.sleep(1.5)  # the last stats poll
        state = driver.execute_script("return window.rtgw")
        onsets, heard = state["micOnsetsMs"], state["heardAtMs"]
        loops = [h - (o + sentence_ms) for o, h in zip(onsets, heard, strict=False)]
        return {
            "loop_ms": loops,
            "reply_ms": state["heardLatencyMs"],
            "jitter_buffer_ms": state["jitterBufferMs"],
            "concealed_pct": state["concealedPct"],
            "errors": state["errors"],
            "onsets": len(onsets),
        }
    finally:
        driver.quit()


def summary(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.0f} (min {min(xs):.0f}, max {max(xs):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="each transport this many times, alternating")
    args = parser.parse_args()
    if MISSING:
        raise SystemExit(MISSING)
    sentence = synthesize(SENTENCE, RATE)
    pcm = silence(3000, RATE) + (sentence + silence(GAP_MS, RATE)) * args.turns
    sentence_ms = speech_ms(sentence)
    server = start_server("--policy", "none", "--api-key", "test-key", "--tts", "tone", name="transport-floor")
    results: dict[str, list[dict[str, Any]]] = {"webrtc": [], "websocket": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            mic = Path(tmp) / "mic.wav"
            write_wav(mic, pcm, RATE)
            for _ in range(args.rounds):
                for transport in results:
                    r = run_page(server, transport, mic, args.turns, sentence_ms)
                    results[transport].append(r)
                    print(transport, {k: v for k, v in r.items()}, flush=True)
    finally:
        stop_server(server)
    table = [
        "| transport | loop: mic end -> first reply sound, ms median (min, max) | reply path: speech_stopped received -> sound | jitter buffer (mean delay, concealed) |",
        "|---|---|---|---|",
    ]  # fmt: skip
    for transport, runs in results.items():
        loops = [x for r in runs for x in r["loop_ms"]]
        replies = [x for r in runs for x in r["reply_ms"]]
        jb = [r["jitter_buffer_ms"] for r in runs if r["jitter_buffer_ms"] is not None]
        conc = [r["concealed_pct"] for r in runs if r["concealed_pct"] is not None]
        buffer = f"{statistics.median(jb):.0f} ms, {max(conc):.2f} %" if jb else "page prebuffer 120 ms"
        table.append(f"| {transport} | {summary(loops)} | {summary(replies)} | {buffer} |")
    print("\n".join(table))
    load = " ".join(f"{x:.1f}" for x in psutil.getloadavg())
    append_run(
        f"\n## {dt.date.today()} Transport floor, WebRTC vs WebSocket page (`python -m loadtest.bench.transport_floor "
        f"--turns {args.turns} --rounds {args.rounds}`)\n\n"
        f"{platform.processor() or platform.machine()}, {psutil.cpu_count()} cores (shared; load average {load} at "
        f"the end), Chromium headless, tone TTS, echo responder, default server VAD; {args.turns} turns x "
        f"{args.rounds} page loads per transport, alternating.\n\n" + "\n".join(table) + "\n"
    )


if __name__ == "__main__":
    main()
