"""Shared fixtures (live gateways on free loopback ports) and the suite's tiers.

Tiers are markers set at collection from what a test uses, so nobody marks tests by hand:
- ``live``: boots a gateway (a subprocess through ``realtime_gw.testing.gateway.start_server``, the Ray
  front-ends, or an in-process one through ``tests.server.openpi_harness.serve``), in a fixture it uses
  or in its own body;
- ``frameworks``: under tests/frameworks (each voice-agent framework's own client);
- ``browser``: under tests/web (Chromium);
- ``gpu``: needs CUDA (skipped without it);
- ``slow``: the long runs (fuzzing, soak, long conversations, model compiles), listed in ``SLOW``.
``make check`` runs what none of these mark; ``make test`` runs everything.

Gateways the tests boot pass ``--no-cpu-backend-spare``: the warm spare child (a second pocketsphinx and
Piper, ~2 CPU-s built in the background right after /readyz, beside the module's first tests) only serves
once a step is killed, and the tests that kill one keep it (test_isolation, test_faults' stuck ASR step;
the soak runs the default config). Gateways of tests that run no model and time nothing (sockets, keys,
the robot CLI) also skip warm-up (``--no-warmup``).
"""

from __future__ import annotations

import inspect
import os
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from realtime_gw.testing.gateway import LiveServer, start_server, stop_server

# Before anything imports torch (and in every gateway the tests start): OpenMP threads that spin while
# they wait starve each other when test processes, workers and gateways share two cores (a model test
# ran 3x slower beside one other torch process, and over 100x on a busy box). Waiting passively changes
# no result, only who gets the core.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]

LAUNCHERS = {
    ("realtime_gw.testing.gateway", "start_server"),
    ("tests.server.ray_cluster", "start_front_ends"),
    ("tests.server.openpi_harness", "serve"),
}
"""(module, name) of what boots a gateway; a test or fixture whose code names one of them is ``live``."""

SLOW = {
    "tests/fuzz/test_atheris_smoke.py",
    "tests/fuzz/test_socket_fuzz.py",
    "tests/loadtest/test_soak.py",
    "tests/server/test_long_conversation.py",
    "tests/server/test_isolation.py",
    "tests/server/test_transcriptions_live.py::test_live_call_stays_on_time_while_a_long_file_is_transcribed",
    "tests/server/test_ray_frontends.py",
    "tests/models/policy/test_compile_cache.py",
    "tests/models/test_remote_env.py::test_a_local_cluster_inherits_no_secret_from_the_front_ends_environment",
    "tests/models/speech/test_tts_qwen3_kinds.py::test_icl_clone_streams_keep_cached_voices",
    "tests/models/speech/test_tts_qwen3.py::test_cached_prompt_equals_prefill",
    "tests/models/policy/test_pi0_fast.py::test_compiled_prefix_is_the_same_function_in_two_compiles",
}
"""Files (or ``file::test`` ids) of long runs: tens of seconds a test (soak, fuzzing, attacks, long
conversations, compiles, a Ray cluster), or 5 s and more for a test that boots no gateway."""

LONGEST_FIRST = [
    "tests/server/test_transcriptions_live.py",
    "tests/server/test_isolation.py",
    "tests/server/test_tts_qwen3_kinds_live.py",
    "tests/loadtest/test_soak.py",
    "tests/server/test_tts_backends.py",
    "tests/server/test_faults.py",
    "tests/models/policy/test_pi0_fast.py",
    "tests/server/test_ray_frontends.py",
    "tests/server/test_voices_live.py",
    "tests/server/test_s2s_live.py",
    "tests/models/policy/test_compile_cache.py",
    "tests/server/webrtc/test_calls.py",
    "tests/server/test_live_sdk.py",
    "tests/server/test_realtime_sdk.py",
    "tests/frameworks/test_livekit_live.py",
    "tests/frameworks/test_pipecat_live.py",
    "tests/web/test_browser.py",
    "tests/models/fused/test_qwen3_frame.py",
    "tests/web/test_agents_sdk.py",
    "tests/models/speech/test_tts_qwen3_kinds.py",
    "tests/server/test_duplex_live.py",
    "tests/server/test_listener.py",
    "tests/models/fused/test_pi0_expert.py",
    "tests/models/speech/test_tts_qwen3.py",
]
"""The files that take longest (15-155 s each on two cores), longest first: spread over several workers,
they start first so that no worker is left with a long file at the end (what follows them is a few
seconds a file)."""


@pytest.fixture(scope="session")
def voice_server() -> Iterator[LiveServer]:
    """The embedded CPU models (Piper, pocketsphinx, Silero) with the echo responder."""
    server = start_server(
        "--policy", "none", "--api-key", "test-key", "--max-input-buffer-bytes", "2000000",
        "--tts-deterministic", "--no-cpu-backend-spare", name="voice",
    )  # fmt: skip
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def tone_server() -> Iterator[LiveServer]:
    """Cheap sine TTS and a session limit of 2, for gateway-level behaviour."""
    server = start_server(
        "--policy", "none", "--tts", "tone", "--max-sessions", "2", "--no-cpu-backend-spare", name="tone"
    )
    yield server
    stop_server(server)


# -- tiers ------------------------------------------------------------------------------------------------
def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def boots_a_gateway(fn: Callable[..., Any], seen: set[Any] | None = None) -> bool:
    """Whether ``fn``'s code (nested functions included) names one of ``LAUNCHERS``, itself or through
    a helper of the test tree that does."""
    seen = set() if seen is None else seen
    fn = inspect.unwrap(fn)
    code, names = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
    if code is None or fn in seen:
        return False
    seen.add(fn)
    for inner in _code_objects(code):
        for name in inner.co_names:
            target = names.get(name)
            where = getattr(target, "__module__", None) or ""
            if (where, getattr(target, "__name__", None)) in LAUNCHERS:
                return True
            if where.startswith("tests.") and inspect.isfunction(target) and boots_a_gateway(target, seen):
                return True
    return False


def _is_live(item: pytest.Item) -> bool:
    if isinstance(item, pytest.Function) and boots_a_gateway(item.obj):
        return True
    fixtures = getattr(item, "_fixtureinfo", None)
    if fixtures is None:
        return False
    # name2fixturedefs holds the whole closure: a fixture built on a live fixture is seen here too.
    return any(boots_a_gateway(d.func) for defs in fixtures.name2fixturedefs.values() for d in defs)


def _needs_cuda(item: pytest.Item) -> bool:
    return item.get_closest_marker("gpu") is not None or any(
        "cuda" in str(m.kwargs.get("reason", "")).lower() for m in item.iter_markers("skipif")
    )


def _relative_path(item: pytest.Item) -> str:
    path = Path(str(item.path)).resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.as_posix()


def tiers_of(item: pytest.Item) -> set[str]:
    rel = _relative_path(item)
    tiers = set()
    if _is_live(item):
        tiers.add("live")
    if rel.startswith("tests/frameworks/"):
        tiers.add("frameworks")
    if rel.startswith("tests/web/"):
        tiers.add("browser")
    if _needs_cuda(item):
        tiers.add("gpu")
    if rel in SLOW or f"{rel}::{item.name.split('[')[0]}" in SLOW:
        tiers.add("slow")
    return tiers


def _longest_first(item: pytest.Item) -> int:
    rel = _relative_path(item)
    return LONGEST_FIRST.index(rel) if rel in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a pytest-xdist worker (each collects): files in our order
        items.sort(key=_longest_first)  # stable: the other files, and tests within a file, keep their order
    cuda: bool | None = None
    for item in items:
        for tier in sorted(tiers_of(item)):
            item.add_marker(tier)
        if item.get_closest_marker("gpu") is not None:
            if cuda is None:
                import torch

                cuda = torch.cuda.is_available()
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs CUDA"))
