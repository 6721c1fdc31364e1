"""Silero VAD backends side by side: onnxruntime one call per stream, onnxruntime batched (the default
``--vad`` path), and torch batched (``--vad-device``), at N streams per step.

Each stream is live speech (loadtest/data/voice_turn_24k.wav at 16 kHz, every stream from its own offset,
looped) pushed ``--windows`` x 32 ms per step, as a session's audio arrives; a step scores every stream's new
windows. The three backends step the same audio, interleaved step by step (so a noisy machine slows them
alike); the step wall time is measured around ``backend.step``. The probabilities of the three are compared
(max absolute difference over every window).

    .venv/bin/python -m loadtest.bench.vad                           # CPU: torch on the CPU
    python3 -m loadtest.bench.vad --device cuda --streams 1 64 256 1024
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np
import torch

from realtime_gw.models.speech.vad_silero import WINDOW, SileroVadBackend
from realtime_gw.models.speech.vad_silero_torch import TorchSileroVadBackend
from realtime_gw.protocols.audio import resample
from realtime_gw.records.voice import VadRequest

ROOT = Path(__file__).resolve().parents[2]

UTTERANCE = ROOT / "loadtest" / "data" / "voice_turn_24k.wav"
BACKENDS = ("onnx_per_stream", "onnx_batched", "torch")


def speech_16k() -> np.ndarray:
    with wave.open(str(UTTERANCE), "rb") as w:
        pcm = w.readframes(w.getnframes())
        rate = w.getframerate()
    # The utterance, then as much silence: the VAD sees both.
    x = np.frombuffer(resample(pcm, rate, 16000), dtype="<i2")
    return np.concatenate([x, np.zeros_like(x)])


def pcts(xs: list[float]) -> dict[str, float]:
    a = np.array(xs) * 1000
    return {"p50_ms": round(float(np.percentile(a, 50)), 3), "p95_ms": round(float(np.percentile(a, 95)), 3)}


def run_level(n: int, windows: int, steps: int, warm: int, device: str, audio: np.ndarray) -> dict[str, Any]:
    rng = np.random.default_rng(n)
    offsets = rng.integers(0, audio.size, size=n)
    looped = np.concatenate([audio, audio])
    chunk = windows * WINDOW

    def chunk_of(stream: int, k: int) -> bytes:
        start = int(offsets[stream] + k * chunk) % audio.size
        return looped[start : start + chunk].tobytes()

    onnx = SileroVadBackend()
    tv = TorchSileroVadBackend(device, slots=n, max_batch=n)
    tv.warmup()
    backends: dict[str, Any] = {"onnx_per_stream": onnx, "onnx_batched": onnx, "torch": tv}
    states = {name: [b.open(VadRequest(sample_rate=16000)) for _ in range(n)] for name, b in backends.items()}
    times: dict[str, list[float]] = {name: [] for name in BACKENDS}
    probs: dict[str, list[float]] = {name: [] for name in BACKENDS}
    for k in range(warm + steps):
        for name in BACKENDS:
            backend, sts = backends[name], states[name]
            work = [(s, [chunk_of(i, k)]) for i, s in enumerate(sts)]
            t0 = time.perf_counter()
            if name == "onnx_per_stream":
                results = [backend.step([w])[0] for w in work]
            else:
                results = backend.step(work)
            elapsed = time.perf_counter() - t0
            if k >= warm:
                times[name].append(elapsed)
            for r in results:
                assert r.error is None, r.error
                probs[name] += [p for out in r.outputs for p in out.probs]
    for name in BACKENDS:
        for s in states[name]:
            backends[name].release(s)
    base = np.array(probs["onnx_batched"])
    row: dict[str, Any] = {"streams": n, "windows_per_step": windows, "steps": steps}
    for name in BACKENDS:
        row[name] = pcts(times[name])
    for name in BACKENDS:
        row[name]["max_abs_diff_vs_onnx_batched"] = float(np.abs(np.array(probs[name]) - base).max())
        row[name]["ratio_p50_vs_onnx_batched"] = round(row[name]["p50_ms"] / row["onnx_batched"]["p50_ms"], 3)
    return row


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| streams | windows/step | onnx per stream p50 / p95 (ms) | onnx batched p50 / p95 (ms) "
        f"| torch ({result['device']}) p50 / p95 (ms) | per stream / batched | torch / batched | max diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["levels"]:
        a, b, t = r["onnx_per_stream"], r["onnx_batched"], r["torch"]
        diff = max(a["max_abs_diff_vs_onnx_batched"], t["max_abs_diff_vs_onnx_batched"])
        lines.append(
            f"| {r['streams']} | {r['windows_per_step']} | {a['p50_ms']} / {a['p95_ms']} | {b['p50_ms']} / "
            f"{b['p95_ms']} | {t['p50_ms']} / {t['p95_ms']} | {a['ratio_p50_vs_onnx_batched']} | "
            f"{t['ratio_p50_vs_onnx_batched']} | {diff:.1e} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="the torch backend's device")
    p.add_argument("--streams", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--windows", type=int, nargs="+", default=[1, 3], help="32 ms windows per stream per step")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warm", type=int, default=5)
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch's intra-op threads (onnxruntime's Silero session runs one); 0 = torch's default",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    audio = speech_16k()
    levels = []
    for n in args.streams:
        for windows in args.windows:
            row = run_level(n, windows, args.steps, args.warm, args.device, audio)
            print(json.dumps(row), file=sys.stderr, flush=True)
            levels.append(row)
    gpu = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None
    result = {
        "bench": "vad",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
        + (f", {gpu}" if gpu else ""),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": args.device,
        "command": " ".join(["loadtest/bench/vad.py", *sys.argv[1:]]),
        "levels": levels,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    print(markdown(result))


if __name__ == "__main__":
    main()
