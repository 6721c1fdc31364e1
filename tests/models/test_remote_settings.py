"""The settings a stage's Ray actors and front-ends must agree on come from the config's sections."""

from __future__ import annotations

import pytest

from realtime_gw.config import FIELDS, SECRETS, GatewayConfig
from realtime_gw.models.remote.settings import STAGE_SETTINGS, stage_settings

# The rule these sections replaced (fields chosen by name prefix), kept as the oracle.
COMMON = (
    "warmup", "worker_max_active", "worker_step_timeout_s", "cpu_backends_in_process", "cpu_backend_spare",
    "fault_injection", "device_clock", "gil_switch_interval_ms",
)  # fmt: skip
PREFIXES = {
    "tts": ("tts",),
    "asr": ("asr",),
    "vad": ("vad",),
    "turn": ("turn",),
    "policy": ("policy", "robot", "openpi_image_history", "openpi_state_history", "openpi_max_sessions"),
    "s2s": ("s2s",),
}
SESSION_ONLY = {"s2s_reply_end_ms", "s2s_silence_dbfs"}
"""Read by the front-end's sessions (where a reply ends), not by the stage: front-ends may differ."""


@pytest.mark.parametrize("role", sorted(STAGE_SETTINGS))
def test_each_stage_gets_the_same_fields_as_before(role: str) -> None:
    before = {
        f for f in FIELDS if f in COMMON or (f.startswith(PREFIXES[role]) and f not in SECRETS)
    } - SESSION_ONLY
    assert set(stage_settings(role, GatewayConfig())) == before
    assert set(STAGE_SETTINGS) == set(PREFIXES)
