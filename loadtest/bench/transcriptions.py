"""``POST /v1/audio/transcriptions`` throughput: seconds of audio transcribed per wall second.

Starts a gateway from this checkout (CPU default: pocketsphinx) and posts a file of Piper speech
(``--minutes`` long, sentences with pauses, FLAC) with 1..N clients at once. The baseline, measured in
the same run: the pocketsphinx backend alone in this process, hearing the same pieces through the same
``AsrStreamRequest`` (no gateway, no child process, no HTTP); the ratio is what the gateway's path
costs on top of the decoding itself.

    .venv/bin/python -m loadtest.bench.transcriptions --minutes 2 --clients 1,2

Prints a markdown table (appended to docs/benchmarks-log.md with ``--write``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import time
from pathlib import Path

import httpx

from loadtest.bench.log import append_run
from loadtest.bench.realtime import hardware
from realtime_gw.models.runtime import END_OF_INPUT
from realtime_gw.models.speech.asr_pocketsphinx import PocketsphinxAsrBackend
from realtime_gw.protocols.audio import resample
from realtime_gw.protocols.transcriptions import pieces
from realtime_gw.records.voice import AsrStreamRequest
from realtime_gw.testing.audio import synthesize
from realtime_gw.testing.audio_files import encode
from realtime_gw.testing.gateway import start_server, stop_server

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = [
    "The weather today is sunny with a light breeze.",
    "I would like to book a table for two people tomorrow evening.",
    "Please send the report to the whole team before noon.",
]
RATE = 24000


def speech(minutes: float) -> bytes:
    unit = b"".join(synthesize(s, RATE) + bytes(RATE) for s in SENTENCES)  # 0.5 s pause after each
    return (unit * int(minutes * 60 * RATE * 2 / len(unit) + 1))[: int(minutes * 60) * RATE * 2]


def baseline(pcm24k: bytes) -> float:
    """Seconds the backend alone takes for the file, piece by piece as the endpoint cuts it."""
    pcm = resample(pcm24k, RATE, 16000)
    backend = PocketsphinxAsrBackend(slots=1)
    backend.warmup()
    start = time.perf_counter()
    for lo, hi in pieces(pcm, 16000):
        state = backend.open(AsrStreamRequest(16000))
        inputs: list[object] = [pcm[lo:hi], END_OF_INPUT]
        while not backend.step([(state, inputs)])[0].done:
            inputs = []
        backend.release(state)
    return time.perf_counter() - start


async def post(url: str, data: bytes) -> str:
    async with httpx.AsyncClient(timeout=3600) as client:
        r = await client.post(url, files={"file": ("speech.flac", data)}, data={"model": "whisper-1"})
        r.raise_for_status()
        return str(r.json()["text"])


async def clients(url: str, data: bytes, n: int) -> float:
    start = time.perf_counter()
    await asyncio.gather(*(post(url, data) for _ in range(n)))
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--clients", default="1,2")
    ap.add_argument("--server-args", default="--policy none --tts tone --transcription-max-concurrent 4")
    ap.add_argument("--write", action="store_true", help="append the table to docs/benchmarks-log.md")
    args = ap.parse_args()
    pcm = speech(args.minutes)
    audio_s = len(pcm) / 2 / RATE
    data = encode(pcm, RATE, "flac")
    alone = baseline(pcm)
    rows = [("pocketsphinx backend alone, in process (baseline)", 1, alone)]
    server = start_server(*args.server_args.split(), name="bench-transcriptions", timeout=300)
    try:
        url = server.http + "/v1/audio/transcriptions"
        for n in [int(c) for c in args.clients.split(",")]:
            rows.append((f"POST /v1/audio/transcriptions, {n} client(s) at once", n, asyncio.run(clients(url, data, n))))
    finally:
        stop_server(server)
    lines = [
        "",
        f"## {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M')} UTC · CPU: file transcription throughput",
        "",
        f"- hardware: {hardware()}",
        f"- command: `python -m loadtest.bench.transcriptions --minutes {args.minutes:g} --clients {args.clients} "
        f"--server-args '{args.server_args}'`",
        f"- file: {audio_s:.0f} s of Piper speech (three sentences with 0.5 s pauses, repeated), FLAC "
        f"{len(data) // 1024} KiB; the gateway decodes it, cuts it at pauses into <= 20 s pieces and streams each "
        "through the ASR stage worker (pocketsphinx in its child process)",
        "",
        "| path | clients | wall s | audio s per wall s | vs baseline |",
        "|---|---|---|---|---|",
    ]
    for label, n, wall in rows:
        speed = n * audio_s / wall
        lines.append(f"| {label} | {n} | {wall:.1f} | {speed:.1f} | {speed / (audio_s / alone):.2f}x |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.write:
        append_run(table)


if __name__ == "__main__":
    main()
