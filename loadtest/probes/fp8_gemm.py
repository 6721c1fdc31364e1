"""What FP8 GEMMs would buy PI0's prefix (H200 probe): each of the prefix's GEMM shapes,
bf16 (``torch.mm``, what the prefix runs) against FP8 e4m3 with row-wise scales (``torch._scaled_mm``,
the activation quantized per token, the weight per output channel, bf16 out), and the cost of
quantizing the activation unfused (amax, scale, cast). Summed over the layers of SigLIP So400m/14 and
Gemma 2B as PI0 configures them, at 3 cameras and 48 prompt tokens; each timed as a CUDA-graph replay
(``kernel_profile.graph_ms``). Random data; nothing is served.

    python3 -m loadtest.probes.fp8_gemm --batches 1 8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from loadtest.bench.kernel_profile import graph_ms
from realtime_gw.models.fp8 import quantize_rows
from realtime_gw.models.policy.factory import pi0_config

ROOT = Path(__file__).resolve().parents[2]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def gemm_shapes(batch: int, images: int = 3, text: int = 48) -> list[tuple[str, int, int, int, int]]:
    """(name, M, K, N, layers) of every weight GEMM in the prefix."""
    cfg = pi0_config("pi0")
    v, t = cfg.vlm_config.vision_config, cfg.vlm_config.text_config
    m_vis = batch * images * (v.image_size // v.patch_size) ** 2
    m_lm = batch * (images * (v.image_size // v.patch_size) ** 2 + text)
    d, f, nv = v.hidden_size, v.intermediate_size, v.num_hidden_layers
    h, hd, nl = t.hidden_size, t.head_dim, t.num_hidden_layers
    qkv = (t.num_attention_heads + 2 * t.num_key_value_heads) * hd
    return [
        ("siglip qkv", m_vis, d, 3 * d, nv),
        ("siglip out", m_vis, d, d, nv),
        ("siglip fc1", m_vis, d, f, nv),
        ("siglip fc2", m_vis, f, d, nv),
        ("projector", m_vis, d, h, 1),
        ("gemma qkv", m_lm, h, qkv, nl),
        ("gemma out", m_lm, t.num_attention_heads * hd, h, nl - 1),
        ("gemma gate+up", m_lm, h, 2 * t.intermediate_size, nl - 1),
        ("gemma down", m_lm, t.intermediate_size, h, nl - 1),
    ]


def probe(name: str, m: int, k: int, n: int) -> dict[str, Any]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    xq, sx = quantize_rows(x)
    wq, sw = quantize_rows(w)
    wt, swt = wq.t(), sw.t()  # column-major (K, N), scales (1, N): what _scaled_mm wants

    def fp8(fast_accum: bool = True) -> torch.Tensor:
        return torch._scaled_mm(
            xq, wt, scale_a=sx, scale_b=swt, out_dtype=torch.bfloat16, use_fast_accum=fast_accum
        )

    try:
        fp8()
    except RuntimeError as e:  # some builds refuse fast accumulation with row-wise scales
        log(f"fast accumulation refused ({e}); timing the default")
        fp8 = partial(fp8, fast_accum=False)
    ref = x @ w.t()
    err = float((fp8().float() - ref.float()).norm() / ref.float().norm())
    row = {
        "shape": [m, k, n],
        "bf16_ms": graph_ms(lambda: x @ w.t(), reps=50, warmup_runs=3),
        "fp8_ms": graph_ms(fp8, reps=50, warmup_runs=3),
        "quantize_ms": graph_ms(lambda: quantize_rows(x), reps=50, warmup_runs=3),
        "fp8_rel_l2": err,
    }
    flops = 2.0 * m * k * n
    row["bf16_tflops"] = flops / row["bf16_ms"] / 1e9
    row["fp8_tflops"] = flops / row["fp8_ms"] / 1e9
    return row


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    out: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "batches": {}}
    for b in args.batches:
        rows, total = {}, {"bf16_ms": 0.0, "fp8_ms": 0.0, "quantize_ms": 0.0}
        for name, m, k, n, layers in gemm_shapes(b):
            row = probe(name, m, k, n)
            rows[name] = row | {"layers": layers}
            for key in total:
                total[key] += layers * row[key]
            shown = {key: round(v, 4) if isinstance(v, float) else v for key, v in row.items()}
            log(f"batch {b} {name} x{layers}: {json.dumps(shown)}")
        out["batches"][b] = {"gemms": rows, "total": total}
        log(f"batch {b} prefix GEMMs: bf16 {total['bf16_ms']:.2f} ms, fp8 {total['fp8_ms']:.2f} ms "
            f"(+ {total['quantize_ms']:.2f} ms quantizing unfused)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
