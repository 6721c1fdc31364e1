"""Would a Qwen3-TTS frame's decoder overlap the next frame's talker + code predictor? (H200 probe)

**Random-init weights** at the published 0.6B shape, decoder as served (tf32, fused SnakeBeta). Per batch:
graph-replay ms of the talker + code predictor (A, ``frame_step``) alone, of the decoder (B) alone, of A then B
on one stream (today's frame), and of A and B launched together on two streams (each graph in its own memory
pool), which is what a pipelined frame loop (decode frame n while frame n + 1's codes are predicted) costs
per frame; and the same with the talker's stream at the highest CUDA priority and the decoder's at the lowest
(would the talker's kernels, the critical path, then be scheduled ahead of a decoder kernel's pending
blocks? Measured no gain, so the pipelined ``SlotEngine`` leaves priorities alone). Every row inactive: the replays leave the streams' state alone.

    python3 -m loadtest.probes.qwen3_overlap --batches 1 64 256 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from loadtest.bench.kernel_profile import kernels
from realtime_gw.models.kernels import GraphCapture
from realtime_gw.models.speech.qwen3.checkpoint import random_checkpoint
from realtime_gw.models.speech.qwen3.engine import Qwen3Engine

ROOT = Path(__file__).resolve().parents[2]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def timed(launch: Any, reps: int = 30) -> float:
    """Median ms from an event before ``launch()`` to the point where everything it launched is done."""
    main = torch.cuda.current_stream()
    times = []
    for _ in range(reps + 3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(main)
        launch()
        b.record(main)
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times[3:]))


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--length", type=int, default=64, help="KV-length bucket")
    ap.add_argument("--profile", action="store_true", help="kernels of each part (torch.profiler)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    ck = random_checkpoint(args.size, "cuda", torch.bfloat16)
    eng = Qwen3Engine(ck, max(args.batches), decoder_precision="tf32", fuse_snake=True, cuda_graphs=False)
    eng.d_active.zero_()
    talk_cap, dec_cap = GraphCapture("cuda"), GraphCapture("cuda")
    side = torch.cuda.Stream()
    main_stream = torch.cuda.current_stream()
    high, low = torch.cuda.Stream(priority=-100), torch.cuda.Stream(priority=100)
    out: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "priorities": {"talker": high.priority, "decoder": low.priority},
        "batches": {},
    }
    for b in args.batches:
        tok, act, ok = eng.d_tok[:b], eng.d_active[:b], eng.d_eos_ok[:b]
        codes = eng.d_codes[:b]
        ga = talk_cap.capture(
            lambda b=b, tok=tok, act=act, ok=ok: eng.talker.frame_step(b, args.length, tok, act, ok)
        )
        gb = dec_cap.capture(lambda b=b, codes=codes, act=act: eng.decoder.step(b, codes, act))

        def both(ga: Any = ga, gb: Any = gb) -> None:
            side.wait_stream(main_stream)
            ga.replay()
            with torch.cuda.stream(side):
                gb.replay()
            main_stream.wait_stream(side)

        def prioritized(ga: Any = ga, gb: Any = gb) -> None:
            high.wait_stream(main_stream)
            low.wait_stream(main_stream)
            with torch.cuda.stream(high):
                ga.replay()
            with torch.cuda.stream(low):
                gb.replay()
            main_stream.wait_stream(high)
            main_stream.wait_stream(low)

        times = {
            "talker_cp_ms": timed(ga.replay),
            "decoder_ms": timed(gb.replay),
            "serial_ms": timed(lambda ga=ga, gb=gb: (ga.replay(), gb.replay())),
            "overlapped_ms": timed(both),
            "prioritized_ms": timed(prioritized),
        }
        times["saved_ms"] = times["serial_ms"] - times["overlapped_ms"]
        row: dict[str, Any] = {k: round(v, 3) for k, v in times.items()}
        if args.profile:
            row["talker_cp_prof"] = kernels(
                lambda b=b, tok=tok, act=act, ok=ok: eng.talker.frame_step(b, args.length, tok, act, ok)
            )
            row["decoder_prof"] = kernels(lambda b=b, codes=codes, act=act: eng.decoder.step(b, codes, act))
        out["batches"][b] = row
        log(f"batch {b}: {json.dumps(row)}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
