"""GPU speech stage with the real Qwen3-TTS-12Hz architecture (``--tts qwen3``), one run per shape.

**Random-init weights** at the published 0.6B and 1.7B shapes (28-layer talker, 5-layer code predictor,
12 Hz codec decoder with the 72-frame sliding-window transformer and the SnakeBeta stack): real
architecture and cost, the audio is noise; byte-level text tokens (one per frame), no EOS (an utterance
is its tokens + 3 tail frames). Talker bf16, decoder fp32, CUDA graphs per (batch, KV-length) bucket.

Per shape: a graph-vs-eager check (greedy, same codes), then N concurrent streams through a real
``StageWorker`` (``bench_tts_gpu.run_streams``: first audio = submit -> first 80 ms frame at the consumer,
prompt prefill included; RTF per stream = synthesis wall time / audio length; frame lateness against
real-time playback), and the largest N whose p95 lateness stays <= 20 ms ("streams in real time").

    python3 loadtest/bench_tts_qwen3_gpu.py --json out.json            # on a CUDA machine
    python3 loadtest/bench_tts_qwen3_gpu.py --sizes 0.6b --device cpu --streams 1 --capacity 2  # dry run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "loadtest"))
try:
    import soxr  # noqa: F401
except ImportError:  # a bare GPU machine: the codec stages never resample (native 24 kHz), the import only
    import types

    sys.modules["soxr"] = types.ModuleType("soxr")

from bench_tts_gpu import SHORT_TEXT, TEXT, hardware, log, run_streams  # noqa: E402

from realtime_gw.models.runtime import StageWorker  # noqa: E402
from realtime_gw.models.speech.qwen3.checkpoint import random_checkpoint  # noqa: E402
from realtime_gw.models.speech.qwen3.engine import Qwen3Engine, build_prompt  # noqa: E402
from realtime_gw.models.speech.qwen3.talker import Sampling  # noqa: E402
from realtime_gw.models.speech.tts_qwen3 import QWEN_ROLE_IDS, Qwen3TtsBackend  # noqa: E402


def graph_vs_eager(ck: Any, device: str) -> dict[str, Any]:
    """Greedy: 12 frames of two streams, eager vs CUDA graphs, give the same codes."""
    out = []
    for graphs in (False, True):
        eng = Qwen3Engine(ck, 2, max_positions=64, sampling=Sampling(do_sample=False, sub_do_sample=False),
                          cuda_graphs=graphs)
        p = build_prompt(ck, QWEN_ROLE_IDS, "ryan", "english")
        a, b = eng.alloc_prompt(p), eng.alloc_prompt(p)
        codes = [eng.step([a, b], [1000 + i, 2000 + i], [False, False])[0] for i in range(12)]
        out.append(np.stack(codes))
    return {"graph_equals_eager_codes_frac": float((out[0] == out[1]).mean())}


async def bench_size(size: str, args: argparse.Namespace) -> dict[str, Any]:
    r: dict[str, Any] = {"size": size}
    dev = args.device
    dtype = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    t = time.perf_counter()
    ck = random_checkpoint(size, dev, dtype)
    r["load_s"] = time.perf_counter() - t
    tc = ck.talker_config
    r["model"] = (f"Qwen3-TTS-12Hz-{size} shape: talker {tc['num_hidden_layers']} layers / hidden "
                  f"{tc['hidden_size']}, 5-layer code predictor, 12 Hz codec decoder (8 layers, window 72)")
    if dev.startswith("cuda"):
        try:
            r["check"] = graph_vs_eager(ck, dev)
            log(f"[{size}] check {r['check']}")
        except Exception as e:
            traceback.print_exc()
            r["check_error"] = f"{type(e).__name__}: {e}"
    slots = max([*args.streams, *args.capacity])
    backend = Qwen3TtsBackend(checkpoint=ck, device=dev, slots=slots, max_positions=args.max_positions)
    t = time.perf_counter()
    backend.warmup()
    r.update(slots=slots, graphs=backend.engine.graph_count, capture_s=time.perf_counter() - t,
             text_frames=len(args.text.encode()) + backend.tail_frames)
    log(f"[{size}] warm-up {r['capture_s']:.1f} s, {r['graphs']} graphs")
    worker = StageWorker(backend, device=dev, max_batch=slots, max_active=slots, max_backlog=4096)
    await worker.start(warmup=False)
    try:
        await run_streams(worker, backend, 2, SHORT_TEXT)  # type: ignore[arg-type]
        r["streams"] = []
        for n in args.streams:
            s = await run_streams(worker, backend, n, args.text)  # type: ignore[arg-type]
            log(f"[{size}] streams {json.dumps(s)}")
            r["streams"].append(s)
        best = 0
        for n in args.capacity:
            s = next((x for x in r["streams"] if x["streams"] == n), None) or await run_streams(
                worker, backend, n, args.text  # type: ignore[arg-type]
            )
            log(f"[{size}] capacity {json.dumps(s)}")
            r.setdefault("capacity_runs", []).append(s)
            if s["late_p95_ms"] > 20.0:
                break
            best = n
        r["max_realtime"] = best
    finally:
        await worker.stop()
    return r


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"hardware": hardware(), "date": time.strftime("%Y-%m-%d"), "runs": []}
    for size in args.sizes:
        try:
            out["runs"].append(await bench_size(size, args))
        except Exception as e:
            traceback.print_exc()
            out["runs"].append({"size": size, "error": f"{type(e).__name__}: {e}"})
        torch.cuda.empty_cache() if args.device.startswith("cuda") else None
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=["0.6b", "1.7b"])
    p.add_argument("--streams", type=int, nargs="+", default=[1, 64])
    p.add_argument("--capacity", type=int, nargs="+", default=[128, 256, 384, 512])
    p.add_argument("--max-positions", type=int, default=256)
    p.add_argument("--text", default=TEXT)
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    r = asyncio.run(amain(args))
    text = json.dumps(r, indent=1, default=str)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
