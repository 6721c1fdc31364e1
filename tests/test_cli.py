"""``realtime-gw`` itself: grouped ``serve --help``, ``config --show``, and a parser that stays light."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

import realtime_gw.client
from realtime_gw.cli import build_parser, main
from realtime_gw.config import FIELDS, load_config
from realtime_gw.config.sections import SECTIONS
from tests.conftest import ROOT

HEAVY = ("numpy", "websockets", "soxr", "torch")


def subcommand(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("command", ["serve", "config"])
def test_settings_flags_come_in_one_group_per_section_with_their_docstrings(command: str) -> None:
    groups = {g.title: g for g in subcommand(command)._action_groups}
    for section in SECTIONS:
        group = groups[f"[{section.name}]"]
        assert group.description == section.doc
        assert [a.dest for a in group._group_actions] == list(section.fields)
        for action in group._group_actions:
            assert action.help and "(default: " in action.help, action.dest


def test_serve_help_shows_help_defaults_and_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "[tts.qwen3]: Qwen3-TTS only" in text
    assert "--tts-compile, --no-tts-compile On CUDA: torch.compile the code predictor" in text
    assert "--tts-config {auto,tiny,full,0.6b,1.7b}" in text and '(default: "auto")' in text
    assert "--port PORT TCP port" in text and "(default: 8000)" in text
    assert "REALTIME_GW_<FIELD>" in text


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "from realtime_gw.cli import main\n"
        "for argv in (['--help'], ['serve', '--help'], ['config', '--help'], ['say', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"print('heavy:', sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "heavy: []" in done.stderr, done.stderr


def test_the_client_package_names_load_on_first_use() -> None:
    assert set(realtime_gw.client.__all__) == set(realtime_gw.client._HOMES)
    for name in realtime_gw.client.__all__:
        assert getattr(realtime_gw.client, name).__name__ == name
    with pytest.raises(AttributeError):
        _ = realtime_gw.client.Nothing


def test_config_show_prints_the_effective_config_which_loads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in FIELDS:
        monkeypatch.delenv("REALTIME_GW_" + name.upper(), raising=False)
    monkeypatch.setenv("REALTIME_GW_MAX_SESSIONS", "9")
    given = tmp_path / "given.toml"
    given.write_text('[tts]\nfamily = "codec"\nmax_batch = 3\n')
    argv = ["--config", str(given), "--port", "9100", "--tts-config", "full", "--tts-voice-clone", "a=/a.wav"]
    main(["config", "--show", *argv])
    shown = tmp_path / "shown.toml"
    shown.write_text(capsys.readouterr().out)
    args = build_parser().parse_args(["serve", *argv])
    effective = load_config(args.config, overrides={k: getattr(args, k) for k in FIELDS})
    assert (effective.max_sessions, effective.tts, effective.tts_max_batch, effective.port) == (
        9,
        "codec",
        3,
        9100,
    )
    assert load_config(shown, env={}) == effective


def test_config_show_refuses_a_bad_file_with_its_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[tts]\ncompile = true\n")
    with pytest.raises(SystemExit, match=r"bad configuration: .*\[tts\] compile .* \[tts.qwen3\] compile"):
        main(["config", "--show", "--config", str(bad)])
    with pytest.raises(SystemExit, match=r"tts_config 'tiny' is not a shape of tts 'qwen3'"):
        main(["config", "--show", "--tts", "qwen3", "--tts-config", "tiny"])


@pytest.mark.parametrize("key_file", [True, False])
def test_serve_ignores_a_hangup_until_the_app_rereads_its_key_file(
    key_file: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet's key rotation sends SIGHUP to every gateway: one still loading its models must not die of
    it (the default action); without a key file the signal keeps its default meaning."""
    import signal

    import realtime_gw.app as app_module

    keys = tmp_path / "keys"
    keys.write_text("k" * 32 + "\n")
    seen: list[object] = []
    monkeypatch.setattr(app_module, "create_app", lambda config: None)
    monkeypatch.setattr(app_module, "serve", lambda app, config: seen.append(signal.getsignal(signal.SIGHUP)))
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        main(["serve", "--tts", "tone", "--policy", "none", *(["--webrtc-client-secret-key-file", str(keys)] if key_file else [])])
    finally:
        signal.signal(signal.SIGHUP, before)
    assert seen == [signal.SIG_IGN if key_file else signal.SIG_DFL]
