"""GPU speech stage: the codec-LM TTS backend (``tts_codec``) vs a naive transformers pipeline, one run.

Full config (Qwen3-TTS-0.6B-shaped talker + 5-layer code predictor + 16-codebook Mimi), **random-init
weights** (real architecture and cost; the audio is noise), byte-level text tokens (one per frame).

Phases (each prints as it goes; results also go to ``--json``):
1. checks on the GPU: streaming vs full ``MimiModel.decode`` (fp32); static-KV talker vs ``Qwen3Model``
   forward (bf16); CUDA-graph replay vs eager (greedy, same codes).
2. micro: CUDA-event medians of graph replays: talker step (28 layers + head) at batch 1, code predictor,
   codec decoder, whole frame at several batch sizes.
3. streams through a real ``StageWorker``: N concurrent utterances submitted at once; time to first
   audio (submit -> first 80 ms frame at the consumer), RTF per stream (synthesis wall time / audio
   length), frame lateness against real-time playback from the first frame (frame i due at
   first + i*80 ms).
4. capacity: the largest N whose p95 frame lateness stays <= 20 ms.
5. naive baseline: per request, ``generate`` on the talker (text prefilled, codebook 0), ``generate`` of
   the code predictor per frame (15 tokens), then one non-streaming ``MimiModel.decode``; requests run
   one at a time, so its first audio is the whole utterance. Measured at 1 stream; N concurrent
   requests wait N times as long (stated as a projection, not measured).

    python3 -m loadtest.bench.tts_gpu                       # on a CUDA machine
    python3 -m loadtest.bench.tts_gpu --markdown docs/benchmarks-log.md
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import datetime as dt
import json
import platform
import sys
import time
import traceback
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import torch

from realtime_gw.models.fused.tuning import replay_ms
from realtime_gw.models.kernels import GraphCapture
from realtime_gw.models.runtime import StageWorker
from realtime_gw.models.speech.codec.engine import LoadedModels, load_models
from realtime_gw.models.speech.codec.mimi_stream import StreamingMimiDecoder, strict_fp32
from realtime_gw.models.speech.codec.talker import TalkerRuntime
from realtime_gw.models.speech.tts_codec import CodecTtsBackend
from realtime_gw.models.tokenizers import ByteTokenizer
from realtime_gw.records.voice import TtsRequest

ROOT = Path(__file__).resolve().parents[2]

FRAME_S = 0.08
DEV = "cuda"


def sync() -> None:
    if DEV.startswith("cuda"):
        torch.cuda.synchronize()


TEXT = (
    "The weather today is sunny and warm, with a light breeze from the west. Please turn on the "
    "kitchen lights and remind me to call the office at four."
)
SHORT_TEXT = "Turn on the kitchen lights, please."


def log(msg: str) -> None:
    print(msg, flush=True)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if xs else float("nan")


# -- graph timing -----------------------------------------------------------------------------------------
def capture(fn: Any) -> Any:
    """One graph in a pool of its own (timed graphs stay alive side by side)."""
    return GraphCapture(DEV).capture(fn)


def time_graph(g: Any, iters: int = 100) -> float:
    """Median ms of one replay, by CUDA events."""
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    return replay_ms(g, iters, median)


# -- phase 1: checks --------------------------------------------------------------------------------------
@torch.no_grad()
def checks(models: LoadedModels) -> dict[str, Any]:
    res: dict[str, Any] = {}
    spec = models.spec
    dec = StreamingMimiDecoder(models.mimi, 1, spec.num_codebooks)
    codes = torch.randint(0, spec.codebook_size, (1, spec.num_codebooks, 12), device=DEV)
    on = torch.ones(1, dtype=torch.bool, device=DEV)
    dec.reset(torch.zeros(1, dtype=torch.long, device=DEV))
    stream = torch.cat([dec.step(1, codes[:, :, t], on)[0] for t in range(12)])
    with strict_fp32(torch.device(DEV)):  # the reference in true float32 too (cuDNN defaults to TF32)
        ref = models.mimi.decode(codes).audio_values[0, 0]
    res["mimi_stream_vs_full_max_abs"] = float((stream - ref).abs().max())
    res["mimi_ref_max_abs"] = float(ref.abs().max())

    talker = models.talker
    rt = TalkerRuntime(talker, 2, temperature=0)
    rt.reset(torch.arange(2, device=DEV))
    dtype = next(talker.parameters()).dtype
    seq = torch.randn(8, rt.hidden, device=DEV, dtype=dtype)
    act = torch.tensor([True, False], device=DEV)
    got = []
    for t in range(8):
        x = torch.zeros(2, rt.hidden, device=DEV, dtype=dtype)
        x[0] = seq[t]
        got.append(rt.talker_hidden(2, 64, x, act)[0].float())
        rt.advance(2, act)
    got_t = torch.stack(got)
    hf = talker.model(inputs_embeds=seq[None]).last_hidden_state[0].float()
    # both against a float32 reference: ours should be as close as transformers' own bf16 forward
    ref32 = copy.deepcopy(talker.model).float()
    want = ref32(inputs_embeds=seq[None].float()).last_hidden_state[0]
    del ref32
    res["talker_static_kv_vs_fp32_rel"] = float((got_t - want).norm() / want.norm())
    res["qwen3_bf16_vs_fp32_rel"] = float((hf - want).norm() / want.norm())
    res["talker_static_kv_vs_qwen3_bf16_rel"] = float((got_t - hf).norm() / hf.norm())
    return res


@torch.no_grad()
def graph_vs_eager(models: LoadedModels) -> dict[str, Any]:
    from realtime_gw.models.speech.codec.engine import CodecEngine

    out = {}
    runs = []
    for graphs in (False, True):
        eng = CodecEngine(models, 2, temperature=0.0, cuda_graphs=graphs)
        a, b = eng.alloc(), eng.alloc()
        codes, pcm = [], []
        for t in range(6):
            c, p = eng.step([a, b] if t else [a], [40 + t, 50 + t][: 2 if t else 1])
            codes.append(c[0].copy())
            pcm.append(p[0].astype(np.int32))
        runs.append((np.stack(codes), np.concatenate(pcm)))
    out["graph_vs_eager_codes_equal_frac"] = float((runs[0][0] == runs[1][0]).mean())
    out["graph_vs_eager_pcm_max_abs"] = int(np.abs(runs[0][1] - runs[1][1]).max())
    return out


# -- phase 2: micro ---------------------------------------------------------------------------------------
@torch.no_grad()
def micro(backend: CodecTtsBackend) -> dict[str, float]:
    eng = backend.engine
    rt, dec, talker = eng.talker, eng.decoder, eng.talker.talker
    res: dict[str, float] = {}
    dtype = next(talker.parameters()).dtype
    x = torch.zeros(1, rt.hidden, device="cuda", dtype=dtype)
    act1 = torch.zeros(1, dtype=torch.bool, device="cuda")
    out = torch.zeros(1, backend.spec.codec_vocab, device="cuda", dtype=dtype)

    def talker_step() -> None:
        out.copy_(talker.codec_head(rt.talker_hidden(1, 64, x, act1)))

    res["talker_step_b1_ms"] = time_graph(capture(talker_step))
    h = torch.zeros(1, rt.hidden, device="cuda", dtype=dtype)
    c0 = torch.zeros(1, dtype=torch.long, device="cuda")
    res["code_predictor_b1_ms"] = time_graph(capture(lambda: rt.predict_codes(h, c0)))
    for b in (1, 64):
        if b > eng.slots:
            continue
        codes = torch.zeros(b, backend.spec.num_codebooks, dtype=torch.long, device="cuda")
        act = torch.zeros(b, dtype=torch.bool, device="cuda")
        res[f"decoder_b{b}_ms"] = time_graph(
            capture(lambda b=b, codes=codes, act=act: dec.step(b, codes, act))
        )
    eng.d_active.zero_()
    for (b, length), g in sorted(eng._graphs.items()):
        if length in (64, 256) and b in (1, 8, 32, 64, 128, 256, 512):
            res[f"frame_b{b}_L{length}_ms"] = time_graph(g, iters=50)
    return res


# -- phase 3/4: streams through the StageWorker -----------------------------------------------------------
async def run_streams(worker: StageWorker, backend: CodecTtsBackend, n: int, text: str) -> dict[str, Any]:
    eng = backend.engine
    step_ms: list[float] = []
    batch: list[int] = []
    method = "launch" if getattr(eng, "pipelined", False) else "step"  # what the frame loop calls
    inner = getattr(eng, method)

    def timed(slots: Any, tokens: Any, eos_ok: Any = None) -> Any:
        t0 = time.perf_counter()
        r = inner(slots, tokens, eos_ok)
        step_ms.append((time.perf_counter() - t0) * 1000)
        batch.append(len(slots))
        return r

    while worker.active_count:  # the last run's streams leave the worker's books on its next loop
        await asyncio.sleep(0.005)
    setattr(eng, method, timed)

    async def one() -> tuple[float, list[float]]:
        t0 = time.perf_counter()
        s = worker.submit(TtsRequest())
        s.push(text)
        s.close_input()
        arrivals = []
        async for _ in s:
            arrivals.append(time.perf_counter())
        return t0, arrivals

    try:
        t_start = time.perf_counter()
        results = await asyncio.gather(*(one() for _ in range(n)))
        wall = time.perf_counter() - t_start
    finally:
        setattr(eng, method, inner)
    ttfa, rtf, late = [], [], []
    frames = 0
    for t0, arr in results:
        ttfa.append((arr[0] - t0) * 1000)
        rtf.append((arr[-1] - t0) / (len(arr) * FRAME_S))
        late += [max(0.0, a - (arr[0] + i * FRAME_S)) * 1000 for i, a in enumerate(arr)]
        frames += len(arr)
    return {
        "streams": n,
        "frames_per_stream": frames / n,
        "ttfa_p50_ms": pct(ttfa, 50),
        "ttfa_p95_ms": pct(ttfa, 95),
        "ttfa_max_ms": max(ttfa),
        "rtf_p50": pct(rtf, 50),
        "rtf_p95": pct(rtf, 95),
        "late_p95_ms": pct(late, 95),
        "late_max_ms": max(late),
        "step_p50_ms": pct(step_ms, 50),
        "step_p95_ms": pct(step_ms, 95),
        "mean_batch": float(np.mean(batch)) if batch else 0.0,
        "wall_s": wall,
    }


# -- phase 5: naive baseline ------------------------------------------------------------------------------
@torch.no_grad()
def naive_request(models: LoadedModels, text: str, tail: int) -> dict[str, Any]:
    from transformers import Qwen3ForCausalLM

    talker, spec = models.talker, models.spec
    with torch.device("meta"):
        lm = Qwen3ForCausalLM(talker.model.config)
        cp = Qwen3ForCausalLM(talker.predictor.config)
    lm.model, lm.lm_head = talker.model, talker.codec_head
    cp_embed = talker.predictor.embed_tokens
    talker.predictor.embed_tokens = talker.predictor_embeds[0]  # generate feeds sampled ids back in
    cp.model, cp.lm_head = talker.predictor, talker.predictor_heads[0]
    for m in (lm, cp):
        m.generation_config.pad_token_id = 0
        m.generation_config.eos_token_id = None
    cp_vocab = cp.config.vocab_size
    cp.config.vocab_size = spec.codebook_size  # the predictor's embed/head pair stands in for a vocabulary
    try:
        sync()
        t0 = time.perf_counter()
        ids = torch.tensor(ByteTokenizer().encode(text), device=DEV)
        n = len(ids) + tail
        prompt = torch.cat(
            [talker.text_proj(talker.text_embed(ids)), talker.model.embed_tokens.weight[spec.bos_id][None]]
        )
        sample = {"do_sample": True, "top_k": 50, "temperature": 0.9}
        out = lm.generate(
            inputs_embeds=prompt[None],
            max_new_tokens=n,
            output_hidden_states=True,
            return_dict_in_generate=True,
            **sample,
        )
        code0 = out.sequences[0, -n:].clamp(max=spec.codebook_size - 1)
        hs = [step[-1][0, -1] for step in out.hidden_states]
        codes = []
        for t in range(n):
            e0 = talker.model.embed_tokens(code0[t])
            rest = cp.generate(
                inputs_embeds=torch.stack([hs[t], e0])[None],
                max_new_tokens=spec.num_codebooks - 1,
                **sample,
            )[0, -(spec.num_codebooks - 1) :]
            codes.append(torch.cat([code0[t : t + 1], rest.clamp(max=spec.codebook_size - 1)]))
        audio = models.mimi.decode(torch.stack(codes).T[None]).audio_values
        sync()
        total = time.perf_counter() - t0
    finally:
        talker.predictor.embed_tokens = cp_embed
        cp.config.vocab_size = cp_vocab
    return {
        "frames": n,
        "total_s": total,
        "ttfa_ms": total * 1000,
        "rtf": total / (n * FRAME_S),
        "samples": audio.shape[-1],
    }


# -- report -----------------------------------------------------------------------------------------------
def hardware() -> str:
    import transformers

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return (
        f"{name}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"Python {platform.python_version()}"
    )


def markdown(r: dict[str, Any], command: str) -> str:
    stamp = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    lines = [
        f"\n## GPU speech stage: codec-LM TTS (`--tts codec`) vs naive transformers ({stamp})\n",
        f"- hardware: {r.get('hardware')}",
        f"- command: `{command}`",
        f"- model: {r.get('model')}, **random-init weights**: real architecture and cost, the audio is "
        "noise. Byte-level text tokens, one per 80 ms frame; talker in bfloat16 (CPU: float32), "
        "decoder in float32 (no TF32).",
        f"- slots {r.get('slots')}, slot length {r.get('max_positions')} frames, "
        f"{r.get('graphs')} CUDA graphs captured in {r.get('capture_s', 0):.1f} s; "
        f"utterance: {r.get('text_chars')} characters = {r.get('text_frames')} frames "
        f"({r.get('text_frames', 0) * FRAME_S:.1f} s of audio), all streams submitted at once",
        "- TTFA = submit -> first 80 ms frame at the consumer (through `StageWorker`); RTF = synthesis "
        "wall time / audio length, per stream; lateness = frame arrival vs real-time playback from the "
        "first frame",
        "",
    ]
    if "checks" in r:
        c = r["checks"]
        lines.append(
            "- checks on the GPU: streaming vs full `MimiModel.decode`, both float32 without TF32, max |diff| "
            f"{c.get('mimi_stream_vs_full_max_abs', float('nan')):.2e} (peak {c.get('mimi_ref_max_abs', 0):.2f}); "
            "talker hidden states vs a float32 `Qwen3Model` forward, rel. error: ours (static KV, bf16) "
            f"{c.get('talker_static_kv_vs_fp32_rel', float('nan')):.1e}, transformers' own bf16 forward "
            f"{c.get('qwen3_bf16_vs_fp32_rel', float('nan')):.1e}; graph vs eager codes equal "
            f"{c.get('graph_vs_eager_codes_equal_frac', float('nan')):.2f}, PCM max |diff| "
            f"{c.get('graph_vs_eager_pcm_max_abs')}\n"
        )
    if "micro" in r:
        m = r["micro"]
        lines += ["| step (CUDA graph replay, median) | ms |", "|---|---|"]
        lines += [f"| {k.removesuffix('_ms')} | {v:.3f} |" for k, v in m.items()]
        lines.append("")
    if r.get("streams"):
        lines += [
            "| streams | TTFA p50 ms | TTFA p95 ms | RTF p50 | RTF p95 | lateness p95 ms | step p50 ms | mean batch |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for s in r["streams"]:
            lines.append(
                f"| {s['streams']} | {s['ttfa_p50_ms']:.1f} | {s['ttfa_p95_ms']:.1f} | {s['rtf_p50']:.3f} "
                f"| {s['rtf_p95']:.3f} | {s['late_p95_ms']:.1f} | {s['step_p50_ms']:.2f} | {s['mean_batch']:.1f} |"
            )
        lines.append("")
    if r.get("capacity_runs"):
        lines += [
            "Capacity runs (same utterance, all streams at once):\n",
            "| streams | TTFA p95 ms | RTF p50 | lateness p95 ms | step p50 ms |",
            "|---|---|---|---|---|",
        ]
        for s in r["capacity_runs"]:
            lines.append(
                f"| {s['streams']} | {s['ttfa_p95_ms']:.1f} | {s['rtf_p50']:.3f} | {s['late_p95_ms']:.1f} "
                f"| {s['step_p50_ms']:.1f} |"
            )
        lines.append("")
    if "capacity" in r:
        cap = r["capacity"]
        lines.append(
            f"- largest stream count in real time (p95 lateness <= 20 ms): **{cap['max_realtime']}** "
            f"(tried {', '.join(str(x) for x in cap['tried'])}"
            f"{'; the largest tried still passed' if cap['all_passed'] else ''})\n"
        )
    if "baseline" in r:
        b = r["baseline"]
        ours = r.get("ours_short", {})
        lines += [
            f"Naive baseline, short utterance ({b['frames']} frames): one request at a time, "
            "so with N concurrent requests the last one's first audio comes after N x its time (projected).\n",
            "| pipeline | TTFA ms (1 stream) | RTF (1 stream) | TTFA at 64 streams |",
            "|---|---|---|---|",
            f"| naive (`generate` + `MimiModel.decode`) | {b['ttfa_ms']:.0f} | {b['rtf']:.2f} "
            f"| ~{b['ttfa_ms'] * 64 / 1000:.0f} s (projected) |",
        ]
        if ours:
            at64 = next((s for s in r.get("streams", []) if s["streams"] == 64), None)
            lines.append(
                f"| ours (slots + CUDA graphs + streaming decode) | {ours['ttfa_p50_ms']:.1f} | {ours['rtf_p50']:.3f} "
                f"| {at64['ttfa_p95_ms']:.1f} ms p95 (measured) |"
                if at64
                else f"| ours | {ours['ttfa_p50_ms']:.1f} | {ours['rtf_p50']:.3f} | |"
            )
        lines.append("")
    if r.get("errors"):
        lines.append("- errors: " + "; ".join(r["errors"]) + "\n")
    return "\n".join(lines)


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    r: dict[str, Any] = {"hardware": hardware(), "errors": []}
    torch.manual_seed(0)
    t0 = time.perf_counter()
    dtype = torch.bfloat16 if DEV.startswith("cuda") else torch.float32
    models = load_models(args.config, None, DEV, dtype, max_positions=args.max_positions)
    r["load_s"] = time.perf_counter() - t0
    tc, pc = models.talker.model.config, models.talker.predictor.config
    r["model"] = (
        f"`{args.config}` config: Qwen3 talker {tc.num_hidden_layers} layers / hidden {tc.hidden_size} / "
        f"{tc.num_attention_heads} heads / {tc.num_key_value_heads} KV heads, {pc.num_hidden_layers}-layer "
        f"code predictor, {models.spec.num_codebooks}-codebook Mimi decoder"
    )
    log(f"loaded full random-init models in {r['load_s']:.1f} s")

    def phase(name: str, fn: Any) -> Any:
        try:
            t = time.perf_counter()
            out = fn()
            log(f"[{name}] {time.perf_counter() - t:.1f} s: {json.dumps(out, default=str)[:1500]}")
            return out
        except Exception as e:
            traceback.print_exc()
            r["errors"].append(f"{name}: {type(e).__name__}: {e}")
            return None

    if not args.skip_checks:
        c = phase("checks", lambda: checks(models))
        g = phase("graph_vs_eager", lambda: graph_vs_eager(models)) if DEV.startswith("cuda") else None
        r["checks"] = {**(c or {}), **(g or {})}

    slots = max([*args.streams, *args.capacity])
    backend = CodecTtsBackend(slots=slots, models=models, tail_frames=3)
    t = time.perf_counter()
    backend.warmup()
    r.update(
        slots=slots,
        max_positions=backend.spec.max_positions,
        graphs=backend.engine.graph_count,
        capture_s=time.perf_counter() - t,
        text_chars=len(args.text),
        text_frames=len(args.text.encode()) + backend.tail_frames,
    )
    log(f"warm-up (graph capture + one utterance): {r['capture_s']:.1f} s, {r['graphs']} graphs")
    if DEV.startswith("cuda"):
        r["micro"] = phase("micro", lambda: micro(backend)) or {}

    worker = StageWorker(backend, device=DEV, max_batch=slots, max_active=slots, max_backlog=4096)
    await worker.start(warmup=False)
    try:
        await run_streams(worker, backend, 4, SHORT_TEXT)  # warm the asyncio/worker paths
        r["streams"] = []
        for n in args.streams:
            try:
                s = await run_streams(worker, backend, n, args.text)
                log(f"[streams] {json.dumps(s)}")
                r["streams"].append(s)
            except Exception as e:
                traceback.print_exc()
                r["errors"].append(f"streams {n}: {e}")
        tried, best, passed_all = [], 0, True
        for n in args.capacity:
            s = next((x for x in r["streams"] if x["streams"] == n), None) or await run_streams(
                worker, backend, n, args.text
            )
            tried.append(n)
            r.setdefault("capacity_runs", []).append(s)
            log(f"[capacity] {json.dumps(s)}")
            if s["late_p95_ms"] <= 20.0:
                best = n
            else:
                passed_all = False
                r.setdefault("capacity_fail", s)
                break
        r["capacity"] = {"tried": tried, "max_realtime": best, "all_passed": passed_all}
        if not args.skip_baseline:
            r["ours_short"] = await run_streams(worker, backend, 1, SHORT_TEXT)
            log(f"[ours short] {json.dumps(r['ours_short'])}")
    finally:
        await worker.stop()
    if not args.skip_baseline:
        phase("baseline warm-up", lambda: naive_request(models, SHORT_TEXT[:12], backend.tail_frames))
        r["baseline"] = phase("baseline", lambda: naive_request(models, SHORT_TEXT, backend.tail_frames))
        if r["baseline"] is None:
            del r["baseline"]
    if not r["errors"]:
        del r["errors"]
    return r


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    parser.add_argument(
        "--streams", type=ints, default=[1, 8, 32, 64], help="concurrency levels for TTFA/RTF"
    )
    parser.add_argument(
        "--capacity", type=ints, default=[64, 128, 256, 512, 640, 768], help="stream counts to try"
    )
    parser.add_argument("--max-positions", type=int, default=512, help="slot length in frames (KV memory)")
    parser.add_argument("--text", default=TEXT)
    parser.add_argument("--skip-checks", action="store_true")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--json", default=None, help="write raw results here")
    parser.add_argument("--markdown", default=None, help="append the report section to this file")
    parser.add_argument("--config", default="full", choices=["full", "tiny"], help="tiny: CPU dry run")
    parser.add_argument("--device", default="cuda", help="cpu: dry run of the script itself")
    args = parser.parse_args()
    global DEV
    DEV = args.device
    if DEV.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("bench_tts_gpu: needs a CUDA GPU (or --device cpu --config tiny for a dry run)")
    command = "python3 -m loadtest.bench.tts_gpu " + " ".join(sys.argv[1:])
    r = asyncio.run(amain(args))
    text = markdown(r, command.strip())
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1, default=str))
    if args.markdown:
        with Path(args.markdown).open("a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
