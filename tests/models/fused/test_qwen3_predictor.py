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
