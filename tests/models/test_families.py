"""The table of model families: the config's choices are its names, and a config a family cannot serve
stops start-up with a ``ConfigError`` that names the flag (no traceback)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, get_args, get_type_hints

import pytest

from realtime_gw.config import ConfigError, GatewayConfig
from realtime_gw.models.families import FAMILIES, TURN_FAMILY, Family, Role, family, names
from realtime_gw.models.registry import build_stage


@pytest.mark.parametrize("role", ["tts", "asr", "vad", "policy", "s2s"])
def test_the_configs_choices_are_the_tables_names(role: Role) -> None:
    choices = set(get_args(get_type_hints(GatewayConfig)[role]))
    extra = {"none"} if role in ("policy", "s2s") else set()  # no policy / speech-to-speech stage at all
    assert choices == set(names(role)) | extra


def test_every_role_has_a_family_and_names_are_unique() -> None:
    assert {f.role for f in FAMILIES} == {"tts", "asr", "vad", "turn", "policy", "s2s"}
    assert len({(f.role, f.name) for f in FAMILIES}) == len(FAMILIES)
    assert names("turn") == (TURN_FAMILY,)


def test_the_table_imports_no_model_library() -> None:
    code = "import sys, realtime_gw.models.families; print(sorted({'torch', 'onnxruntime', 'piper'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_unknown_family_is_a_config_error_listing_the_choices() -> None:
    with pytest.raises(ConfigError, match="no such tts family; choose one of piper, tone, codec, qwen3"):
        family("tts", "nope")


UNSERVABLE: list[tuple[Role, dict[str, Any], str]] = [
    ("tts", {"tts": "codec", "tts_config": "0.6b"}, r"tts_config '0\.6b' is not a shape of tts 'codec'"),
    ("tts", {"tts": "codec", "tts_path": "/nonexistent"}, r"--tts codec: .*/nonexistent"),
    ("tts", {"tts": "qwen3", "tts_path": "/nonexistent"}, r"--tts qwen3: .*/nonexistent"),
    ("tts", {"tts": "piper", "tts_voice": "nobody"}, r"--tts piper: no voice 'nobody'; piper has joe"),
    ("asr", {"asr": "pocketsphinx", "asr_slots": 0}, r"--asr pocketsphinx: asr_slots must be >= 1"),
    ("asr", {"asr": "kyutai", "asr_path": "/nonexistent"}, r"--asr kyutai: /nonexistent"),
    ("vad", {"vad_device": "nodevice"}, r"--vad silero: .*nodevice"),
    (
        "policy",
        {"policy": "pi0", "policy_path": "/nonexistent"},
        r"policy_path /nonexistent is not a directory",
    ),
    (
        "policy",
        {"policy": "noop", "robot": "droid", "robot_delta_actions": True},
        r"robot 'droid' has no delta",
    ),
    ("s2s", {"s2s": "moshi", "s2s_path": "/nonexistent"}, r"--s2s moshi: /nonexistent: not a directory"),
    ("s2s", {"s2s": "moshi", "s2s_slots": 0}, r"--s2s moshi: s2s_slots must be >= 1"),
]
"""Settings each family cannot serve (tone and the end-of-turn model take none that could be wrong)."""


@pytest.mark.parametrize(("role", "settings", "message"), UNSERVABLE, ids=[str(s) for _, s, _ in UNSERVABLE])
def test_a_config_a_family_cannot_serve_is_a_config_error(
    role: Role, settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        build_stage(role, GatewayConfig(warmup=False, **settings))


def test_serve_with_a_config_the_family_cannot_serve_exits_with_the_message() -> None:
    code = "from realtime_gw.cli import main; main(['serve', '--tts', 'codec', '--tts-config', '0.6b'])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert (
        "realtime-gw: bad configuration: tts_config '0.6b' is not a shape of tts 'codec': use one of tiny, full"
        in done.stderr
    )


def _out_of_device_memory(config: GatewayConfig) -> Any:
    import torch

    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 44.00 MiB.")


def test_running_out_of_device_memory_at_start_says_what_sizes_a_stage() -> None:
    huge = Family("asr", "kyutai", f"{__name__}:_out_of_device_memory")
    with pytest.raises(ConfigError) as caught:
        huge.from_config(GatewayConfig(warmup=False))
    message = str(caught.value)
    assert message.startswith("--asr kyutai: out of device memory while building it")
    assert "tts_max_frames" in message and message.endswith("CUDA out of memory. Tried to allocate 44.00 MiB.")
