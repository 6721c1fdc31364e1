"""``POST /v1/audio/transcriptions`` throughput: seconds of audio transcribed per wall second.

Starts a gateway from this checkout (CPU default: pocketsphinx) and posts a file of Piper speech
(``--minutes`` long, sentences with pauses, FLAC; or ``--audio FILE``) with 1..N clients at once. The
baseline, measured in the same run (``--baseline``):

- ``pocketsphinx``: the pocketsphinx backend alone in this process, hearing the same pieces through the
  same ``AsrStreamRequest`` (no gateway, no child process, no HTTP); the ratio is what the gateway's
  path costs on top of the decoding itself;
- ``realtime``: the same pieces through ``/v1/realtime`` transcription sessions on the same gateway (one
  session per client, each piece appended as fast as the session takes it and committed), for a stage
  such as Kyutai on a GPU where the backend alone cannot run in this process.

    .venv/bin/python -m loadtest.bench.transcriptions --minutes 2 --clients 1,2
    python3 -m loadtest.bench.transcriptions --audio speech.flac --clients 1,8,32 --baseline realtime \
        --server-args '--policy none --tts tone --asr kyutai --asr-device cuda'

Prints a markdown table (appended to docs/benchmarks-log.md with ``--write``) with each run's failed
transcriptions (a realtime turn's ``conversation.item.input_audio_transcription.failed``, a POST's error
status). A run past ``--run-timeout-s`` is cut short and reported as timed out: the bench never hangs.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import json
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import soundfile
import websockets

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


def read_audio(path: str) -> bytes:
    """A file as mono PCM16 at ``RATE`` (the first channel)."""
    data, rate = soundfile.read(path, dtype="int16", always_2d=True)
    return resample(data[:, 0].tobytes(), rate, RATE)


TRANSCRIPTION = "conversation.item.input_audio_transcription."


@dataclass
class Run:
    label: str
    clients: int
    wall: float | None
    """None: cut short at the run's timeout."""
    failed: int = 0
    """Transcriptions that failed (realtime turns, or POSTs answered with an error)."""


async def realtime_session(ws_url: str, pcm24k: bytes) -> int:
    """One ``/v1/realtime`` transcription session hearing the file piece by piece (each piece appended
    in 0.5 s chunks, then committed); returns how many of its turns failed (each turn ends completed or
    failed)."""
    cuts = pieces(pcm24k, RATE)
    chunk = RATE  # bytes: 0.5 s of PCM16
    async with websockets.connect(ws_url + "/v1/realtime?intent=transcription", max_size=None) as ws:
        await ws.recv()  # session.created
        update = {"type": "transcription", "audio": {"input": {"turn_detection": None}}}
        await ws.send(json.dumps({"type": "session.update", "session": update}))

        async def send() -> None:
            for lo, hi in cuts:  # byte offsets
                for at in range(lo, hi, chunk):
                    audio = base64.b64encode(pcm24k[at : min(at + chunk, hi)]).decode()
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))

        sender = asyncio.create_task(send())
        completed = failed = 0
        while completed + failed < len(cuts):
            ev = json.loads(await ws.recv())
            if ev["type"] == "error":
                raise RuntimeError(f"realtime transcription session: {ev['error']}")
            completed += ev["type"] == TRANSCRIPTION + "completed"
            if ev["type"] == TRANSCRIPTION + "failed":
                failed += 1
                print(f"transcription failed: {ev.get('error')}", flush=True)
        await sender
        return failed


async def post(url: str, data: bytes) -> int:
    """One POST of the file; returns 1 if it failed (an error status), else 0."""
    async with httpx.AsyncClient(timeout=3600) as client:
        r = await client.post(url, files={"file": ("speech.flac", data)}, data={"model": "whisper-1"})
        if r.is_error:
            print(f"POST failed: {r.status_code} {r.text[:200]}", flush=True)
            return 1
        return 0


def timed(label: str, n: int, timeout_s: float, *calls: Coroutine[Any, Any, int]) -> Run:
    """Run ``calls`` at once, at most ``timeout_s``: their wall time and failures (or timed out)."""

    async def go() -> Run:
        start = time.perf_counter()
        try:
            failed = await asyncio.wait_for(asyncio.gather(*calls), timeout_s)
        except asyncio.TimeoutError:
            return Run(label, n, None)
        return Run(label, n, time.perf_counter() - start, sum(failed))

    run = asyncio.run(go())
    print(run, flush=True)  # a run cut short keeps what it measured
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--clients", default="1,2")
    ap.add_argument("--server-args", default="--policy none --tts tone --transcription-max-concurrent 4")
    ap.add_argument(
        "--audio", help="transcribe this file (any format libsndfile reads) instead of Piper speech"
    )
    ap.add_argument("--baseline", choices=("pocketsphinx", "realtime"), default="pocketsphinx")
    ap.add_argument(
        "--run-timeout-s", type=float, default=900.0, help="cut a run (one path, one client count) short after this"
    )
    ap.add_argument("--write", action="store_true", help="append the table to docs/benchmarks-log.md")
    args = ap.parse_args()
    pcm = read_audio(args.audio) if args.audio else speech(args.minutes)
    audio_s = len(pcm) / 2 / RATE
    data = encode(pcm, RATE, "flac")
    counts = [int(c) for c in args.clients.split(",")]
    rows: list[Run] = []
    if args.baseline == "pocketsphinx":
        rows.append(Run("pocketsphinx backend alone, in process (baseline)", 1, baseline(pcm)))
    server = start_server(*args.server_args.split(), name="bench-transcriptions", timeout=600)
    limit = args.run_timeout_s
    try:
        url = server.http + "/v1/audio/transcriptions"
        for n in counts:
            if args.baseline == "realtime":
                label = f"/v1/realtime transcription sessions, {n} at once (baseline)"
                rows.append(timed(label, n, limit, *(realtime_session(server.ws, pcm) for _ in range(n))))
            label = f"POST /v1/audio/transcriptions, {n} client(s) at once"
            rows.append(timed(label, n, limit, *(post(url, data) for _ in range(n))))
    finally:
        stop_server(server)
    source = (
        f"`{Path(args.audio).name}`"
        if args.audio
        else "Piper speech (three sentences with 0.5 s pauses, repeated)"
    )
    lines = [
        "",
        f"## {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M')} UTC · file transcription throughput",
        "",
        f"- hardware: {hardware()}",
        f"- command: `python -m loadtest.bench.transcriptions --minutes {args.minutes:g} --clients {args.clients} "
        f"--baseline {args.baseline} --run-timeout-s {limit:g} "
        f"--server-args '{args.server_args}'`",
        f"- file: {audio_s:.0f} s of {source}, FLAC {len(data) // 1024} KiB; the gateway decodes it, cuts it at "
        "pauses into <= 20 s pieces and streams each through the ASR stage worker",
        "",
        "| path | clients | wall s | audio s per wall s | vs baseline | failed |",
        "|---|---|---|---|---|---|",
    ]
    # each row against the baseline with as many clients (pocketsphinx alone: its one run)
    base_speed = {r.clients: r.clients * audio_s / r.wall for r in rows if "baseline" in r.label and r.wall}
    for r in rows:
        if r.wall is None:
            lines.append(f"| {r.label} | {r.clients} | timed out (> {limit:g} s) | – | – | – |")
            continue
        speed = r.clients * audio_s / r.wall
        ref = base_speed.get(r.clients, base_speed.get(1, speed))
        lines.append(
            f"| {r.label} | {r.clients} | {r.wall:.1f} | {speed:.1f} | {speed / ref:.2f}x | {r.failed} |"
        )
    table = "\n".join(lines) + "\n"
    print(table)
    if args.write:
        append_run(table)


if __name__ == "__main__":
    main()
