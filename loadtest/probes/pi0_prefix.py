"""Where PI0's prefix (SigLIP + Gemma over the observation) spends the GPU (H200 probe).

**Random-init weights**, full PI0 config, bf16, 3 cameras at 224x224, 48 prompt tokens. Per batch: the
prefix graph's replay ms and TFLOP/s (FLOPs counted from the config: projections, MLPs and attention
products), then one eager launch of the same body under ``torch.profiler``: kernel time by kind (GEMM,
attention, norm/elementwise, copies) and the top kernels.

    python3 -m loadtest.probes.pi0_prefix --batches 1 8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from statistics import median
from typing import Any

import torch

from loadtest.bench.kernel_profile import kernels
from loadtest.bench.policy_gpu import CAMERAS, load_pi0, request
from realtime_gw.models.fused.tuning import replay_ms
from realtime_gw.models.policy.pi0_fast import FastPi0Runner

ROOT = Path(__file__).resolve().parents[2]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def prefix_flops(cfg: Any, batch: int, images: int, text: int) -> float:
    """Multiply-adds x 2 of the prefix: SigLIP over every image, then Gemma over all tokens (its last
    layer stops after K/V), attention products included."""
    v, t = cfg.vlm_config.vision_config, cfg.vlm_config.text_config
    n_img = (v.image_size // v.patch_size) ** 2
    d, f = v.hidden_size, v.intermediate_size
    vis_layer = n_img * (4 * d * d + 2 * d * f) + 2 * n_img * n_img * d
    vis = images * v.num_hidden_layers * vis_layer + images * n_img * d * t.hidden_size  # + projector
    seq = images * n_img + text
    h, hd, kv = t.hidden_size, t.head_dim, t.num_key_value_heads
    qkv = seq * h * (t.num_attention_heads + 2 * kv) * hd
    rest = seq * (t.num_attention_heads * hd * h + 3 * h * t.intermediate_size)
    attn = 2 * seq * seq * t.num_attention_heads * hd
    lm = t.num_hidden_layers * qkv + (t.num_hidden_layers - 1) * (rest + attn)
    return 2.0 * batch * (vis + lm)


def compiled_prefix(runner: FastPi0Runner, b: int, flops: float) -> dict[str, Any]:
    """The same prefix through ``torch.compile`` (inductor, static shapes): compile seconds, replay ms,
    kernels, and the largest K/V difference from the uncompiled prefix on the same inputs."""
    from realtime_gw.models.kernels import GraphCapture

    slots = runner.slots
    cache, batch = slots.stage_cache.rows(b), slots.stage.rows(b)
    slots._prefix_body(b)
    ref = [t.clone() for t in (cache.k[0], cache.k[-1], cache.v[-1])]
    fn = torch.compile(runner.fn.fill_prefix, dynamic=False)
    t0 = time.perf_counter()
    fn(cache, batch)
    torch.cuda.synchronize()
    row: dict[str, Any] = {"compile_s": round(time.perf_counter() - t0, 1)}
    got = [cache.k[0], cache.k[-1], cache.v[-1]]
    row["max_abs_diff_kv"] = max(
        float((a.float() - r.float()).abs().max()) for a, r in zip(got, ref, strict=True)
    )
    graph = GraphCapture("cuda").capture(lambda: fn(cache, batch))
    ms = replay_ms(graph, 20, median)
    row.update({"prefix_ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1)})
    row.update(kernels(lambda: fn(cache, batch)))
    return row


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--compile", action="store_true", help="also the prefix through torch.compile")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    model, tok, spec = load_pi0("pi0", "cuda", max(args.batches))
    runner = FastPi0Runner(model, tok, spec, "cuda", buckets=tuple(sorted(set(args.batches))))
    out: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "batches": {}}
    backends = torch.backends.cuda
    out["sdpa"] = {
        "flash": backends.flash_sdp_enabled(),
        "mem_efficient": backends.mem_efficient_sdp_enabled(),
        "cudnn": backends.cudnn_sdp_enabled(),
    }
    for b in args.batches:
        prepared = [runner.prepare(request(i)) for i in range(b)]
        runner.run(prepared, None)  # stages real inputs (masks included) in the staging rows
        graph = runner.slots.graph("prefix", b)
        ms = replay_ms(graph, 20, median)
        flops = prefix_flops(model.config, b, len(CAMERAS), spec.max_prompt_tokens)
        row = {
            "prefix_ms": round(ms, 3),
            "tflop": round(flops / 1e12, 3),
            "tflops": round(flops / ms / 1e9, 1),
        }
        row.update(kernels(lambda b=b: runner.slots._prefix_body(b)))
        out["batches"][b] = row
        log(f"batch {b}: {json.dumps(row)}")
        if args.compile:
            out["batches"][f"{b}_compiled"] = compiled_prefix(runner, b, flops)
            log(f"batch {b} compiled: {json.dumps(out['batches'][f'{b}_compiled'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
