"""Which FP8 prefix to serve (H200 probe): for variants of ``policy_fp8`` (which towers
and projections are quantized, Hopper's fast or exact FP8 accumulation), the error of the actions
against transformers' ``sample_actions`` (bf16, the guard's measure: relative L2 of the probe's
model-space actions), and for some, the compiled prefix's CUDA-graph replay at batch 1 and 8 against
bf16, compiled the way the server compiles it (one robot static, then the count dynamic).

**Random-init weights**, full PI0 config, bf16, 3 cameras at 224x224, 48 prompt tokens.

    python3 -m loadtest.probes.fp8_prefix --timed bf16 all all-exact --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

import realtime_gw.models.fp8 as fp8
from loadtest.bench.kernel_profile import graph_ms
from loadtest.bench.policy_gpu import load_pi0, request
from realtime_gw.models.policy.expert import Block as _Block
from realtime_gw.models.policy.pi0 import Pi0Runner, action_error, probe_requests
from realtime_gw.models.policy.pi0_functional import Cache, Pi0Functional

ROOT = Path(__file__).resolve().parents[2]

VARIANTS: dict[str, dict[str, Any]] = {
    "bf16": {"fp8": False},
    "all": {"fp8": True, "fast_accum": True},
    "all-exact": {"fp8": True, "fast_accum": False},
    "gemma-exact": {"fp8": True, "fast_accum": False, "siglip": False},
    "siglip-exact": {"fp8": True, "fast_accum": False, "gemma": False},
    "no-down-exact": {"fp8": True, "fast_accum": False, "down": False},
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build(model: Any, v: dict[str, Any]) -> Pi0Functional:
    fp8.FAST_ACCUM = v.get("fast_accum", True)
    fn = Pi0Functional(model, prefix_fp8=v["fp8"])
    if not v.get("siglip", True):
        fn.vision_blocks = [_Block(layer, False) for layer in fn.vision.encoder.layers]
    if not v.get("gemma", True):
        fn.lm_blocks = [_Block(layer, True) for layer in fn.lm.layers]
    if not v.get("down", True):
        for blk, layer in zip(fn.lm_blocks, fn.lm.layers, strict=True):
            blk.down = layer.mlp.down_proj.weight
    return fn


def error(fn: Pi0Functional, runner: Pi0Runner, probe: list[Any], ref: torch.Tensor) -> dict[str, float]:
    got = fn.sample(probe, runner.spec.num_inference_steps, runner.device)[..., : runner.spec.action_dim]
    rel, max_abs = action_error(got, ref)
    return {"rel_l2": round(rel, 5), "max_abs": round(max_abs, 4)}


def timed(fn: Pi0Functional, runner: Pi0Runner, batches: list[int]) -> dict[str, Any]:
    """The compiled prefix's graph replay per batch, compiled as served (static first, then dynamic)."""
    torch._dynamo.reset()
    compiled = torch.compile(fn.fill_prefix)
    out: dict[str, Any] = {}
    for b in batches:
        prepared = [runner.prepare(request(i)) for i in range(b)]
        batch = fn.stack(prepared, runner.device, rtc=False)
        cache = Cache(fn, b, batch.input_ids.shape[1], runner.device)
        t0 = time.perf_counter()
        with torch.no_grad():
            compiled(cache, batch)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        with torch.no_grad():
            ms = graph_ms(lambda cache=cache, batch=batch: compiled(cache, batch), reps=30)
        out[b] = {"prefix_ms": round(ms, 3), "compile_s": round(compile_s, 1)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--timed", nargs="*", default=["bf16", "all", "all-exact"], choices=list(VARIANTS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--config", default="pi0", choices=["pi0", "tiny"], help="tiny: a CPU smoke run")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    model, tok, spec = load_pi0(args.config, args.device, max(args.batches))
    runner = Pi0Runner(model, tok, spec, args.device)
    probe = [runner.prepare(r) for r in probe_requests(spec, 2)]
    ref = runner.reference_actions(probe)
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    out: dict[str, Any] = {"gpu": gpu, "torch": torch.__version__, "variants": {}}
    for name in dict.fromkeys(args.variants + args.timed):
        fn = build(model, VARIANTS[name])
        row: dict[str, Any] = {"error": error(fn, runner, probe, ref)}
        if name in args.timed:
            row["timed"] = timed(fn, runner, args.batches)
        out["variants"][name] = row
        log(f"{name}: {json.dumps(row)}")
        del fn
        torch.cuda.empty_cache()
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
