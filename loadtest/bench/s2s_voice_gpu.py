"""PersonaPlex voices made at run time (``/v1/audio/voices`` with ``model: personaplex``) on the GPU: what
a registration costs the conversations live meanwhile, at the published 7B shape (random-init weights).

The stage as the gateway builds it (``PersonaPlexBackend``, published sampling, CUDA graphs, warmed up),
``--batch`` conversations live (opened without a voice prompt), each stepped with a frame of noise per
step through the backend's own ``step`` (host-measured: upload, replay, download, sync). Then a
``VoiceRegistration`` of a ``--sample-s`` synthetic voice sample, normalized as the gateway does in a
thread (``normalize_ms``, off the stage), is opened between two steps (framing only: ``open_ms``) and
stepped beside them until answered (a few frames encoded per
step in the voices' own Mimi encoder: up to ``VOICE_FRAMES_PER_STEP``, none started past
``VOICE_STEP_BUDGET_S``).

Prints JSON (also to ``--json``, written as it comes):
- ``baseline``: the conversations' step without a registration, p50 / p99 / max;
- ``registering``: the steps while the voice is encoded (p50 / p99 / max), how many, and ``added_ms``
  (their p50 less the baseline's: what each such step adds for every conversation);
- ``check``: the registration's codes vs the same sample encoded the start-up way
  (``MoshiEngine.encode_voice``, slot 0's encoder, once the conversations have left): the fraction of
  equal codes (1.0 expected) and the frame counts;
- ``voice_session_start``: a conversation opened with the new voice (its codes carried by the opening:
  open + prompt prefill + its first step), ms, with ``batch - 1`` conversations live.

    python3 -m loadtest.bench.s2s_voice_gpu --json voice.json                                   # on a CUDA machine
    python3 -m loadtest.bench.s2s_voice_gpu --config tiny --device cpu --batch 2 --sample-s 1 --steps 4   # dry run
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from typing import Any

import numpy as np
import torch

from realtime_gw.models.s2s.checkpoint import random_checkpoint
from realtime_gw.models.s2s.personaplex import PersonaPlexBackend
from realtime_gw.models.s2s.voice_records import VOICE_FRAMES_PER_STEP, VOICE_STEP_BUDGET_S, VoiceJob
from realtime_gw.protocols.loudness import normalized
from realtime_gw.protocols.voices import prompt_sample
from realtime_gw.records.s2s import S2sAudio, S2sOpen, VoiceCodes
from realtime_gw.records.voice import VoiceAdded, VoiceRegistration

FRAME = 1920


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def stats(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs, np.float64) * 1e3
    if not len(a):
        return {"n": 0}
    return {"n": len(a), "p50_ms": round(float(np.percentile(a, 50)), 3), "p99_ms": round(float(np.percentile(a, 99)), 3),
            "max_ms": round(float(a.max()), 3)}  # fmt: skip


def save(result: dict[str, Any], path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            f.write(json.dumps(result, indent=1))


def voice_sample(seconds: float) -> np.ndarray:
    """A voiced-sounding sample: a gliding harmonic tone with a little noise, float32 at 24 kHz."""
    rng = np.random.default_rng(0)
    t = np.arange(int(24000 * seconds)) / 24000
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 24000
    x = sum(0.2 / k * np.sin(k * phase) for k in range(1, 6)) + 0.01 * rng.standard_normal(len(t))
    return np.asarray(x, np.float32)


def noise() -> list[S2sAudio]:
    rng = np.random.default_rng(1)
    return [S2sAudio((rng.standard_normal(FRAME) * 3000).astype("<i2").tobytes())]


def timed_step(backend: PersonaPlexBackend, work: list[tuple[Any, list[Any]]]) -> tuple[float, list[Any]]:
    start = time.perf_counter()
    results = backend.step(work)
    return time.perf_counter() - start, results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="7b", choices=["7b", "tiny"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=32, help="conversations live while the voice is made")
    p.add_argument("--sample-s", type=float, default=10.0, help="the voice sample's length, seconds")
    p.add_argument("--steps", type=int, default=50, help="baseline steps")
    p.add_argument("--budget-s", type=float, default=300.0, help="stop stepping after this")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    deadline = t0 + args.budget_s
    cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    result: dict[str, Any] = {
        "config": args.config, "device": args.device, "batch": args.batch, "sample_s": args.sample_s,
        "frames_per_step": VOICE_FRAMES_PER_STEP, "step_budget_ms": VOICE_STEP_BUDGET_S * 1e3, "weights": "random init", "torch": torch.__version__,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(args.device) if cuda else platform.processor() or platform.machine(),
    }  # fmt: skip
    ck = random_checkpoint(args.config, args.device, dtype, "personaplex")
    backend = PersonaPlexBackend(config=args.config, device=args.device, slots=args.batch + 1, checkpoint=ck,
                                 cuda_graphs=cuda, seed=0)  # fmt: skip
    backend.warmup()
    log(f"stage ready in {time.perf_counter() - t0:.1f} s")
    live = [backend.open(S2sOpen(seed=i)) for i in range(args.batch)]
    frame = noise()
    for _ in range(3):  # first touches
        backend.step([(s, frame) for s in live])
    base = []
    for _ in range(args.steps):
        if time.perf_counter() > deadline:
            break
        base.append(timed_step(backend, [(s, frame) for s in live])[0])
    result["baseline"] = stats(base)
    save(result, args.json)
    pcm = voice_sample(args.sample_s)
    start = time.perf_counter()
    sample = prompt_sample(pcm)  # the gateway's part, in a thread beside the upload's decoding
    result["normalize_ms"] = round((time.perf_counter() - start) * 1e3, 3)
    start = time.perf_counter()
    job = backend.open(VoiceRegistration("voice_bench", "audio_sample", sample=sample))
    result["open_ms"] = round((time.perf_counter() - start) * 1e3, 3)
    assert isinstance(job, VoiceJob)
    during: list[float] = []
    added: VoiceAdded | None = None
    while added is None and time.perf_counter() < deadline:
        took, results = timed_step(backend, [(job, []), *((s, frame) for s in live)])
        during.append(took)
        assert all(r.error is None for r in results), [r.error for r in results]
        if results[0].done:
            added = results[0].outputs[0]
    backend.release(job)
    reg = stats(during)
    if during and base:
        reg["added_ms"] = round(reg["p50_ms"] - result["baseline"]["p50_ms"], 3)
    result["registering"] = reg
    save(result, args.json)
    if added is not None:
        backend.release(live.pop())
        start = time.perf_counter()
        state = backend.open(S2sOpen(seed=99, voice="voice_bench", persona="You enjoy having a good conversation.",
                                     custom_voice=VoiceCodes(added.codes, added.card)))  # fmt: skip
        backend.step([(state, frame), *((s, frame) for s in live)])
        result["voice_session_start_ms"] = round((time.perf_counter() - start) * 1e3, 3)
        live.append(state)
    for s in live:
        backend.release(s)
    if added is not None:
        want = backend.engine.encode_voice(normalized(pcm))
        got = np.asarray(added.codes)
        same = got.shape == want.shape
        result["check"] = {"frames": len(added.codes), "start_up_frames": len(want),
                           "equal_codes": round(float((got == want).mean()), 4) if same else 0.0}  # fmt: skip
    else:
        result["check"] = {"error": "the registration was not answered within the budget"}
    if cuda:
        result["max_memory_gib"] = round(torch.cuda.max_memory_allocated(args.device) / 2**30, 1)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, indent=1))
    save(result, args.json)
    return result


if __name__ == "__main__":
    main()
