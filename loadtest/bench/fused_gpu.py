"""Fused small decoders (``realtime_gw.models.fused``) against today's path, in one run that stops on time:
correctness on the device first, then speed, the fused figures next to the eager ones measured in the same
process, as the stages dispatch them (per batch bucket, the faster path, measured at warm-up).

**Random-init weights** at the published shapes (Qwen3-TTS 0.6B, full PI0): real architecture and cost.

1. ``tiles``: every tile config the fused linear layer's tuner may choose, at the Qwen3-TTS shapes of its
   gate|up (norm + SwiGLU) and down (+ residual) projections at 1, 8 and 64 rows, bf16, against torch.
2. ``qwen_check``: the code predictor's codes and whole frames' codes, fused vs eager, from the same hidden
   states and seeds: the tiny fixture and the 0.6B shape in float32 (must be equal: ``codes_equal``), the
   0.6B in bf16 (only the share of equal codes: rounding differs).
3. ``pi0_check``: PI0's velocity and its vector-Jacobian product (RTC's guidance), fused vs eager: tiny
   float32 (PI0, and π0.5 where transformers ships it) and the full model in bf16.
4. ``qwen``: Qwen3-TTS 0.6B (bf16, as served): per batch (1, 8, 16, 32, 64, 128 by default), the talker's
   layers and the code predictor eager and fused (graph replays; the stage's warm-up choice), then the
   whole frame (talker, code predictor, codec decoder: KV length 64) eager and as dispatched.
5. ``pi0``: PI0 (bf16, 3 cameras, graphs; uncompiled unless ``--pi0-compiled``): the warm-up's per-bucket
   choice (plain and RTC step, today's vs fused), then per batch (1, 4, 8) the device time of a chunk
   (prefix + 10 steps) as dispatched, plain and RTC, and today's (prefix + 10 of today's steps); the fused
   step's kernels at batch 1.
6. ``tiles_chosen``: what the tuners (linear tiles, attention query blocks and splits) chose per shape,
   every candidate's time (us), their seconds.
7. ``streams`` (while the budget allows; ``--streams``): Qwen3-TTS through a ``StageWorker`` with
   ``tts_fused`` on: step p50 and RTF at each stream count.

Every phase writes its part of ``--json`` as soon as it ends, and the batch loops after each batch.

    python3 -m loadtest.bench.fused_gpu --json $OUT/fused_gpu.json --budget-s 320     # on a CUDA machine
    TRITON_INTERPRET=1 python -m loadtest.bench.fused_gpu --device cpu --qwen-batches 1 2 --pi0-batches 1
        # the CPU dry run: tiny models, Triton's interpreter, wall-clock ms (no figure)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

try:
    import soxr  # noqa: F401
except ImportError:  # a bare GPU machine: the codec stages never resample, the import only
    import types

    sys.modules["soxr"] = types.ModuleType("soxr")

START = time.monotonic()
ROOT = Path(__file__).resolve().parents[2]
RESULTS: dict[str, Any] = {}
_PI0: dict[str, Any] = {}  # the full PI0 model, loaded once for both of its phases
QWEN_TINY = ROOT / "tests" / "fixtures" / "qwen3_tts_tiny"


class Run:
    """The run's arguments, device and deadline."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dev = args.device
        self.cuda = args.device == "cuda"
        self.end = START + args.budget_s  # from the process's start (imports included)

    def left(self) -> float:
        return self.end - time.monotonic()

    def timer(self) -> Callable[[Callable[[], object]], float]:
        """ms of one call: a CUDA graph replay on the device; wall clock on the CPU (the dry run)."""
        if self.cuda:
            from realtime_gw.models.fused.tuning import graph_ms

            return lambda body: graph_ms(body, replays=5, warm=2)
        return _wall_ms


def _wall_ms(body: Callable[[], object]) -> float:
    body()
    t = time.perf_counter()
    body()
    return (time.perf_counter() - t) * 1000


def log(msg: str) -> None:
    print(msg, flush=True)


def save(run: Run) -> None:
    if run.args.json:
        Path(run.args.json).write_text(json.dumps(RESULTS, indent=2, default=str))


def phase(name: str, run: Run, body: Callable[[], Any], needs_s: float = 0.0) -> None:
    if name in run.args.skip:
        return
    if run.left() < needs_s:
        RESULTS[name] = {"skipped": f"{run.left():.0f} s left, it needs ~{needs_s:.0f}"}
        log(f"[{name}] skipped: {RESULTS[name]['skipped']}")
        save(run)
        return
    t = time.perf_counter()
    try:
        RESULTS[name] = body()
    except Exception as e:
        traceback.print_exc()
        RESULTS[name] = {**RESULTS.get(name, {}), "error": f"{type(e).__name__}: {e}"}
    RESULTS.setdefault("phase_s", {})[name] = round(time.perf_counter() - t, 1)
    log(f"[{name}] {json.dumps(RESULTS[name], default=str)[:4000]}")
    save(run)


# -- 1. every tile config ------------------------------------------------------------------------------------
def check_tiles(run: Run) -> dict[str, Any]:
    """Every candidate config against torch in float32 from the same bf16 inputs: the largest error
    relative to the output's scale (bf16 rounding: ~1e-2 expected), per shape and config."""
    from realtime_gw.models.fused import gemm

    dt = torch.bfloat16 if run.cuda else torch.float32
    hidden, inter = (1024, 3072) if run.cuda else (40, 24)
    if not run.cuda:  # the interpreter, with the device's candidates
        gemm.INTERPRETED = False
    g = torch.Generator(device=run.dev).manual_seed(0)
    out: dict[str, Any] = {}
    try:
        for m in (1, 8, 64) if run.cuda else (1, 8, 20):
            x = torch.randn(m, hidden, generator=g, device=run.dev).to(dt)
            nw = (1 + 0.1 * torch.randn(hidden, generator=g, device=run.dev)).to(dt)
            wgu = (torch.randn(2 * inter, hidden, generator=g, device=run.dev) / hidden**0.5).to(dt)
            wd = (torch.randn(hidden, inter, generator=g, device=run.dev) / inter**0.5).to(dt)
            a = torch.randn(m, inter, generator=g, device=run.dev).to(dt)
            xn = torch.nn.functional.rms_norm(x.float(), (hidden,), nw.float(), 1e-6).to(dt).float()
            gu = xn @ wgu.float().T
            want = {"gate_up": torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:],
                    "down": x.float() + a.float() @ wd.float().T}  # fmt: skip
            calls = {
                "gate_up": (lambda t, x=x, w=wgu, nw=nw: gemm.linear(x, w, norm=nw, glu=gemm.ACT_SILU, tiles=t),
                            (m, inter, hidden)),
                "down": (lambda t, a=a, w=wd, x=x: gemm.linear(a, w, residual=x, tiles=t), (m, hidden, inter)),
            }
            for name, (call, shape) in calls.items():
                errs = {}
                for tiles in gemm.candidates(*shape):
                    try:
                        got = call(tiles).float()
                        errs[str(tiles)] = float((got - want[name]).abs().max() / want[name].abs().max())
                    except Exception as e:
                        errs[str(tiles)] = f"{type(e).__name__}: {str(e)[:120]}"
                out[f"{name}_m{m}"] = errs
    finally:
        gemm.INTERPRETED = gemm.interpreted()
    worst = [e for shape in out.values() for e in shape.values() if isinstance(e, float)]
    out["worst_rel_err"] = max(worst, default=None)
    out["configs_failed"] = sum(1 for shape in out.values() if isinstance(shape, dict) for e in shape.values() if isinstance(e, str))
    return out


# -- 2. Qwen3-TTS parity ---------------------------------------------------------------------------------------
def predictor_codes(ck: Any, do_sample: bool, frames: int, dev: str, b: int = 4) -> dict[str, Any]:
    """Eager and fused code predictors from the same inputs and seed, ``frames`` times."""
    from realtime_gw.models.speech.qwen3.talker import Qwen3TalkerRuntime, Sampling

    sampling = Sampling.from_generation(ck.generation, do_sample=do_sample, sub_do_sample=do_sample)
    eager = Qwen3TalkerRuntime(ck, b, 32, sampling)
    fused = Qwen3TalkerRuntime(ck, b, 32, sampling, fused_predictor=True)
    equal = total = 0
    first_diff = None
    emb_err = 0.0
    g = torch.Generator(device=dev).manual_seed(0)
    for f in range(frames):
        h = torch.randn(b, eager.hidden, generator=g, device=dev).to(eager.bos_emb.dtype)
        code0 = torch.randint(0, eager.vocab, (b,), generator=g, device=dev)
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


def frame_codes(ck: Any, do_sample: bool, frames: int, dev: str, b: int = 4) -> dict[str, Any]:
    """Whole frame steps (talker, codebook 0, code predictor) of eager and fused runtimes from one prompt."""
    from realtime_gw.models.speech.qwen3.talker import Qwen3TalkerRuntime, Sampling

    sampling = Sampling.from_generation(ck.generation, do_sample=do_sample, sub_do_sample=do_sample)
    g = torch.Generator(device=dev).manual_seed(1)
    prompt = torch.randint(0, 200, (b, 12), generator=g, device=dev)
    lengths = torch.arange(12 - b, 12, device=dev)
    active = torch.ones(b, dtype=torch.bool, device=dev)
    out = []
    for fused in (False, True):
        rt = Qwen3TalkerRuntime(ck, b, 64, sampling, fused_predictor=fused)
        rt.prefill(torch.arange(b, device=dev), prompt, prompt % 7, lengths)
        torch.manual_seed(5)
        with torch.no_grad():
            out.append(torch.stack([rt.frame_step(b, 12 + k + 1, prompt[:, k], active, active).clone()
                                    for k in range(frames)]))  # fmt: skip
    eq = out[0] == out[1]
    return {"codes_equal": bool(eq.all()), "equal_share": float(eq.float().mean()),
            "frames_equal": [bool(e.all()) for e in eq]}  # fmt: skip


def check_qwen(run: Run) -> dict[str, Any]:
    from realtime_gw.models.speech.qwen3.checkpoint import load_checkpoint, random_checkpoint

    out: dict[str, Any] = {}
    tiny = load_checkpoint(QWEN_TINY, run.dev, torch.float32)
    for mode, sample in (("greedy", False), ("top_k", True)):
        out[f"tiny_fp32_{mode}"] = predictor_codes(tiny, sample, 8 if run.cuda else 1, run.dev)
        out[f"tiny_fp32_{mode}_frames"] = frame_codes(tiny, sample, 4 if run.cuda else 1, run.dev)
    if not run.cuda:
        return out
    for dtype in (torch.float32, torch.bfloat16):
        ck = random_checkpoint("0.6b", "cuda", dtype)
        for mode, sample in (("greedy", False), ("top_k", True)):
            out[f"0.6b_{str(dtype)[6:]}_{mode}"] = predictor_codes(ck, sample, 4, run.dev)
            out[f"0.6b_{str(dtype)[6:]}_{mode}_frames"] = frame_codes(ck, sample, 4, run.dev)
        del ck
        torch.cuda.empty_cache()
    return out


# -- 3. PI0 parity ---------------------------------------------------------------------------------------------
def velocity_errors(fn: Any, prepared: list[Any], dev: str) -> dict[str, float]:
    """Max abs and relative L2 of the fused velocity and its VJP against the eager ones (one step at t=0.7)."""
    from realtime_gw.models.fused.pi0_expert import FusedExpert
    from realtime_gw.models.policy.pi0_functional import Cache

    device = torch.device(dev)
    batch = fn.stack(prepared, device, rtc=False)
    cache = Cache(fn, len(prepared), batch.input_ids.shape[1], device)
    with torch.no_grad():
        fn.fill_prefix(cache, batch)
    t = torch.full((len(prepared),), 0.7, device=device)
    cot = torch.randn(batch.noise.shape, device=device, dtype=batch.noise.dtype)
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


def check_pi0(run: Run) -> dict[str, Any]:
    from loadtest.bench.policy_gpu import request
    from realtime_gw.config import GatewayConfig
    from realtime_gw.models.policy.factory import load_model, policy_spec
    from realtime_gw.models.policy.pi0 import Pi0Runner
    from realtime_gw.models.policy.pi0_functional import Pi0Functional

    out: dict[str, Any] = {}
    for kind in ("pi0", "pi05"):
        try:
            config = GatewayConfig(policy=kind, policy_config="tiny", policy_device=run.dev, policy_dtype="float32")  # type: ignore[arg-type]
            model, tok, desc, _ = load_model(config)
            pi05 = kind == "pi05"
            spec = policy_spec(config, model=desc, action_horizon=model.config.chunk_size, tokenizer=tok.name,
                               state_in_prompt=pi05, max_prompt_tokens=200 if pi05 else 48)  # fmt: skip
            runner = Pi0Runner(model, tok, spec)
            prep = [runner.prepare(request(i)) for i in range(2)]
            out[f"{kind}_tiny_fp32"] = velocity_errors(Pi0Functional(model), prep, run.dev)
        except Exception as e:  # transformers 5.17 ships no π0.5
            out[f"{kind}_tiny_fp32"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    if run.cuda:
        model, tok, spec = full_pi0(run)
        prep = [Pi0Runner(model, tok, spec, "cuda").prepare(request(9))]
        out["full_bf16"] = velocity_errors(Pi0Functional(model), prep, run.dev)
    return out


def full_pi0(run: Run) -> tuple[Any, Any, Any]:
    from loadtest.bench.policy_gpu import load_pi0

    if not _PI0:
        _PI0["model"] = load_pi0("pi0", "cuda", max(run.args.pi0_batches))
    return _PI0["model"]


# -- 4. Qwen3-TTS speed ----------------------------------------------------------------------------------------
def qwen_speed(run: Run) -> dict[str, Any]:
    from realtime_gw.models.speech.qwen3.checkpoint import load_checkpoint, random_checkpoint
    from realtime_gw.models.speech.qwen3.engine import Qwen3Engine

    batches = run.args.qwen_batches
    if run.cuda:
        ck = random_checkpoint("0.6b", "cuda", torch.bfloat16)
        eng = Qwen3Engine(ck, max(batches), max_positions=256, decoder_precision="tf32", fuse_snake=True,
                          pipelined=True, fused_predictor=True)  # fmt: skip
    else:
        ck = load_checkpoint(QWEN_TINY, "cpu", torch.float32)
        eng = Qwen3Engine(ck, max(batches), max_positions=64, cuda_graphs=False, fused_predictor=True)
    fused = eng.talker.fused_predictor
    eng.d_active.zero_()  # every row inactive: timed frames leave the streams' state alone
    timer = run.timer()
    out: dict[str, Any] = RESULTS.setdefault("qwen", {})
    for b in batches:
        if run.left() < 25:
            out[f"b{b}"] = {"skipped": f"{run.left():.0f} s left"}
            break
        t = time.perf_counter()
        parts = fused.choose([b], 64, timer if not run.cuda else None)[b]
        chosen = {p: fused.on(p, b) for p in ("talker", "predictor")}
        with torch.no_grad():
            fused.paths.update({("talker", b): False, ("predictor", b): False})
            frame_eager = timer(lambda b=b: eng._frame(b, 64))
            fused.paths.update({(p, b): on for p, on in chosen.items()})
            frame_dispatched = timer(lambda b=b: eng._frame(b, 64))
        r = {"parts": parts, "frame_ms": {"eager": round(frame_eager, 3), "dispatched": round(frame_dispatched, 3)},
             "seconds": round(time.perf_counter() - t, 1)}  # fmt: skip
        r["rtf_frame_eager"], r["rtf_frame_dispatched"] = round(frame_eager / 80, 3), round(frame_dispatched / 80, 3)
        out[f"b{b}"] = r
        log(f"[qwen b{b}] {json.dumps(r)}")
        save(run)
    if run.cuda and run.left() > 20:  # where the fused code predictor's time goes at batch 1 (profiled)
        from loadtest.bench.kernel_profile import kernels

        h = torch.zeros(1, eng.talker.hidden, device="cuda", dtype=torch.bfloat16)
        code0 = torch.zeros(1, dtype=torch.long, device="cuda")
        with torch.no_grad():
            out["cp_kernels_b1_fused"] = kernels(lambda: fused(h, code0))
    return out


# -- 5. PI0 speed ----------------------------------------------------------------------------------------------
def pi0_speed(run: Run) -> dict[str, Any]:
    from loadtest.bench.kernel_profile import kernels
    from loadtest.bench.policy_gpu import device_time, request
    from realtime_gw.models.policy.pi0_fast import FastPi0Runner
    batches = run.args.pi0_batches
    out: dict[str, Any] = RESULTS.setdefault("pi0", {})
    if not run.cuda:  # the dry run: tiny, eager chunks, wall clock
        from realtime_gw.config import GatewayConfig
        from realtime_gw.models.policy.factory import load_model, policy_spec

        config = GatewayConfig(policy="pi0", policy_config="tiny", policy_device="cpu", policy_dtype="float32")  # type: ignore[arg-type]
        model, tok, desc, _ = load_model(config)
        spec = policy_spec(config, model=desc, action_horizon=model.config.chunk_size, tokenizer=tok.name,
                           max_prompt_tokens=48)  # fmt: skip
        for name, on in (("eager", False), ("fused", True)):
            runner = FastPi0Runner(model, tok, spec, "cpu", buckets=tuple(batches), fused_expert=on)
            prepared = [runner.prepare(request(i)) for i in range(max(batches))]
            out[f"{name}_chunk_wall_ms"] = _wall_ms(lambda r=runner, p=prepared: r.run(p, 2))
        return out
    model, tok, spec = full_pi0(run)
    t = time.perf_counter()
    runner = FastPi0Runner(model, tok, spec, "cuda", buckets=tuple(batches), cuda_graphs=True, fused_expert=True,
                           compile_graphs=run.args.pi0_compiled)  # fmt: skip
    runner.warmup()
    out["warmup_s"] = round(time.perf_counter() - t, 1)
    out["warmup_report"] = runner.warmup_report
    save(run)
    steps = spec.num_inference_steps
    slots = runner.slots
    for b in batches:
        if run.left() < 10:
            out[f"b{b}"] = {"skipped": f"{run.left():.0f} s left"}
            break
        size = next(s for s in runner.buckets if s >= b)
        r: dict[str, Any] = {}
        for kind in ("plain", "rtc"):
            timed = device_time(runner, b, rtc=kind == "rtc")
            ms = slots.fused_ms.get((kind, size), {})
            r[kind] = {"dispatched": {k: round(v, 3) for k, v in timed.items()}, "fused": slots.fused_on.get((kind, size)),
                       "step_ms": ms}  # fmt: skip
            if "today" in ms and "prefix_ms" in timed:
                r[kind]["today_chunk_ms"] = round(timed["prefix_ms"] + steps * ms["today"], 3)
            if "fused" in ms and "prefix_ms" in timed:
                r[kind]["fused_chunk_ms"] = round(timed["prefix_ms"] + steps * ms["fused"], 3)
        out[f"b{b}"] = r
        log(f"[pi0 b{b}] {json.dumps(r)}")
        save(run)
    if run.left() > 20:  # where the fused step's time goes, and today's, at batch 1 (eager launches, profiled)
        size = runner.buckets[0]
        for name, on in (("fused", True), ("today", False)):
            keep = slots.fused_on.get(("plain", size))
            slots.fused_on[("plain", size)] = on
            out[f"step_kernels_b{size}_{name}"] = kernels(slots._step_body("plain", size))
            slots.fused_on[("plain", size)] = keep  # type: ignore[assignment]
    del runner, model
    _PI0.clear()
    gc.collect()
    torch.cuda.empty_cache()
    return out


# -- 7. streams ------------------------------------------------------------------------------------------------
async def streams(run: Run) -> dict[str, Any]:
    from loadtest.bench.tts_gpu import TEXT, run_streams
    from realtime_gw.models.runtime import StageWorker
    from realtime_gw.models.speech.qwen3.checkpoint import random_checkpoint
    from realtime_gw.models.speech.tts_qwen3 import Qwen3TtsBackend

    ck = random_checkpoint("0.6b", "cuda", torch.bfloat16)
    slots = max(run.args.streams)
    backend = Qwen3TtsBackend(checkpoint=ck, device="cuda", slots=slots, max_positions=256, decoder_precision="tf32",
                              fuse_snake=True, pipelined=True, fused_predictor=True)  # fmt: skip
    t = time.perf_counter()
    backend.warmup()
    gc.collect()
    gc.freeze()
    r: dict[str, Any] = {"warmup_s": round(time.perf_counter() - t, 1), "warmup_report": backend.warmup_report}
    worker = StageWorker(backend, device="cuda", max_batch=slots, max_active=slots, max_backlog=4096)
    await worker.start(warmup=False)
    try:
        await run_streams(worker, backend, 2, "Turn on the kitchen lights, please.")  # type: ignore[arg-type]
        r["streams"] = [await run_streams(worker, backend, n, TEXT) for n in run.args.streams]  # type: ignore[arg-type]
    finally:
        await worker.stop()
        gc.unfreeze()
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--budget-s", type=float, default=320.0, help="skip phases past this (from the start)")
    p.add_argument("--qwen-batches", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128])
    p.add_argument("--pi0-batches", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--pi0-compiled", action="store_true", help="today's PI0 step compiled (adds ~100 s a bucket)")
    p.add_argument("--streams", type=int, nargs="*", default=[1, 64], help="stream counts of the last phase")
    p.add_argument("--skip", default="", help="comma list of: tiles, qwen_check, pi0_check, qwen, pi0, streams")
    args = p.parse_args()
    args.skip = set(filter(None, args.skip.split(",")))
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        p.error("--device cpu runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1")
    run = Run(args)
    from loadtest.bench.tts_gpu import hardware
    from realtime_gw.models.fused import attention as fused_attention
    from realtime_gw.models.fused import gemm, tuning

    RESULTS.update(hardware=hardware(), date=time.strftime("%Y-%m-%d %H:%M"), command=" ".join(sys.argv))
    phase("tiles", run, lambda: check_tiles(run))
    tuning.TUNING = False  # parity with each shape's first config: fewer compiles; the tiles phase checked them all
    phase("qwen_check", run, lambda: check_qwen(run), needs_s=60 if run.cuda else 0)
    phase("pi0_check", run, lambda: check_pi0(run), needs_s=40 if run.cuda else 0)
    tuning.TUNING = True
    gemm.TUNER.chosen.clear()  # the speed phases tune every shape they run
    fused_attention.ATTENTION_TUNER.chosen.clear()
    phase("qwen", run, lambda: qwen_speed(run), needs_s=40)
    gc.collect()
    if run.cuda:
        torch.cuda.empty_cache()
    phase("pi0", run, lambda: pi0_speed(run), needs_s=90 if run.cuda else 0)
    RESULTS["tiles_chosen"] = {"linear": gemm.TUNER.report(), "attention": fused_attention.ATTENTION_TUNER.report()}
    save(run)
    if run.cuda and args.streams:
        phase("streams", run, lambda: asyncio.run(streams(run)), needs_s=120)
    log(summary())


def summary() -> str:
    lines = ["", "| figure | eager | fused as dispatched | parts fused |", "|---|---|---|---|"]
    for key, r in RESULTS.get("qwen", {}).items():
        if "frame_ms" in r:
            f = r["frame_ms"]
            on = [p for p, v in r["parts"].items() if v["chosen"] == "fused"]
            cp = r["parts"]["predictor"]["ms"]
            lines.append(f"| Qwen3-TTS 0.6B frame, batch {key[1:]} (ms) | {f['eager']} | {f['dispatched']} | {', '.join(on) or 'none'} |")
            lines.append(f"| Qwen3-TTS 0.6B code predictor, batch {key[1:]} (ms) | {cp.get('eager')} | {cp.get('fused')} | |")
    for key, r in RESULTS.get("pi0", {}).items():
        if not key.startswith("b") or "plain" not in r:
            continue
        for kind in ("plain", "rtc"):
            k = r[kind]
            lines.append(f"| PI0 chunk {kind}, batch {key[1:]} (device ms) | {k.get('today_chunk_ms')} | "
                         f"{k['dispatched'].get('chunk_ms')} (fused step alone: {k.get('fused_chunk_ms')}) | {k['fused']} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
