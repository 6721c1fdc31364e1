"""Fused small decoders (``realtime_gw.models.fused``) vs today's path, one run: correctness on CUDA first,
then speed, each fused figure next to the unfused one measured in the same process.

**Random-init weights** at the published shapes (Qwen3-TTS 0.6B, full PI0): real architecture and cost.

1. checks (CUDA): the Qwen3-TTS code predictor's codes, fused vs eager (``tts_fused`` also runs the
   talker's layers fused; the served frame's figures below include both), from the same hidden states and
   seeds: the tiny fixture and the 0.6B shape in float32 (must be equal: ``codes_equal``), and the 0.6B
   in bf16 (rounding differs, so only the share of equal codes); PI0's velocity and its
   vector-Jacobian product (RTC's guidance), fused vs eager, tiny in float32 and full in bf16.
2. Qwen3-TTS 0.6B as served (bf16, pipelined, graphs) with ``tts_fused`` off and on: graph-replay ms of
   the code predictor and of the whole frame at batch 1 and 64, and streams through a ``StageWorker``
   (``tts_gpu.run_streams``): step p50 at 1 stream, RTF at 64.
3. PI0 (bf16, 3 cameras, batch 1 bucket, graphs) with ``policy_fused`` off (uncompiled graphs) and on:
   device time of a chunk's graph replays (prefix + 10 steps), plain and RTC, and the actions' relative
   L2 distance between the two; then, while the deadline allows, the compiled step (today's default).

Every phase writes its part of ``--json`` as soon as it ends (a run cut short keeps what it measured).

    python3 -m loadtest.bench.fused_gpu --json $OUT/fused_gpu.json      # on a CUDA machine
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

try:
    import soxr  # noqa: F401
except ImportError:  # a bare GPU machine: the codec stages never resample, the import only
    import types

    sys.modules["soxr"] = types.ModuleType("soxr")

from loadtest.bench.kernel_profile import kernels
from loadtest.bench.tts_gpu import TEXT, hardware, log, run_streams

ROOT = Path(__file__).resolve().parents[2]
RESULTS: dict[str, Any] = {}


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def save(args: argparse.Namespace) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(RESULTS, indent=2, default=str))


def phase(name: str, args: argparse.Namespace, body: Callable[[], Any]) -> None:
    t = time.perf_counter()
    try:
        RESULTS[name] = body()
    except Exception as e:
        traceback.print_exc()
        RESULTS[name] = {**RESULTS.get(name, {}), "error": f"{type(e).__name__}: {e}"}
    RESULTS.setdefault("phase_s", {})[name] = round(time.perf_counter() - t, 1)
    log(f"[{name}] {json.dumps(RESULTS[name], default=str)}")
    save(args)


# -- 1. checks ----------------------------------------------------------------------------------------------
def predictor_codes(ck: Any, do_sample: bool, frames: int, b: int = 4) -> dict[str, Any]:
    """Eager and fused code predictors from the same inputs and seed, ``frames`` times."""
    from realtime_gw.models.speech.qwen3.talker import Qwen3TalkerRuntime, Sampling

    sampling = Sampling.from_generation(ck.generation, do_sample=do_sample, sub_do_sample=do_sample)
    eager = Qwen3TalkerRuntime(ck, b, 32, sampling)
    fused = Qwen3TalkerRuntime(ck, b, 32, sampling, fused_predictor=True)
    equal = total = 0
    first_diff = None
    emb_err = 0.0
    g = torch.Generator(device="cuda").manual_seed(0)
    for f in range(frames):
        h = torch.randn(b, eager.hidden, generator=g, device="cuda", dtype=eager.bos_emb.dtype)
        code0 = torch.randint(0, eager.vocab, (b,), generator=g, device="cuda")
        torch.manual_seed(f)
        want, want_sum = eager.predict_codes(h, code0)
        torch.manual_seed(f)
        got, got_sum = fused.predict_codes(h, code0)
        eq = got == want
        equal += int(eq.sum())
        total += eq.numel()
        if first_diff is None and not bool(eq.all()):
            first_diff = f
        emb_err = max(emb_err, float((got_sum.float() - want_sum.float()).abs().max()))
    return {"codes_equal": equal == total, "equal_share": equal / total, "codes": total,
            "first_frame_differing": first_diff, "emb_sum_max_abs": emb_err}  # fmt: skip


def frame_codes(ck: Any, do_sample: bool, frames: int, b: int = 4) -> dict[str, Any]:
    """Whole frame steps (talker, codebook 0, code predictor) of eager and fused runtimes from one prompt."""
    from realtime_gw.models.speech.qwen3.talker import Qwen3TalkerRuntime, Sampling

    sampling = Sampling.from_generation(ck.generation, do_sample=do_sample, sub_do_sample=do_sample)
    g = torch.Generator(device="cuda").manual_seed(1)
    prompt = torch.randint(0, 200, (b, 12), generator=g, device="cuda")
    lengths = torch.arange(12 - b, 12, device="cuda")
    active = torch.ones(b, dtype=torch.bool, device="cuda")
    out = []
    for fused in (False, True):
        rt = Qwen3TalkerRuntime(ck, b, 64, sampling, fused_predictor=fused)
        rt.prefill(torch.arange(b, device="cuda"), prompt, prompt % 7, lengths)
        torch.manual_seed(5)
        with torch.no_grad():
            out.append(torch.stack([rt.frame_step(b, 12 + k + 1, prompt[:, k], active, active).clone()
                                    for k in range(frames)]))  # fmt: skip
    eq = out[0] == out[1]
    per_frame = [bool(e.all()) for e in eq]
    return {"codes_equal": bool(eq.all()), "equal_share": float(eq.float().mean()), "frames_equal": per_frame}


def check_qwen(args: argparse.Namespace) -> dict[str, Any]:
    from realtime_gw.models.speech.qwen3.checkpoint import load_checkpoint, random_checkpoint

    out: dict[str, Any] = {}
    tiny = load_checkpoint(ROOT / "tests" / "fixtures" / "qwen3_tts_tiny", "cuda", torch.float32)
    for mode, sample in (("greedy", False), ("top_k", True)):
        out[f"tiny_fp32_{mode}"] = predictor_codes(tiny, sample, 8)
    for dtype in (torch.float32, torch.bfloat16):
        ck = random_checkpoint("0.6b", "cuda", dtype)
        for mode, sample in (("greedy", False), ("top_k", True)):
            out[f"0.6b_{str(dtype)[6:]}_{mode}"] = predictor_codes(ck, sample, 4)
            out[f"0.6b_{str(dtype)[6:]}_{mode}_frames"] = frame_codes(ck, sample, 4)
        del ck
        torch.cuda.empty_cache()
    return out


def velocity_errors(fn: Any, prepared: list[Any]) -> dict[str, float]:
    """Max abs and relative L2 of the fused velocity and its VJP against the eager ones (one step at t=0.7)."""
    from realtime_gw.models.fused.pi0_expert import FusedExpert
    from realtime_gw.models.policy.pi0_functional import Cache

    batch = fn.stack(prepared, torch.device("cuda"), rtc=False)
    cache = Cache(fn, len(prepared), batch.input_ids.shape[1], torch.device("cuda"))
    with torch.no_grad():
        fn.fill_prefix(cache, batch)
    t = torch.full((len(prepared),), 0.7, device="cuda")
    cot = torch.randn(batch.noise.shape, device="cuda", dtype=batch.noise.dtype)
    res = []
    for velocity in (fn.velocity, FusedExpert(fn).velocity):
        x = batch.noise.detach().clone().requires_grad_(True)
        v = velocity(cache, x, t, batch.state)
        (g,) = torch.autograd.grad(v, x, grad_outputs=cot)
        res.append((v.detach().float(), g.float()))
    (v0, g0), (v1, g1) = res
    rel = lambda a, b: float((a - b).norm() / b.norm().clamp(min=1e-12))  # noqa: E731
    return {"velocity_max_abs": float((v1 - v0).abs().max()), "velocity_rel_l2": rel(v1, v0),
            "vjp_max_abs": float((g1 - g0).abs().max()), "vjp_rel_l2": rel(g1, g0)}  # fmt: skip


def check_pi0_tiny(args: argparse.Namespace) -> dict[str, Any]:
    from loadtest.bench.policy_gpu import request
    from realtime_gw.config import GatewayConfig
    from realtime_gw.models.policy.factory import load_model, policy_spec
    from realtime_gw.models.policy.pi0 import Pi0Runner
    from realtime_gw.models.policy.pi0_functional import Pi0Functional

    out = {}
    for kind in ("pi0", "pi05"):
        config = GatewayConfig(
            policy=kind, policy_config="tiny", policy_device="cuda", policy_dtype="float32"
        )  # type: ignore[arg-type]
        model, tok, desc, _ = load_model(config)
        pi05 = kind == "pi05"
        spec = policy_spec(config, model=desc, action_horizon=model.config.chunk_size, tokenizer=tok.name,
                           state_in_prompt=pi05, max_prompt_tokens=200 if pi05 else 48)  # fmt: skip
        runner = Pi0Runner(model, tok, spec)
        out[f"{kind}_tiny_fp32"] = velocity_errors(
            Pi0Functional(model), [runner.prepare(request(i)) for i in range(2)]
        )
    return out


# -- 2. Qwen3-TTS 0.6B as served -------------------------------------------------------------------------------
async def qwen_speed(args: argparse.Namespace, fused: bool) -> dict[str, Any]:
    from loadtest.bench.tts_qwen3_gpu import stage_times
    from realtime_gw.models.runtime import StageWorker
    from realtime_gw.models.speech.qwen3.checkpoint import random_checkpoint
    from realtime_gw.models.speech.tts_qwen3 import Qwen3TtsBackend

    ck = random_checkpoint("0.6b", "cuda", torch.bfloat16)
    slots = max(args.streams)
    backend = Qwen3TtsBackend(checkpoint=ck, device="cuda", slots=slots, max_positions=256,
                              decoder_precision="tf32", fuse_snake=True, pipelined=True, fused_predictor=fused)  # fmt: skip
    t = time.perf_counter()
    backend.warmup()
    gc.collect()
    gc.freeze()
    r: dict[str, Any] = {
        "fused": fused,
        "warmup_s": time.perf_counter() - t,
        "graphs": backend.engine.graph_count,
    }
    times = stage_times(ck, backend.engine, [1, max(args.streams)])
    r["stage_ms"] = {k: v for k, v in times.items() if k.startswith(("cp_", "frame_", "talker_cp_"))}
    talker = backend.engine.talker
    h = torch.zeros(1, talker.hidden, device="cuda", dtype=talker.bos_emb.dtype)
    code0 = torch.zeros(1, dtype=torch.long, device="cuda")
    r["cp_kernels_b1"] = kernels(lambda: talker.predict_codes(h, code0))["kernels"]
    if fused:  # other GEMV tiles for the code predictor at batch 1 (for tuning; the default is the first)
        from loadtest.bench.kernel_profile import graph_ms
        from realtime_gw.models.fused import ops

        default = (ops.GEMV_BLOCK_N, ops.GEMV_BLOCK_K)
        r["cp_b1_gemv_tiles_ms"] = {}
        for tiles in (default, (4, 512), (8, 512), (16, 256), (16, 128)):
            ops.GEMV_BLOCK_N, ops.GEMV_BLOCK_K = tiles
            r["cp_b1_gemv_tiles_ms"][f"{tiles[0]}x{tiles[1]}"] = graph_ms(
                lambda: talker.predict_codes(h, code0)
            )
        ops.GEMV_BLOCK_N, ops.GEMV_BLOCK_K = default
    worker = StageWorker(backend, device="cuda", max_batch=slots, max_active=slots, max_backlog=4096)
    await worker.start(warmup=False)
    try:
        await run_streams(worker, backend, 2, "Turn on the kitchen lights, please.")  # type: ignore[arg-type]
        r["streams"] = [await run_streams(worker, backend, n, TEXT) for n in args.streams]  # type: ignore[arg-type]
    finally:
        await worker.stop()
    del backend, worker, ck
    gc.unfreeze()
    gc.collect()
    torch.cuda.empty_cache()
    return r


# -- 3. PI0 ---------------------------------------------------------------------------------------------------
def pi0_speed(args: argparse.Namespace, deadline: Deadline) -> dict[str, Any]:
    from loadtest.bench.policy_gpu import device_time, load_pi0, request
    from realtime_gw.models.policy.pi0_fast import FastPi0Runner
    from realtime_gw.records.policy import RtcGuide

    model, tok, spec = load_pi0("pi0", "cuda", 1)
    h, dim = spec.action_horizon, spec.action_dim
    guide = RtcGuide(np.random.default_rng(0).standard_normal((h // 2, dim)).astype(np.float32), 5, h // 2)
    out: dict[str, Any] = RESULTS.setdefault("pi0", {})  # filled as it goes: a run cut short keeps it
    actions: dict[str, list[np.ndarray]] = {}
    forms = [("uncompiled", {"fused_expert": False}), ("fused", {"fused_expert": True})]
    forms.append(("compiled", {"fused_expert": False, "compile_graphs": True}))
    for name, kw in forms:
        if name == "compiled" and deadline.left() < args.compile_reserve_s:
            out[name] = {
                "skipped": f"{deadline.left():.0f} s left, the compile needs ~{args.compile_reserve_s:.0f}"
            }
            continue
        t = time.perf_counter()
        runner = FastPi0Runner(model, tok, spec, "cuda", buckets=(1,), cuda_graphs=True, **kw)
        runner.warmup()
        r: dict[str, Any] = {"warmup_s": time.perf_counter() - t, "report": runner.warmup_report}
        r["plain"] = device_time(runner, 1)
        r["step_kernels"] = kernels(runner.slots._step_body("plain", 1, name == "compiled"))["kernels"]
        r["rtc"] = device_time(runner, 1, rtc=True)
        prepared = [runner.prepare(request(7)), runner.prepare(request(8, rtc=guide))]
        actions[name] = [runner.run([p], None)[0] for p in prepared]
        out[name] = r
        compare_actions(out, actions, name)
        log(f"[pi0 {name}] {json.dumps(r, default=str)}")
        save(args)
        if name == "fused":  # the full model's velocity and VJP, fused vs eager (bf16), before the compile
            try:
                from realtime_gw.models.policy.pi0_functional import Pi0Functional

                prep = [_prepare(model, tok, spec, request(9))]
                out["full_bf16_velocity"] = velocity_errors(Pi0Functional(model), prep)
            except Exception as e:  # informational only
                out["full_bf16_velocity"] = {"error": f"{type(e).__name__}: {e}"}
            save(args)
        del runner
        torch.cuda.empty_cache()
    return out


def compare_actions(out: dict[str, Any], actions: dict[str, list[np.ndarray]], name: str) -> None:
    """The ``name`` form's actions (plain, RTC) against the uncompiled form's: relative L2 and max |diff|."""
    from realtime_gw.models.policy.pi0 import action_error

    base = actions.get("uncompiled")
    if base is None or name not in actions:
        return
    for kind, a, b in zip(("plain", "rtc"), actions[name], base, strict=True):
        err, max_abs = action_error(torch.from_numpy(a), torch.from_numpy(b))
        out[name][f"{kind}_vs_uncompiled"] = {"rel_l2": err, "max_abs": max_abs}


def _prepare(model: Any, tok: Any, spec: Any, req: Any) -> Any:
    from realtime_gw.models.policy.pi0 import Pi0Runner

    return Pi0Runner(model, tok, spec, "cuda").prepare(req)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None)
    p.add_argument("--streams", type=int, nargs="+", default=[1, 64])
    p.add_argument("--deadline-s", type=float, default=380.0, help="skip the optional phases past this")
    p.add_argument("--compile-reserve-s", type=float, default=150.0, help="time the compiled PI0 step needs")
    p.add_argument("--skip", default="", help="comma list of: qwen_check, pi0_check, qwen, pi0")
    args = p.parse_args()
    deadline = Deadline(args.deadline_s)
    skip = set(filter(None, args.skip.split(",")))
    RESULTS.update(hardware=hardware(), date=time.strftime("%Y-%m-%d"), command=" ".join(sys.argv))
    if "qwen_check" not in skip:
        phase("qwen_check", args, lambda: check_qwen(args))
    if "pi0_check" not in skip:
        phase("pi0_check", args, lambda: check_pi0_tiny(args))
    if "qwen" not in skip:
        for fused in (False, True):
            phase(
                f"qwen_{'fused' if fused else 'today'}",
                args,
                lambda fused=fused: asyncio.run(qwen_speed(args, fused)),
            )
    if "pi0" not in skip:
        phase("pi0", args, lambda: pi0_speed(args, deadline))
    log(summary())


def summary() -> str:
    lines = ["", "| figure | today | fused |", "|---|---|---|"]
    q0, q1 = RESULTS.get("qwen_today", {}), RESULTS.get("qwen_fused", {})
    for key, label in (("cp_b1", "code predictor, batch 1 (ms)"), ("frame_b1", "frame, batch 1 (ms)"),
                       ("cp_b64", "code predictor, batch 64 (ms)"), ("frame_b64", "frame, batch 64 (ms)")):  # fmt: skip
        a, b = q0.get("stage_ms", {}).get(key), q1.get("stage_ms", {}).get(key)
        lines.append(f"| Qwen3-TTS 0.6B {label} | {a} | {b} |")
    for i, label in ((0, "1 stream: step p50 (ms)"), (-1, "RTF p50 at the most streams")):
        key = "step_p50_ms" if i == 0 else "rtf_p50"
        a = (q0.get("streams") or [{}])[i].get(key)
        b = (q1.get("streams") or [{}])[i].get(key)
        lines.append(f"| Qwen3-TTS 0.6B {label} | {a} | {b} |")
    pi0 = RESULTS.get("pi0", {})
    for name in ("uncompiled", "compiled", "fused"):
        r = pi0.get(name, {})
        lines.append(f"| PI0 batch 1 chunk device ms ({name}): plain / RTC | {r.get('plain', {}).get('chunk_ms')} "
                     f"| {r.get('rtc', {}).get('chunk_ms')} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
