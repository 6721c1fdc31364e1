"""GPU speech stage with the real Qwen3-TTS-12Hz architecture (``--tts qwen3``), one run per shape.

**Random-init weights** at the published 0.6B and 1.7B shapes (28-layer talker, 5-layer code predictor,
12 Hz codec decoder with the 72-frame sliding-window transformer and the SnakeBeta stack): real
architecture and cost, the audio is noise; byte-level text tokens (one per frame), no EOS (an utterance
is its tokens + 3 tail frames). Talker bf16, decoder as served (``--decoder-precision``, default tf32, and
SnakeBeta fused unless ``--no-fuse-snake``), CUDA graphs per (batch, KV-length) bucket.

Per shape: a graph-vs-eager check (greedy, same codes and PCM, one stream from the cached prompt K/V);
with ``--micro`` batches, every decoder mode's max abs / relative waveform difference from strict fp32
and its step time, and graph times of talker + code predictor and of the whole frame, and a stream's
start from the cached prompt vs a prefill. Then N concurrent streams through a real ``StageWorker``
(``bench_tts_gpu.run_streams``: first audio = submit -> first 80 ms frame at the consumer; RTF per stream
= synthesis wall time / audio length; frame lateness against real-time playback; the longest garbage
collection during the run), and the largest N whose p95 lateness stays <= 20 ms ("streams in real time").
With ``--reference-path DIR`` (qwen-tts and transformers 4.57 installed there with ``pip --target``), the
reference package's own ``generate_custom_voice`` at the same sizes follows in the same run
(``loadtest/probes/qwen3_reference.py`` in a child interpreter).

    python3 -m loadtest.bench.tts_qwen3_gpu --json out.json            # on a CUDA machine
    python3 -m loadtest.bench.tts_qwen3_gpu --sizes 0.6b --streams 1 64 --reference-path /tmp/ref  # + reference
    python3 -m loadtest.bench.tts_qwen3_gpu --sizes 0.6b --device cpu --streams 1 --capacity 2 --micro  # dry run
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

try:
    import soxr  # noqa: F401
except ImportError:  # a bare GPU machine: the codec stages never resample (native 24 kHz), the import only
    import types

    sys.modules["soxr"] = types.ModuleType("soxr")

from loadtest.bench.kernel_profile import graph_ms
from loadtest.bench.tts_gpu import SHORT_TEXT, TEXT, hardware, log, run_streams
from realtime_gw.models.runtime import StageWorker
from realtime_gw.models.speech.qwen3.checkpoint import random_checkpoint
from realtime_gw.models.speech.qwen3.engine import Qwen3Engine, build_prompt
from realtime_gw.models.speech.qwen3.talker import Sampling
from realtime_gw.models.speech.tts_qwen3 import QWEN_ROLE_IDS, Qwen3TtsBackend

ROOT = Path(__file__).resolve().parents[2]


def graph_vs_eager(
    ck: Any, precision: str, fuse: bool, compile_predictor: bool, pipelined: bool
) -> dict[str, Any]:
    """Greedy: 12 frames of two streams (the second from the cached prompt K/V), eager vs CUDA graphs,
    give the same codes and PCM (decoder as served: ``precision``, fused SnakeBeta or not; code predictor
    compiled or not, both alike); the served form (``pipelined`` or not) against eager one-graph frames."""
    codes, pcm = [], []
    for graphs in (False, True):
        eng = Qwen3Engine(
            ck,
            2,
            max_positions=64,
            sampling=Sampling(do_sample=False, sub_do_sample=False),
            cuda_graphs=graphs,
            decoder_precision=precision,
            fuse_snake=fuse,
            compile_predictor="inductor" if compile_predictor else None,
            pipelined=pipelined and graphs,
        )
        p = build_prompt(ck, QWEN_ROLE_IDS, "ryan", "english")
        a, b = eng.alloc_prompt(p), eng.alloc_prompt(p)
        out = [eng.step([a, b], [1000 + i, 1000 + i], [False, False]) for i in range(12)]
        codes.append(np.stack([c for c, _ in out]))
        pcm.append(np.stack([x for _, x in out]).astype(np.int32))
    return {
        "graph_equals_eager_codes_frac": float((codes[0] == codes[1]).mean()),
        "graph_vs_eager_pcm_max_lsb": int(np.abs(pcm[0] - pcm[1]).max()),
        "cached_prompt_stream_equals_prefilled": bool((codes[1][:, 0] == codes[1][:, 1]).all()),
    }


@torch.no_grad()
def decoder_modes(ck: Any, batches: list[int]) -> dict[str, Any]:
    """Each decoder mode against strict float32 on the same random codes (12 frames, 8 streams: max abs
    and relative L2 waveform difference), and its step time (graph replay) per batch."""
    from realtime_gw.models.speech.qwen3.decoder import StreamingQwen3Decoder

    modes = [
        ("fp32", False),
        ("fp32", True),
        ("tf32", False),
        ("tf32", True),
        ("bf16", False),
        ("bf16", True),
    ]
    g = torch.Generator(device="cuda").manual_seed(0)
    codes = torch.randint(0, 2048, (12, 8, 16), device="cuda", generator=g)
    act8 = torch.ones(8, dtype=torch.bool, device="cuda")
    out: dict[str, Any] = {}
    ref = None
    for prec, fuse in modes:
        name = f"{prec}{'+fused' if fuse else ''}"
        dec = StreamingQwen3Decoder(ck.decoder, max(batches), prec, fuse)
        dec.reset(torch.arange(8, device="cuda"))
        wav = torch.cat([dec.step(8, codes[k], act8).clone() for k in range(12)], dim=1)
        if ref is None:
            ref = wav
        r: dict[str, Any] = {
            "max_abs_diff": float((wav - ref).abs().max()),
            "rel_l2": float((wav - ref).norm() / ref.norm()),
            "peak": float(ref.abs().max()),
        }
        for b in batches:
            c, act = codes[0, :1].expand(b, -1).contiguous(), torch.ones(b, dtype=torch.bool, device="cuda")
            r[f"step_ms_b{b}"] = graph_ms(lambda dec=dec, b=b, c=c, act=act: dec.step(b, c, act))
        out[name] = r
        log(f"decoder {name}: {json.dumps(r)}")
        del dec
        torch.cuda.empty_cache()
    return out


@torch.no_grad()
def stage_times(ck: Any, eng: Qwen3Engine, batches: list[int]) -> dict[str, float]:
    """Graph-replay ms of the talker + code predictor alone and of the whole frame, per batch (KV length
    64), with the code predictor as served and (``_uncompiled``) without torch.compile when it is compiled,
    and of a stream's start from a cached prompt vs the prompt prefill (eager, 1 stream)."""
    out: dict[str, float] = {}
    eng.d_active.zero_()  # every row inactive: replays leave the streams' state alone
    compiled = eng.talker.compiled_predictor
    for suffix, on in [("", compiled), *([("_uncompiled", False)] if compiled else [])]:
        eng.talker.compiled_predictor = on
        for b in batches:
            tok, act, ok = eng.d_tok[:b], eng.d_active[:b], eng.d_eos_ok[:b]
            out[f"talker_cp_b{b}{suffix}"] = graph_ms(
                lambda b=b, tok=tok, act=act, ok=ok: eng.talker.frame_step(b, 64, tok, act, ok)
            )
            h = torch.zeros(b, eng.talker.hidden, device="cuda", dtype=eng.talker.bos_emb.dtype)
            code0 = torch.zeros(b, dtype=torch.long, device="cuda")
            out[f"cp_b{b}{suffix}"] = graph_ms(lambda h=h, c=code0: eng.talker.predict_codes(h, c))
            out[f"frame_b{b}{suffix}"] = graph_ms(lambda b=b: eng._frame(b, 64))
    eng.talker.compiled_predictor = compiled
    p = build_prompt(ck, QWEN_ROLE_IDS, "ryan", "english")
    eng.cache_prompts([p])
    kv, idx = eng._prompt_kv[p], torch.tensor([0], device="cuda")
    n = len(p)
    text = torch.as_tensor([p.text_ids], device="cuda")
    codec = torch.as_tensor([p.codec_ids], device="cuda")
    lengths = torch.tensor([n], device="cuda")
    for name, fn in (
        ("start_cached_ms", lambda: eng.talker.load_prompt(idx, kv)),
        ("start_prefill_ms", lambda: eng.talker.prefill(idx, text, codec, lengths)),
    ):
        fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        out[name] = (time.perf_counter() - t) * 100
    return out


class GcPauses:
    """Wall time of each garbage collection (``gc.callbacks``): a full collection over the heap that
    torch.compile and transformers leave can stall every stream's step at once."""

    def __init__(self) -> None:
        self.ms: list[tuple[int, float]] = []
        self._t0 = 0.0
        gc.callbacks.append(self._hook)

    def _hook(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.ms.append((info["generation"], (time.perf_counter() - self._t0) * 1000))

    def take(self) -> dict[str, float]:
        out = {
            "gc_max_ms": max((t for _, t in self.ms), default=0.0),
            "gc_gen2_count": sum(1 for g, _ in self.ms if g == 2),
        }
        self.ms = []
        return out


GC = GcPauses()


async def bench_size(size: str, args: argparse.Namespace) -> dict[str, Any]:
    r: dict[str, Any] = {"size": size}
    dev = args.device
    dtype = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    t = time.perf_counter()
    ck = random_checkpoint(size, dev, dtype)
    r["load_s"] = time.perf_counter() - t
    tc = ck.talker_config
    r["model"] = (
        f"Qwen3-TTS-12Hz-{size} shape: talker {tc['num_hidden_layers']} layers / hidden "
        f"{tc['hidden_size']}, 5-layer code predictor, 12 Hz codec decoder (8 layers, window 72)"
    )
    prec, fuse = args.decoder_precision, not args.no_fuse_snake
    r["decoder"] = {"precision": prec, "fused_snake": fuse}
    r["compiled_code_predictor"] = args.compile_predictor
    r["pipelined"] = args.pipelined
    r["fused"] = args.fused
    if dev.startswith("cuda"):
        try:
            r["check"] = graph_vs_eager(
                ck, prec, fuse, args.compile_predictor == "on", args.pipelined == "on"
            )
            log(f"[{size}] check {r['check']}")
            if args.micro and size == args.sizes[0]:  # the decoder is the same at every talker size
                r["decoder_modes"] = decoder_modes(ck, args.micro)
        except Exception as e:
            traceback.print_exc()
            r["check_error"] = f"{type(e).__name__}: {e}"
    slots = max([*args.streams, *args.capacity])
    backend = Qwen3TtsBackend(
        checkpoint=ck,
        device=dev,
        slots=slots,
        max_positions=args.max_positions,
        decoder_precision=prec,
        fuse_snake=fuse,
        compile_predictor=args.compile_predictor == "on" and dev.startswith("cuda"),
        pipelined=args.pipelined == "on",
        # as the gateway: compiling takes the frame from the fused kernels
        fused_predictor=args.fused == "on" and args.compile_predictor == "off" and dev.startswith("cuda"),
    )
    t = time.perf_counter()
    backend.warmup()
    gc.collect()  # as the gateway does once its stages are warm (registry.freeze_heap; not imported:
    gc.freeze()  # the registry pulls the config's msgspec, which the bare GPU machine lacks)
    r.update(
        slots=slots,
        graphs=backend.engine.graph_count,
        capture_s=time.perf_counter() - t,
        text_frames=len(args.text.encode()) + backend.tail_frames,
    )
    log(f"[{size}] warm-up {r['capture_s']:.1f} s, {r['graphs']} graphs")
    if args.micro and dev.startswith("cuda"):
        r["stage_ms"] = stage_times(ck, backend.engine, args.micro)
        log(f"[{size}] stage ms {json.dumps(r['stage_ms'])}")
    worker = StageWorker(backend, device=dev, max_batch=slots, max_active=slots, max_backlog=4096)
    await worker.start(warmup=False)
    try:
        await run_streams(worker, backend, 2, SHORT_TEXT)  # type: ignore[arg-type]
        GC.take()
        r["streams"] = []
        for n in args.streams:
            s = await run_streams(worker, backend, n, args.text)  # type: ignore[arg-type]
            s.update(GC.take())
            log(f"[{size}] streams {json.dumps(s)}")
            r["streams"].append(s)
        best = 0
        for n in args.capacity:
            s = next((x for x in r["streams"] if x["streams"] == n), None) or await run_streams(
                worker,
                backend,
                n,
                args.text,  # type: ignore[arg-type]
            )
            s.update(GC.take())
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


def run_reference(args: argparse.Namespace) -> dict[str, Any]:
    """The reference package's own ``generate_custom_voice`` at the same sizes, same machine, same run: in a
    child interpreter, since it pins another transformers than ours."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.reference_path, env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "loadtest.probes.qwen3_reference", "--sizes", *args.sizes]
        cmd += ["--frames", str(args.reference_frames), "--device", args.device, "--json", out.name]
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            return {"error": done.stderr[-2000:]}
        return json.loads(Path(out.name).read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=["0.6b", "1.7b"])
    p.add_argument("--streams", type=int, nargs="+", default=[1, 64])
    p.add_argument("--capacity", type=int, nargs="+", default=[128, 256, 384, 512])
    p.add_argument("--max-positions", type=int, default=256)
    p.add_argument("--text", default=TEXT)
    p.add_argument("--device", default="cuda")
    p.add_argument("--decoder-precision", default="tf32", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--no-fuse-snake", action="store_true")
    p.add_argument(
        "--compile-predictor",
        default="off",
        choices=["on", "off"],
        help="torch.compile the code predictor's passes (CUDA; the gateway's --tts-compile)",
    )
    p.add_argument(
        "--pipelined",
        default="on",
        choices=["on", "off"],
        help="decode each frame behind the next frame's talker step (served on CUDA; the gateway's --tts-pipelined)",
    )
    p.add_argument(
        "--fused",
        default="off",
        choices=["on", "off"],
        help="the fused Triton decoder layers at the buckets where they replay faster (the gateway's --tts-fused)",
    )
    p.add_argument(
        "--micro",
        type=int,
        nargs="*",
        default=[1, 64, 256],
        help="batches for the per-stage and per-decoder-mode graph timings (none: skip)",
    )
    p.add_argument(
        "--reference-path",
        default=None,
        help="a directory with qwen-tts and its transformers 4.57 (pip --target): after our rows, "
        "loadtest.probes.qwen3_reference runs in a child interpreter with it first on PYTHONPATH, the same sizes",
    )
    p.add_argument("--reference-frames", type=int, default=150)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    r = asyncio.run(amain(args))
    if args.reference_path:
        r["reference"] = run_reference(args)
    text = json.dumps(r, indent=1, default=str)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
