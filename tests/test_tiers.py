"""The tiers of tests/conftest.py: what boots a gateway is found in a test's code, its fixtures and the
test helpers they call; every test of this run that uses a gateway fixture carries ``live``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from realtime_gw.testing.gateway import LiveServer, start_server, stop_server
from tests.conftest import LONGEST_FIRST, ROOT, SLOW, boots_a_gateway
from tests.server.openpi_harness import serve
from tests.server.ray_cluster import start_front_ends


def _helper_that_boots() -> LiveServer:
    return start_server("--tts", "tone")


def _helper_that_does_not() -> int:
    return len("no gateway here")


def test_a_launcher_in_the_code_or_behind_a_helper_is_found() -> None:
    def direct() -> None:
        stop_server(start_server("--tts", "tone"))

    def through_a_helper() -> None:
        stop_server(_helper_that_boots())

    def nested() -> None:
        def inner() -> None:
            _helper_that_boots()

        inner()

    assert boots_a_gateway(direct) and boots_a_gateway(through_a_helper) and boots_a_gateway(nested)
    assert not boots_a_gateway(_helper_that_does_not)


def test_an_in_process_or_ray_gateway_is_a_launcher_too() -> None:
    def in_process() -> None:
        with serve(None, None):  # type: ignore[arg-type]
            pass

    def on_ray() -> None:
        start_front_ends(2, [])  # type: ignore[call-arg]

    assert boots_a_gateway(in_process) and boots_a_gateway(on_ray)


@pytest.fixture
def _a_gateway_fixture() -> Iterator[None]:
    stop_server(_helper_that_boots())
    yield


def test_a_fixture_that_boots_one_is_found() -> None:
    assert boots_a_gateway(_a_gateway_fixture.__wrapped__)  # type: ignore[attr-defined]


def test_every_test_using_a_shared_gateway_is_live(request: pytest.FixtureRequest) -> None:
    shared = {"voice_server", "tone_server", "gateway"}
    unmarked = [
        item.nodeid
        for item in request.session.items
        if shared & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("live") is None
    ]
    assert not unmarked
    mine = request.node
    assert mine.get_closest_marker("live") is None and mine.get_closest_marker("slow") is None


def test_the_files_named_for_order_and_tiers_exist() -> None:
    """A renamed or split file drops out of ``LONGEST_FIRST`` or ``SLOW`` without a word otherwise."""
    missing = [entry for entry in [*LONGEST_FIRST, *SLOW] if not (ROOT / entry.split("::")[0]).is_file()]
    assert not missing
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
