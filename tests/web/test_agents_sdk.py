"""OpenAI's own browser SDK, ``@openai/agents-realtime`` from npm, calls the gateway over WebRTC in headless
Chromium (its microphone a WAV) inside a network namespace that has only loopback: an ``ek_`` secret,
``connect()``, a spoken turn answered on the track, ``interrupt()`` clears the playing reply.

The package is installed with npm at test time (pinned; kept in a cache directory between runs) and its
browser bundle served as it ships. The browser side runs in ``tests/web/agents_sdk_call.py`` under
``unshare -rn``; this test judges what it saw. Skipped, with the reason, where ``unshare`` (or
unprivileged user namespaces), Chromium or npm is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from realtime_gw.testing.audio import wer
from realtime_gw.testing.gateway import ARTIFACTS, CODE_ROOT
from tests.web.agents_sdk_call import SPOKEN
from tests.web.chromium import MISSING

SDK_VERSION = "0.20.0"
NPM = shutil.which("npm")


def _namespace_refusal() -> str:
    if shutil.which("unshare") is None:
        return "unshare (util-linux) not installed"
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"no unprivileged network namespace here (unshare -rn: {probe.stderr.strip()})"
    return ""


REFUSAL = MISSING or ("npm not installed" if NPM is None else "") or _namespace_refusal()
pytestmark = pytest.mark.skipif(bool(REFUSAL), reason=REFUSAL)


def sdk_bundle() -> Path:
    """The SDK's browser bundle (``dist/bundle``), installed by npm into a cache directory once."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    prefix = cache / "realtime_gw" / f"agents-realtime-{SDK_VERSION}"
    bundle = prefix / "node_modules" / "@openai" / "agents-realtime" / "dist" / "bundle"
    if not (bundle / "openai-realtime-agents.mjs").exists():
        prefix.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [NPM or "npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--no-save",
             f"@openai/agents-realtime@{SDK_VERSION}"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, f"npm install failed:\n{done.stderr[-3000:]}"
    return bundle


def test_agents_realtime_sdk_calls_talks_and_interrupts(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    run = subprocess.run(
        ["unshare", "-rn", sys.executable, "-m", "tests.web.agents_sdk_call", str(sdk_bundle()), str(out)],
        cwd=CODE_ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert run.returncode == 0 and out.exists(), f"the namespaced run failed:\n{run.stderr[-5000:]}"
    seen = json.loads(out.read_text())
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "agents-sdk-call.json").write_text(out.read_text())  # Chromium's stats of the reply track
    assert seen["interfaces"] == ["lo"], "the browser and the gateway had more than loopback"
    assert seen["secret_prefix"] == "ek_"
    assert "failed" not in seen, seen.get("failed")
    connected = seen["connected"]
    assert connected["status"] == "connected" and connected["call_id"].startswith("rtc_"), connected
    assert seen["calls_while_connected"] == 1

    # The spoken turn: heard (transcribed), answered, and the answer's audio reached the browser's track.
    first = seen["first_reply"]
    assert wer(SPOKEN, first["transcripts"][0]) <= 0.4, first["transcripts"]
    inbound = first["inbound"]
    assert inbound["energy"] > 0.02, f"no sound on the reply track: {inbound}"
    # How much Chromium conceals is a speed figure (the WebRTC calls bench reports it): on this shared box one
    # stall of the gateway's process shows as ~0.1 s of it. A reply whose frames came paced wrong conceals more.
    assert inbound["concealed"] <= 0.05 * inbound["samples"], f"the browser concealed over 5 %: {inbound}"

    # interrupt(): response.cancel + output_audio_buffer.clear; the track goes quiet, the item is truncated.
    assert seen["energy_while_playing_1s"] > 0.02, seen
    assert seen["energy_after_clear_1s"] < 0.05 * seen["energy_while_playing_1s"], seen
    after = seen["after_interrupt"]
    events = after["events"]
    assert events.index("output_audio_buffer.started") < events.index("output_audio_buffer.stopped")
    assert "output_audio_buffer.cleared" in events and "conversation.item.truncated" in events
    assert 300 <= after["truncated"][0] <= 8000, after["truncated"]
    assert not after["errors"], after["errors"]
    assert seen["call_ended"], "close() did not end the call on the gateway"
    assert not seen["gateway_errors"], seen["gateway_errors"]
