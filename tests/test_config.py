"""Config precedence: defaults < TOML file < environment < CLI flags."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from realtime_gw.cli import build_parser
from realtime_gw.config import FIELDS, load_config


def test_precedence(tmp_path: Path) -> None:
    toml = tmp_path / "gw.toml"
    toml.write_text('port = 9001\ntts = "tone"\nmax_sessions = 5\naudio_lead_ms = 100\n')
    env = {"REALTIME_GW_PORT": "9002", "REALTIME_GW_MAX_SESSIONS": "7", "REALTIME_GW_OPENPI_IMAGE_HISTORY": "[-2,-1,0]"}
    cfg = load_config(toml, env=env, overrides={"port": 9003, "tts": None})
    assert cfg.port == 9003  # CLI beats env beats file
    assert cfg.max_sessions == 7  # env beats file
    assert cfg.tts == "tone" and cfg.audio_lead_ms == 100  # file beats default
    assert cfg.openpi_image_history == [-2, -1, 0]
    assert load_config(env={}).port == 8000


def test_bad_values_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(msgspec.ValidationError):
        load_config(env={"REALTIME_GW_TTS": "espeak"})
    toml = tmp_path / "gw.toml"
    toml.write_text("no_such_option = 1\n")
    with pytest.raises(msgspec.ValidationError):
        load_config(toml, env={})


def test_every_field_is_a_cli_flag() -> None:
    args = build_parser().parse_args(["serve", "--port", "1234", "--tts", "tone", "--no-warmup", "--api-key", "k"])
    cfg = load_config(env={}, overrides={k: getattr(args, k) for k in FIELDS})
    assert (cfg.port, cfg.tts, cfg.warmup, cfg.api_key) == (1234, "tone", False, "k")


def test_list_flags_repeat_or_take_a_json_list() -> None:
    argv = ["serve", "--tts-voice-clone", "anna=/v/a.wav", "--tts-voice-clone", "bob=/v/b.wav:Hi, there."]
    argv += ["--tts-voice-design", '["narrator=A warm, low voice", "host=bright"]']
    args = build_parser().parse_args(argv)
    cfg = load_config(env={}, overrides={k: getattr(args, k) for k in FIELDS})
    assert cfg.tts_voice_clone == ["anna=/v/a.wav", "bob=/v/b.wav:Hi, there."]
    assert cfg.tts_voice_design == ["narrator=A warm, low voice", "host=bright"]
    assert load_config(env={}).tts_voice_clone == []
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--fault-injection", "[not json"])


def test_robot_flags_and_start_up_errors_exit_with_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    import realtime_gw.app
    from realtime_gw.cli import serve
    from realtime_gw.config import ConfigError

    argv = ["serve", "--robot", "aloha", "--no-robot-delta-actions", "--policy-norm-mode", "quantile"]
    args = build_parser().parse_args(argv)
    cfg = load_config(env={}, overrides={k: getattr(args, k) for k in FIELDS})
    assert (cfg.robot, cfg.robot_delta_actions, cfg.policy_norm_mode) == ("aloha", False, "quantile")
    assert load_config(env={}).robot_delta_actions is None  # unset: the robot's openpi default

    def refuse(config: object) -> None:
        raise ConfigError("/ckpt/norm_stats.json: state.mean has shape (7,), need at least (14,)")

    monkeypatch.setattr(realtime_gw.app, "create_app", refuse)
    with pytest.raises(SystemExit, match=r"realtime-gw: /ckpt/norm_stats.json: state.mean has shape"):
        serve(args)
