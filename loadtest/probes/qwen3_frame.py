"""Where a Qwen3-TTS frame's GPU time goes, and what ``torch.compile`` of its parts does to it (H200 probe).

**Random-init weights** at the published 0.6B shape. Per variant: graph-replay ms of the code predictor
(``predict_codes``) and of talker + predictor (``frame_step``) at each batch: uncompiled (``eager``) and with
``torch.compile`` of each predictor pass (``compiled``, served on CUDA), the kernel count and summed kernel
time of one call (``torch.profiler``), first-call (compile) seconds, and whether the compiled codes equal
``eager``'s (greedy, and sampled under one seed).

    python3 -m loadtest.probes.qwen3_frame --batches 1 64 256 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from loadtest.bench.kernel_profile import graph_ms, kernels
from realtime_gw.models.speech.qwen3.checkpoint import random_checkpoint
from realtime_gw.models.speech.qwen3.talker import Qwen3TalkerRuntime, Sampling

ROOT = Path(__file__).resolve().parents[2]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--variants", nargs="+", default=["eager", "compiled"])
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    ck = random_checkpoint(args.size, "cuda", torch.bfloat16)
    slots = max(args.batches)
    greedy = Sampling(do_sample=False, sub_do_sample=False)
    sampled = Sampling.from_generation(ck.generation)
    rt = Qwen3TalkerRuntime(ck, slots, 128, sampled)
    rt_g = Qwen3TalkerRuntime(ck, slots, 128, greedy)
    out: dict[str, Any] = {"size": args.size, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    gen = torch.Generator(device="cuda").manual_seed(0)
    hs = {
        b: torch.randn(b, rt.hidden, device="cuda", dtype=torch.bfloat16, generator=gen) for b in args.batches
    }
    c0 = {b: torch.randint(0, 2048, (b,), device="cuda", generator=gen) for b in args.batches}
    tok = {b: torch.randint(0, 1000, (b,), device="cuda", generator=gen) for b in args.batches}
    act = {b: torch.zeros(b, dtype=torch.bool, device="cuda") for b in args.batches}
    ok = {b: torch.ones(b, dtype=torch.bool, device="cuda") for b in args.batches}
    ref_codes: dict[tuple[str, int], torch.Tensor] = {}

    for variant in args.variants:
        res: dict[str, Any] = {}
        out[variant] = res
        try:
            t0 = time.perf_counter()
            if variant == "eager":  # the two-GEMM attention (the CPU's form), uncompiled
                r, rg = rt, rt_g
            elif variant == "compiled":  # inductor over each pass
                r = Qwen3TalkerRuntime(ck, slots, 128, sampled, "inductor")
                rg = Qwen3TalkerRuntime(ck, slots, 128, greedy, "inductor")
            else:
                raise ValueError(variant)
            cp, cpg, frame = r.predict_codes, rg.predict_codes, r.frame_step
            for b in args.batches:
                t = time.perf_counter()
                codes_g = cpg(hs[b], c0[b])[0].clone()
                torch.manual_seed(1)
                codes_s = cp(hs[b], c0[b])[0].clone()
                torch.cuda.synchronize()
                res[f"first_call_s_b{b}"] = round(time.perf_counter() - t, 1)
                if variant == "eager":
                    ref_codes[("g", b)], ref_codes[("s", b)] = codes_g, codes_s
                else:
                    res[f"greedy_equal_b{b}"] = float((codes_g == ref_codes[("g", b)]).float().mean())
                    res[f"sampled_equal_b{b}"] = float((codes_s == ref_codes[("s", b)]).float().mean())
                res[f"cp_ms_b{b}"] = round(graph_ms(lambda b=b, cp=cp: cp(hs[b], c0[b])), 3)
                res[f"cp_prof_b{b}"] = kernels(lambda b=b, cp=cp: cp(hs[b], c0[b]))
                step = lambda b=b, frame=frame: frame(b, 64, tok[b], act[b], ok[b])  # noqa: E731
                res[f"frame_ms_b{b}"] = round(graph_ms(step), 3)
                res[f"frame_prof_b{b}"] = kernels(step)
                log(f"{variant} b={b}: {json.dumps({k: v for k, v in res.items() if k.endswith(f'b{b}')})}")
            res["total_s"] = round(time.perf_counter() - t0, 1)
        except Exception as e:  # noqa: BLE001 - a probe: record and go on to the next variant
            res["error"] = f"{type(e).__name__}: {e}"[:2000]
            traceback.print_exc()
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
