"""GPU speech-to-speech stage (``--s2s moshi``): Moshi at the published 7B shape, every conversation one
batched 80 ms step.

**Random-init weights** (real architecture and cost; its speech and text are noise): the 32-layer temporal
transformer (dim 4096, 3000-frame ring KV per slot) and the 6-layer per-step depformer in bfloat16, the
Mimi encoder and decoder (8 codebooks) in float32; no network, nothing downloaded. One step = one frame
for every live conversation: Mimi encode, temporal transformer, text sample, 8 depformer sub-steps with
their samples, Mimi decode; a CUDA graph per (batch, KV-length) bucket.

Prints JSON (also to ``--json``):
- ``check``: on the device, CUDA graphs vs eager (three conversations joining at steps 0, 2, 5, greedy
  and sampled), and the tiny shape on the device vs on the CPU (greedy, float32): fractions of equal
  tokens (text + the model's codes) and the largest PCM difference;
- ``warmup``: the stage's warm-up as the gateway runs it (``MoshiBackend.warmup``: every (batch, length)
  bucket's CUDA graph captured, then a short conversation): graphs, capture seconds, the memory the
  captures reserved (``graph_memory_gib``), the batch buckets;
- ``steps``: per batch (``--batches``) x KV fill (``--fills``: the fraction of the 3000-frame context the
  conversations have seen; 1.0 = past the whole context, the ring full) the host-measured step time
  (upload, replay, download, sync) p50 / p99 / max, and the batch bucket it ran in (``bucket``: the
  stage's, powers of two to 32 then 40, 48, 56, 64; ``--batch-buckets`` as ``s2s_batch_buckets``, e.g.
  ``1 2 4 8 16 32 64`` for powers of two alone, whose 48 runs as 64);
- ``largest_batch``: the largest batch whose p99 step at the fullest fill stays <= 80 ms and <= 40 ms;
- ``session_start``: with ``batch - 1`` full-context conversations live, a new one opened: open + its
  first step (silence: the model's acoustic delay) and the second (its first voiced frame), in ms;
- ``cancel``: the silence switch (``S2sSilence``, response.cancel / barge-in) set between steps: time
  until the step that returns the forced-silent frame ends (one step: the next frame out is silent).

``--config personaplex`` (``personaplex-tiny`` for a dry run): PersonaPlex at the 7B shape (16 depformer
sub-steps, of which a step runs the model's 8; the user's frame read one step later). Every conversation
opens with its prompt (``--voice-frames`` frames of voice codes, ``--persona-tokens`` tokens of persona,
the 12 silence frames) prefilled in one pass. Adds to ``check`` the prefill against the same prompt stepped
one position at a time (the largest K/V difference, the fraction of equal greedy tokens of the steps
after it), at the tiny shape in float32 and at the 7B shape in bfloat16; ``session_start`` then times the
prefill itself and open + prefill + the first step, with ``batch - 1`` full-context conversations live
(goal <= 150 ms).

    python3 -m loadtest.bench.s2s_gpu --json s2s.json                                   # on a CUDA machine
    python3 -m loadtest.bench.s2s_gpu --config personaplex --json personaplex.json      # PersonaPlex 7B
    python3 -m loadtest.bench.s2s_gpu --json s2s_fp8.json --kv-dtype fp8                # the ring K/V in FP8
    python3 -m loadtest.bench.s2s_gpu --json s2s_48.json --batches 32 40 48 56 64 --fills 1 0.5  # the fine buckets
    python3 -m loadtest.bench.s2s_gpu --config tiny --device cpu --batches 1 2 --fills 0 1 --steps 3   # dry run
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from realtime_gw.models.kernels import bucket_for
from realtime_gw.models.s2s.backend import MoshiBackend
from realtime_gw.models.s2s.checkpoint import random_checkpoint
from realtime_gw.models.s2s.engine import MoshiEngine
from realtime_gw.models.s2s.personaplex import PersonaPlexBackend
from realtime_gw.models.s2s.prompt import prompt_columns, prompt_frames
from realtime_gw.models.s2s.sampling import Sampler

FRAME = 1920
FRAME_MS = 80.0
GREEDY = Sampler(0.0, 0)
PUBLISHED = (Sampler(0.7, 25), Sampler(0.8, 250))  # text, audio
CONFIGS = {"7b": ("moshi", "7b"), "tiny": ("moshi", "tiny"), "personaplex": ("personaplex", "7b"),
           "personaplex-tiny": ("personaplex", "tiny")}  # fmt: skip


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if xs else float("nan")


def stats(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": round(1e3 * pct(xs, 50), 3), "p99_ms": round(1e3 * pct(xs, 99), 3),
            "max_ms": round(1e3 * max(xs), 3) if xs else float("nan")}  # fmt: skip


def noise(n: int, frames: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, frames, FRAME)) * 3000).astype(np.int16)


def engine(ck: Any, slots: int, graphs: bool, sampled: bool, lead: int = 0) -> MoshiEngine:
    text, audio = PUBLISHED if sampled else (GREEDY, GREEDY)
    return MoshiEngine(ck.weights, ck.mimi, ck.shape, slots, text=text, audio=audio, cuda_graphs=graphs,
                       user_lead=lead)  # fmt: skip


def a_prompt(shape: Any, voice_frames: int, persona_tokens: int, seed: int = 0) -> np.ndarray:
    """A PersonaPlex prompt of random codes and tokens (random init has no voice or vocabulary)."""
    rng = np.random.default_rng(seed)
    q = shape.own_q
    return prompt_frames(rng.integers(0, shape.card, (voice_frames, q)),
                         [int(t) for t in rng.integers(4, shape.text_card, persona_tokens)],
                         rng.integers(0, shape.card, q).tolist(), rng.integers(0, shape.card, q).tolist())  # fmt: skip


def joining_run(eng: MoshiEngine, steps: int = 16, prompt: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Three conversations joining at steps 0, 2, 5 (opened with ``prompt`` if given): every frame's
    tokens and PCM, in order."""
    audio, starts = noise(3, steps, seed=1), (0, 2, 5)
    slots: dict[int, int] = {}
    toks, pcm = [], []
    for t in range(steps):
        for i, start in enumerate(starts):
            if t == start:
                slots[i] = eng.alloc_seeded(100 + i) if prompt is None else eng.open_prompted(100 + i, prompt)
        live = sorted(slots)
        frame, _, out = eng.step([slots[i] for i in live], np.stack([audio[i, t - starts[i]] for i in live]),
                                 [False] * len(live))  # fmt: skip
        toks.append(frame.copy())
        pcm.append(out.astype(np.int32))
    for s in slots.values():
        eng.free(s)
    return np.concatenate(toks), np.concatenate(pcm)


def compare(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
    return {"tokens_equal_frac": round(float((a[0] == b[0]).mean()), 4),
            "pcm_max_abs_diff": int(np.abs(a[1] - b[1]).max())}  # fmt: skip


def prefill_vs_stepped(ck: Any, prompt: np.ndarray, lead: int, steps: int = 8) -> dict[str, Any]:
    """Slot 0 opened with ``prompt`` prefilled in one pass, slot 1 with the same prompt stepped one position
    at a time (eager, greedy): the largest K/V difference, then both step on the same audio."""
    eng = engine(ck, 2, False, False, lead)
    lm = eng.lm
    a = eng.open_prompted(5, prompt)
    b = eng.alloc_seeded(5)
    eng._reset_fresh()
    cols = prompt_columns(torch.from_numpy(prompt).to(eng.device), ck.shape.delays, lm.initial)
    with torch.no_grad():
        for t in range(prompt.shape[0] - 1):
            x = torch.zeros(2, 1, ck.shape.dim, device=eng.device, dtype=lm.dtype)
            x[b] = lm.embed(cols[t : t + 1])[0]
            lm.ring(x, 2, torch.tensor([False, True], device=eng.device))
        lm.cache[b], lm.forced[b] = lm.cache[a], lm.forced[a]
    eng.frames[b] = eng.frames[a]
    s = prompt.shape[0] - 1
    kv = max(float((k[a, :, :s].float() - k[b, :, :s].float()).abs().max()) for k in lm.ring.k_ring + lm.ring.v_ring)
    kv_scale = max(float(k[a, :, :s].float().abs().max()) for k in lm.ring.k_ring + lm.ring.v_ring)
    pcm = noise(1, steps, seed=3)[0]
    toks = [eng.step([a, b], np.stack([pcm[t], pcm[t]]), [False, False])[0] for t in range(steps)]
    same = float(np.mean([(f[0] == f[1]).mean() for f in toks]))
    return {"prompt_frames": int(prompt.shape[0]), "kv_max_abs_diff": round(kv, 5), "kv_max_abs": round(kv_scale, 3),
            "next_tokens_equal_frac": round(same, 4), "dtype": str(lm.dtype).removeprefix("torch.")}  # fmt: skip


def checks(ck: Any, device: str, family: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    lead = 1 if family == "personaplex" else 0
    prompt = a_prompt(ck.shape, args.voice_frames, args.persona_tokens) if lead else None
    if device.startswith("cuda"):
        for sampled in (False, True):
            runs = [joining_run(engine(ck, 4, graphs, sampled, lead), prompt=prompt) for graphs in (False, True)]
            out["graph_vs_eager_" + ("sampled" if sampled else "greedy")] = compare(*runs)
            torch.cuda.empty_cache()
        tiny_dev = random_checkpoint("tiny", device, torch.float32, family)
        tiny_cpu = random_checkpoint("tiny", "cpu", torch.float32, family)
        # the same weights on both: random init draws on the device, so copy the device's to the CPU
        tiny_cpu.weights = {k: v.cpu() for k, v in tiny_dev.weights.items()}
        tiny_cpu.mimi.load_state_dict(tiny_dev.mimi.state_dict())
        tiny_prompt = a_prompt(tiny_dev.shape, 8, 16) if lead else None
        out["tiny_cuda_graphs_vs_cpu_greedy"] = compare(
            joining_run(engine(tiny_dev, 4, True, False, lead), prompt=tiny_prompt),
            joining_run(engine(tiny_cpu, 4, False, False, lead), prompt=tiny_prompt),
        )
        if lead:
            out["tiny_prefill_vs_stepped_float32"] = prefill_vs_stepped(tiny_dev, tiny_prompt, lead)
    if lead:  # at the run's own shape and dtype (the dry run: tiny, float32, CPU)
        out["prefill_vs_stepped"] = prefill_vs_stepped(ck, prompt, lead)
    log(f"check: {json.dumps(out)}")
    return out


def set_fill(eng: MoshiEngine, slots: list[int], positions: int) -> None:
    """Make ``slots`` look like conversations ``positions`` frames in (every ring column up to there a key)."""
    ring = eng.lm.ring
    with torch.no_grad():
        idx = torch.as_tensor(slots, dtype=torch.long, device=eng.device)
        if positions <= 0:
            eng.lm.reset(idx)
            for s in slots:
                eng.frames[s] = 0
            return
        cols = torch.arange(ring.ring, device=eng.device)
        pos = positions - 1 - ((positions - 1 - cols) % ring.ring)  # the latest position in each column
        ring.kpos[idx, : ring.ring] = torch.where(pos >= 0, pos, -1)
        ring.pos[idx] = positions
    for s in slots:
        eng.frames[s] = positions


def time_steps(eng: MoshiEngine, slots: list[int], pcm: np.ndarray, steps: int, silent: list[bool] | None = None) -> list[float]:
    out = []
    silent = silent or [False] * len(slots)
    for i in range(steps):
        t = time.perf_counter()
        eng.step(slots, pcm[:, i % pcm.shape[1]], silent)
        out.append(time.perf_counter() - t)
    return out


def save(result: dict[str, Any], path: str | None) -> None:
    """What is measured so far, written as it comes (a run cut short keeps its rows)."""
    if path:
        with open(path, "w") as f:
            f.write(json.dumps(result, indent=1))


def bench_steps(
    eng: MoshiEngine, args: argparse.Namespace, deadline: float, progress: Callable[[list[dict[str, Any]]], None]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    context = eng.shape.context
    for fill in sorted(args.fills, reverse=True):  # the full context first: the figure that matters most
        for b in args.batches:
            if time.perf_counter() > deadline:
                log("time budget spent: skipping the remaining cells")
                return rows
            slots = [eng.alloc_seeded(s) for s in range(b)]  # lowest first: [0, b), one batch bucket
            pcm = noise(b, 4, seed=b)
            positions = max(0, int(fill * context)) if fill < 1.0 else 10 * context
            set_fill(eng, slots, positions)
            time_steps(eng, slots, pcm, 2)  # caches warm (graphs were captured up front)
            bucket = bucket_for(eng.batch_buckets, b)
            row = {"batch": b, "bucket": bucket, "fill": fill, **stats(time_steps(eng, slots, pcm, args.steps))}
            log(f"steps: {json.dumps(row)}")
            rows.append(row)
            progress(rows)
            for s in slots:
                eng.free(s)
    return rows


def largest(rows: list[dict[str, Any]], fill: float, limit_ms: float) -> int | None:
    ok = [r["batch"] for r in rows if r["fill"] == fill and r["p99_ms"] <= limit_ms]
    return max(ok) if ok else None


def session_start_and_cancel(eng: MoshiEngine, b: int, reps: int, prompt: np.ndarray | None = None) -> dict[str, Any]:
    """``b - 1`` full-context conversations live; a new one opened (start: with ``prompt`` prefilled, if
    given), then a live one silenced (cancel)."""
    live = [eng.alloc_seeded(s) for s in range(b - 1)]
    set_fill(eng, live, 10 * eng.shape.context)
    pcm = noise(b, 2, seed=7)
    time_steps(eng, live, pcm[: len(live)], 2) if live else None
    first, voiced, cancel, prefill = [], [], [], []
    for r in range(reps):
        t = time.perf_counter()
        if prompt is None:
            new = eng.alloc_seeded(1000 + r)
        else:
            new = eng.open_prompted(1000 + r, prompt)
            if eng.device.type == "cuda":
                torch.cuda.synchronize(eng.device)
            prefill.append(time.perf_counter() - t)
        eng.step([*live, new], pcm[:, 0], [False] * b)
        first.append(time.perf_counter() - t)
        eng.step([*live, new], pcm[:, 1], [False] * b)
        voiced.append(time.perf_counter() - t)
        t = time.perf_counter()  # the silence switch lands between steps; the next frame out is silent
        _, _, out = eng.step([*live, new], pcm[:, 0], [False] * (b - 1) + [True])
        cancel.append(time.perf_counter() - t)
        assert not out[-1].any(), "a silenced conversation's next frame is silence"
        eng.free(new)
    for s in live:
        eng.free(s)
    out = {"batch": b, "first_frame": stats(first), "first_voiced_frame": stats(voiced),
           "cancel_to_last_audio": stats(cancel)}  # fmt: skip
    if prompt is not None:
        out.update(prompt_frames=int(prompt.shape[0]), prefill=stats(prefill))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="7b", choices=sorted(CONFIGS))
    p.add_argument("--voice-frames", type=int, default=125, help="PersonaPlex: voice prompt frames (10 s)")
    p.add_argument("--persona-tokens", type=int, default=80, help="PersonaPlex: persona tokens")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", type=int, nargs="*", default=[1, 8, 16, 32, 48, 64])
    p.add_argument("--fills", type=float, nargs="*", default=[0.0, 0.25, 0.5, 1.0])
    p.add_argument("--steps", type=int, default=30, help="timed steps per (batch, fill) cell")
    p.add_argument("--start-reps", type=int, default=5)
    p.add_argument("--start-batches", type=int, nargs="*", default=[],
                   help="also time session start at these batches (session_start_by_batch)")  # fmt: skip
    p.add_argument("--budget-s", type=float, default=180.0, help="stop starting cells after this")
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--kv-dtype", default="model", choices=["model", "fp8"], help="the ring K/V (s2s_kv_dtype)")
    p.add_argument("--batch-buckets", type=int, nargs="*", default=[],
                   help="batch sizes with a CUDA graph (s2s_batch_buckets; none: the stage's default)")  # fmt: skip
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    deadline = t0 + args.budget_s
    cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    result: dict[str, Any] = {
        "config": args.config, "device": args.device, "dtype": str(dtype).removeprefix("torch."),
        "kv_dtype": args.kv_dtype,
        "weights": "random init", "torch": torch.__version__, "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(args.device) if cuda else platform.processor() or platform.machine(),
    }  # fmt: skip
    family, shape_name = CONFIGS[args.config]
    ck = random_checkpoint(shape_name, args.device, dtype, family)
    log(f"weights ready in {time.perf_counter() - t0:.1f} s")
    prompt = a_prompt(ck.shape, args.voice_frames, args.persona_tokens) if family == "personaplex" else None
    if prompt is not None and len(prompt) > ck.shape.context + 1:
        p.error(f"a prompt of {len(prompt)} frames does not fit the context of {ck.shape.context}: "
                "lower --voice-frames / --persona-tokens")  # fmt: skip
    if not args.no_check:
        try:
            result["check"] = checks(ck, args.device, family, args)
        except Exception as e:  # the timing rows still come
            result["check"] = {"error": repr(e)}
            log(traceback.format_exc())
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    save(result, args.json)
    slots = max([*args.batches, 1])
    # the stage as the gateway builds it (published sampling), warmed up as at start: every graph captured
    cls = PersonaPlexBackend if family == "personaplex" else MoshiBackend
    backend = cls(config=shape_name, device=args.device, slots=slots, checkpoint=ck, cuda_graphs=cuda,
                  kv_dtype=args.kv_dtype, batch_buckets=args.batch_buckets)  # fmt: skip
    backend.warmup()
    eng = backend.engine
    report = backend.warmup_report
    result["warmup"] = {k: report[k] for k in ("seconds", "graphs", "graph_capture_s", "graph_memory_gib", "frames", "batch_buckets")}
    log(f"warm-up: {json.dumps(result['warmup'])}")
    t = time.perf_counter()
    result["steps"] = bench_steps(eng, args, deadline, lambda rows: save({**result, "steps": rows}, args.json))
    result["steps_wall_s"] = round(time.perf_counter() - t, 1)
    full = max(args.fills) if args.fills else 1.0
    result["largest_batch"] = {"fill": full, "p99_le_80ms": largest(result["steps"], full, 80.0),
                               "p99_le_40ms": largest(result["steps"], full, 40.0)}  # fmt: skip
    if args.batches:
        result["session_start"] = session_start_and_cancel(eng, max(args.batches), args.start_reps, prompt)
        result["session_start_by_batch"] = [
            session_start_and_cancel(eng, b, args.start_reps, prompt) for b in args.start_batches if b <= slots
        ]  # fmt: skip
    if cuda:
        result["max_memory_gib"] = round(torch.cuda.max_memory_allocated(args.device) / 2**30, 1)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, indent=1))
    save(result, args.json)
    return result


if __name__ == "__main__":
    main()
