"""Config files in sections or flat, clear refusals, and ``to_toml`` read back to the same config."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from realtime_gw.config import ConfigError, GatewayConfig, SettingsFileError, load_config, to_toml


def load_text(tmp_path: Path, text: str) -> GatewayConfig:
    path = tmp_path / "gw.toml"
    path.write_text(text)
    return load_config(path, env={})


def test_sections_map_to_the_flat_fields(tmp_path: Path) -> None:
    cfg = load_text(
        tmp_path,
        'port = 9001\ntts_voice = "vivian"\n'
        '[tts]\nfamily = "qwen3"\ndevice = "cuda"\n[tts.qwen3]\ncompile = true\nvoice_design = ["a=b"]\n'
        '[workers]\nmax_active = 7\n[robot]\npreset = "aloha"\nimage_history = [-1, 0]\n'
        '[responder]\nkind = "openai"\n[asr.kyutai]\ndevice = "cuda:1"\n',
    )
    assert (cfg.port, cfg.tts_voice, cfg.tts, cfg.tts_device, cfg.tts_compile) == (
        9001,
        "vivian",
        "qwen3",
        "cuda",
        True,
    )
    assert cfg.tts_voice_design == ["a=b"] and cfg.worker_max_active == 7
    assert (cfg.robot, cfg.openpi_image_history, cfg.responder, cfg.asr_device) == (
        "aloha",
        [-1, 0],
        "openai",
        "cuda:1",
    )


def test_a_subsection_may_be_written_inline(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, '[tts]\nfamily = "qwen3"\nqwen3 = { language = "english" }\n')
    assert cfg.tts_language == "english"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[tts]\ncompile = true\n",
            r"\[tts\] compile is not a setting of this table; did you mean \[tts.qwen3\] compile",
        ),
        ("[tts]\ntts_device = 'cuda'\n", r"\[tts\] tts_device is a flat name: .* \[tts\] device"),
        ("[tts]\nnonsense = 1\n", r"\[tts\] nonsense is not a setting"),
        ("[nonsense]\nx = 1\n", r"nonsense is not a setting"),
        ("[tts.piper]\nvoice = 'joe'\n", r"\[tts.piper\] voice .* did you mean \[tts\] voice"),
        ("tts_device = 'cpu'\n[tts]\ndevice = 'cuda'\n", r"tts_device is set twice .*\[tts\] device"),
        ("server = 1\n", r"server is a section"),
        ("[webrtc]\nmax_client_secrets = 64\n", r"max_client_secrets is no longer a setting: client secrets are sealed"),
    ],
)
def test_a_key_in_no_or_the_wrong_table_is_named(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SettingsFileError, match=message) as e:
        load_text(tmp_path, text)
    assert "gw.toml" in str(e.value)
    assert isinstance(e.value, msgspec.ValidationError)  # what `serve` reports as a bad configuration


def roundtrip(cfg: GatewayConfig, tmp_path: Path, secrets: bool = False) -> GatewayConfig:
    return load_text(tmp_path, to_toml(cfg, secrets=secrets))


def test_to_toml_reads_back_to_the_same_config(tmp_path: Path) -> None:
    assert roundtrip(GatewayConfig(), tmp_path) == GatewayConfig()
    cfg = GatewayConfig(
        port=9100, tts="qwen3", tts_config="1.7b", tts_instructions='Say "hi"\n\tslowly \\ please',
        tts_voice_clone=["anna=/v/a.wav:Hello, there."], asr_flush_s=0.5, ray_num_gpus=0.25,
        robot_delta_actions=False, policy_graph_buckets=[1, 3], policy_fp8_max_error=1e-6,
        input_audio_rate_factor=float("inf"), allowed_origins=["*"], fault_injection=["tts:raise@3"],
    )  # fmt: skip
    assert roundtrip(cfg, tmp_path) == cfg


def test_credentials_are_shown_only_when_asked(tmp_path: Path) -> None:
    cfg = GatewayConfig(
        api_key="k-123", api_keys=["k-456"], responder_api_key="sk-789",
        webrtc_client_secret_key="seal-key-0123456789", webrtc_client_secret_previous_keys=["open-key-0123456789"],
    )  # fmt: skip
    hidden = to_toml(cfg)
    for credential in ("k-123", "k-456", "sk-789", "seal-key-0123456789", "open-key-0123456789"):
        assert credential not in hidden
    assert "# api_key = (set, not shown" in hidden
    assert roundtrip(cfg, tmp_path, secrets=True) == cfg


def test_the_toml_carries_each_sections_and_fields_docstring() -> None:
    text = to_toml(GatewayConfig())
    assert "[tts.qwen3]\n" in text and "# Qwen3-TTS only" in text
    assert "# Address to listen on" in text and 'host = "127.0.0.1"' in text
    assert "# asr_flush_s" not in text and "# flush_s = (unset)" in text


def test_tts_config_auto_is_the_familys_default_shape_and_a_foreign_shape_is_refused() -> None:
    assert GatewayConfig(tts="codec").tts_shape == "tiny"
    assert GatewayConfig(tts="qwen3").tts_shape == "0.6b"
    assert GatewayConfig(tts="qwen3", tts_config="1.7b").tts_shape == "1.7b"
    assert GatewayConfig(tts="codec", tts_config="full").tts_shape == "full"
    with pytest.raises(
        ConfigError, match=r"tts_config 'tiny' is not a shape of tts 'qwen3': use one of 0.6b, 1.7b"
    ):
        GatewayConfig(tts="qwen3", tts_config="tiny")
    with pytest.raises(msgspec.ValidationError, match=r"tts_config '0.6b' is not a shape of tts 'codec'"):
        load_config(env={}, overrides={"tts": "codec", "tts_config": "0.6b"})
    assert load_config(env={}, overrides={"tts": "piper"}).tts_config == "auto"
