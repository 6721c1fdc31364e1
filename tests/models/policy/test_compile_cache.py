"""The policy's on-disk compile cache: its key, its directory, and a real warm start-up with inductor.

The start-ups are child processes (``compile_probe``), as a server's would be: the second finds the
first's artifacts in our file alone (inductor's own directory emptied) and compiles no graph afresh."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from realtime_gw.config import GatewayConfig
from realtime_gw.models.policy import compile_cache as cc
from realtime_gw.models.policy.factory import compile_cache, pi0_config, policy_spec

ROOT = Path(__file__).resolve().parents[3]
SHAPES = {"buckets": [1, 2], "image_slots": 3, "image_size": [224, 224], "prompt_tokens": 48}


def test_the_key_names_model_dtype_shapes_torch_and_device(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    tiny = pi0_config("tiny").to_dict()
    key = cc.cache_key(tiny, torch.float32, cpu, SHAPES)
    assert key == cc.cache_key(pi0_config("tiny").to_dict(), torch.float32, cpu, dict(SHAPES))
    wider = pi0_config("tiny")
    wider.dit_config.intermediate_size = 256
    others = {
        cc.cache_key(wider.to_dict(), torch.float32, cpu, SHAPES),
        cc.cache_key(pi0_config("pi0").to_dict(), torch.float32, cpu, SHAPES),
        cc.cache_key(tiny, torch.bfloat16, cpu, SHAPES),
        cc.cache_key(tiny, torch.float32, cpu, {**SHAPES, "buckets": [1, 2, 4]}),
        cc.cache_key(tiny, torch.float32, cpu, {**SHAPES, "prompt_tokens": 200}),
    }
    monkeypatch.setattr(cc, "device_signature", lambda device: "NVIDIA H200 sm90 cuda 12.8")
    others.add(cc.cache_key(tiny, torch.float32, cpu, SHAPES))
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu128")
    others.add(cc.cache_key(tiny, torch.float32, cpu, SHAPES))
    assert len(others) == 7 and key not in others


def test_the_factory_keys_a_cache_where_the_expert_compiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    model = _model()
    spec = policy_spec(GatewayConfig(), model="tiny", action_horizon=10, tokenizer="bytes")
    on = GatewayConfig(policy_impl="fast", policy_compile="on")
    cache = compile_cache(on, model, spec)
    assert cache is not None and cache.directory == tmp_path / "xdg" / "realtime-gw" / "policy-compile"
    mine = compile_cache(
        GatewayConfig(policy_impl="fast", policy_compile="on", policy_compile_cache=str(tmp_path)),
        model,
        spec,
    )
    assert mine is not None and mine.directory == tmp_path and mine.key == cache.key
    assert mine.path == tmp_path / f"{cache.key}.bin"
    other = compile_cache(
        GatewayConfig(policy_impl="fast", policy_compile="on", policy_graph_buckets=[1]), model, spec
    )
    assert other is not None and other.key != cache.key
    assert (
        compile_cache(
            GatewayConfig(policy_impl="fast", policy_compile="on", policy_compile_cache="off"), model, spec
        )
        is None
    )
    assert (
        compile_cache(GatewayConfig(policy_impl="fast"), model, spec) is None
    )  # nothing compiled on the CPU
    # A cold start: the directory appears, nothing to load.
    fresh = cc.CompileCache(tmp_path / "new" / "dir", cache.key)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "user-chosen"))
    assert not fresh.load() and fresh.directory.is_dir()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "user-chosen")  # the user's choice stays
    (fresh.path).write_bytes(b"not an artifact file")
    assert not fresh.load()  # unreadable: a cold compile, not a failed start-up


def test_an_unwritable_cache_costs_a_compile_not_the_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache directory that cannot be made (a read-only home in a container) or written: load and
    save warn and go on; they used to raise out of warm-up, so the policy stage never started."""
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    cache = cc.CompileCache(blocker / "policy-compile", "k")  # no directory can exist under a file
    assert not cache.load()
    # torch's answer after a compile (a real one takes minutes on the CPU: the probe test runs it)
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"artifacts", None))
    assert cache.save() == 0 and cache.saved_bytes == 0
    writable = cc.CompileCache(tmp_path / "ok", "k")
    assert writable.save() == len(b"artifacts") and writable.path.read_bytes() == b"artifacts"
    assert [p.name for p in writable.directory.iterdir()] == ["k.bin"]  # no temporary left


def _model() -> torch.nn.Module:
    from realtime_gw.models.policy.factory import load_model

    return load_model(GatewayConfig())[0]


@pytest.mark.timeout(900)
@pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="inductor needs a C compiler"
)
def test_a_second_start_up_hits_the_cache_in_our_file_alone(tmp_path: Path) -> None:
    """No graph is compiled afresh the second time (inductor's FX-graph cache hits). On the CPU inductor
    still builds the C++ of a hit that its own directory no longer holds (kept under ours in a real
    start-up; removed here to test our file); on CUDA the Triton kernels travel in the entries."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["PYTHONPATH"] = str(ROOT)

    def start_up() -> dict[str, float]:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.models.policy.compile_probe", str(tmp_path / "cache")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=420,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    cold = start_up()
    assert not cold["loaded"] and cold["misses"] >= 1 and cold["saved_bytes"] > 0
    assert (tmp_path / "cache" / "probe.bin").is_file() and (tmp_path / "cache" / "inductor").is_dir()
    shutil.rmtree(tmp_path / "cache" / "inductor")  # our artifact file alone must make the start warm
    warm = start_up()
    assert warm["loaded"] and warm["hits"] >= 1 and warm["misses"] == 0, (cold, warm)
