"""The Qwen3-TTS code predictor on the fused kernels gives the eager passes' codes (float32, tiny
checkpoint, Triton's interpreter): greedy and top-k, the same draws, and the same embedding sum."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from realtime_gw.models.speech.qwen3.checkpoint import Qwen3TtsCheckpoint, load_checkpoint  # noqa: E402
from realtime_gw.models.speech.qwen3.talker import Qwen3TalkerRuntime, Sampling  # noqa: E402

CKPT = Path(__file__).resolve().parents[2] / "fixtures" / "qwen3_tts_tiny"


@pytest.fixture(scope="module")
def ck() -> Qwen3TtsCheckpoint:
    return load_checkpoint(CKPT, "cpu", torch.float32)


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "top_k"])
def test_frame_codes_equal_eager(ck: Qwen3TtsCheckpoint, do_sample: bool) -> None:
    sampling = Sampling.from_generation(ck.generation, do_sample=do_sample, sub_do_sample=do_sample)
    eager = Qwen3TalkerRuntime(ck, 3, 32, sampling)
    fused = Qwen3TalkerRuntime(ck, 3, 32, sampling, fused_predictor=True)
    assert fused.fused_predictor is not None and eager.fused_predictor is None
    g = torch.Generator().manual_seed(3)
    h = torch.randn(2, eager.hidden, generator=g)  # 2 of 3 slots: the passes run on rows [0, b)
    code0 = torch.randint(0, 200, (2,), generator=g)
    torch.manual_seed(21)
    want, want_sum = eager.predict_codes(h, code0)
    after_eager = torch.rand(4)  # the generator's state after the frame: the fused frame drew as much
    torch.manual_seed(21)
    got, got_sum = fused.predict_codes(h, code0)
    assert torch.equal(got, want)
    assert torch.equal(torch.rand(4), after_eager)
    torch.testing.assert_close(got_sum, want_sum, atol=0, rtol=0)  # the same gathered rows, the same sum
    for j in range(len(eager.p_layers)):  # the K/V each pass wrote
        torch.testing.assert_close(fused.pk_cache[j][:2], eager.pk_cache[j][:2], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fused.pv_cache[j][:2], eager.pv_cache[j][:2], atol=1e-5, rtol=1e-5)


def test_talker_layers_equal_eager(ck: Qwen3TtsCheckpoint) -> None:
    """Streams at different positions (one inactive: its K/V go to the scratch column): the same hidden
    states and the same K/V written as the eager talker step."""
    sampling = Sampling.from_generation(ck.generation, do_sample=False, sub_do_sample=False)
    runtimes = [Qwen3TalkerRuntime(ck, 3, 32, sampling, fused_predictor=f) for f in (False, True)]
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 200, (3, 9), generator=g)
    lengths = torch.tensor([9, 4, 6])
    x = torch.randn(3, runtimes[0].hidden, generator=g)
    active = torch.tensor([True, True, False])
    hidden = []
    for rt in runtimes:
        rt.prefill(torch.arange(3), prompt, prompt % 7, lengths)
        hidden.append(rt.talker_hidden(3, 12, x, active))
    eager, fused = runtimes
    torch.testing.assert_close(hidden[1], hidden[0], atol=1e-5, rtol=1e-5)
    for j in range(len(eager.layers)):
        torch.testing.assert_close(fused.k_cache[j], eager.k_cache[j], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fused.v_cache[j], eager.v_cache[j], atol=1e-5, rtol=1e-5)


def test_frame_steps_equal_eager(ck: Qwen3TtsCheckpoint) -> None:
    """Two whole frame steps (talker, codebook 0 with its penalty, code predictor, the next input), top-k."""
    sampling = Sampling.from_generation(ck.generation)
    runtimes = [Qwen3TalkerRuntime(ck, 2, 32, sampling, fused_predictor=f) for f in (False, True)]
    prompt = torch.randint(0, 200, (2, 7), generator=torch.Generator().manual_seed(8))
    codes = []
    for rt in runtimes:
        rt.prefill(torch.arange(2), prompt, prompt % 5, torch.tensor([7, 5]))
        torch.manual_seed(4)
        active, eos_ok = torch.tensor([True, True]), torch.tensor([False, True])
        codes.append([rt.frame_step(2, 9 + k, prompt[:, k], active, eos_ok).clone() for k in range(2)])
    for want, got in zip(*codes, strict=True):
        assert torch.equal(got, want)


def test_each_bucket_runs_the_faster_path(ck: Qwen3TtsCheckpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """``choose`` times each part of the frame eager and fused per batch bucket (on the device: graph
    replays; here a timer with set answers, in ``choose``'s order) and the frame follows what it kept."""
    sampling = Sampling.from_generation(ck.generation, do_sample=False, sub_do_sample=False)
    rt = Qwen3TalkerRuntime(ck, 2, 32, sampling, fused_predictor=True)
    fused = rt.fused_predictor
    answers = iter([1.0, 2.0, 3.0, 1.0])  # talker: eager, fused; predictor: eager, fused
    report = fused.choose([2], 16, timer=lambda body: (body(), next(answers))[1])
    assert report[2]["talker"] == {"chosen": "eager", "ms": {"eager": 1.0, "fused": 2.0}}
    assert report[2]["predictor"]["chosen"] == "fused"
    assert not fused.on("talker", 2) and fused.on("predictor", 2) and fused.on("talker", 1)  # 1: not timed
    ran: list[str] = []
    for name in ("talker_layers", "_layers"):  # the fused talker; the fused predictor's passes
        real = getattr(fused, name)
        monkeypatch.setattr(fused, name, lambda *a, real=real, name=name: (ran.append(name), real(*a))[1])
    h = rt.talker_hidden(2, 8, torch.zeros(2, rt.hidden), torch.zeros(2, dtype=torch.bool))
    rt.predict_codes(h, torch.zeros(2, dtype=torch.long))
    assert set(ran) == {"_layers"}  # the eager talker, the fused predictor
