"""A Moshi checkpoint directory in Kyutai's published layout (``--s2s-path``): the reference package's
weights load strictly and say what the reference says, text pieces come from its SentencePiece model, and
a missing or extra tensor is refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from realtime_gw.models.s2s.backend import MoshiBackend
from realtime_gw.models.s2s.checkpoint import LM_FILE, MIMI_FILE, load
from realtime_gw.models.s2s.engine import MoshiEngine
from realtime_gw.models.s2s.sampling import Sampler
from realtime_gw.records.s2s import S2sAudio, S2sOpen
from tests.models.s2s.moshi_reference import Reference, reference, save_published

GREEDY = Sampler(0.0, 0)


@pytest.fixture(scope="module")
def ref() -> Reference:
    return reference()


@pytest.fixture(scope="module")
def published(ref: Reference, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("moshi-published")
    save_published(ref, root)
    return root


def test_a_published_directory_says_what_the_reference_says(ref: Reference, published: Path) -> None:
    backend = MoshiBackend(path=str(published), slots=1, temperature=0, text_temperature=0)
    assert not backend.checkpoint.random_init and "sentencepiece" in backend.checkpoint.text.name
    rng = np.random.default_rng(9)
    pcm = (rng.standard_normal((10, 1920)) * 5000).astype("<i2")
    st = backend.open(S2sOpen(seed=0))
    frames = []
    for t in range(10):
        frames += backend.step([(st, [S2sAudio(pcm[t].tobytes())])])[0].outputs
    backend.release(st)
    ck = ref.checkpoint
    eng = MoshiEngine(ck.weights, ck.mimi, ck.shape, 1, text=GREEDY, audio=GREEDY, cuda_graphs=False)
    slot = eng.alloc_seeded(0)
    want = [eng.step([slot], pcm[t][None], [False]) for t in range(10)]
    assert [f.text_token for f in frames[1:]] == [int(w[0][0, 0]) for w in want[1:]]
    assert [f.pcm for f in frames] == [w[2][0].tobytes() for w in want]
    words = [f.text for f in frames if not f.padding]
    assert words and all(w.startswith(" ") or w.startswith("<") for w in words)  # pieces, "▁" as a space


@pytest.mark.parametrize("file", [LM_FILE, MIMI_FILE])
@pytest.mark.parametrize("change", ["missing", "extra"])
def test_a_tensor_missing_or_extra_is_refused_by_name(published: Path, tmp_path: Path, file: str, change: str) -> None:
    for f in published.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    state = load_file(str(published / file))
    name = sorted(state)[3]
    if change == "missing":
        del state[name]
    else:
        name = "transformer.layers.0.self_attn.bias"
        state[name] = torch.zeros(1)
    save_file(state, str(tmp_path / file))
    with pytest.raises(ValueError, match="missing" if change == "missing" else "unexpected") as e:
        load("tiny", str(tmp_path), "cpu", torch.float32)
    assert str(tmp_path / file) in str(e.value)
    if file == LM_FILE:  # the LM's names are the published ones; Mimi's are said in transformers' names
        assert name in str(e.value)
