"""Every effect interpreter is exhaustive: each effect type a session can return has its ``case``,
and an effect no case knows raises instead of being dropped."""

from __future__ import annotations

import ast
import inspect
import textwrap
import typing
from collections.abc import Callable
from typing import Any, cast

import pytest

from realtime_gw.server import openpi_ws, realtime_ws, speech_stream
from realtime_gw.server.listen_effects import Listening
from realtime_gw.sessions import events, openpi, speech
from tests.server import fakes


def effect_types(union: Any) -> set[str]:
    return {t.__name__ for t in typing.get_args(union)}


def cases(function: Callable[..., Any]) -> tuple[set[str], ast.match_case]:
    """The classes the ``match`` of ``function`` names, and its last case."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    (match,) = [node for node in ast.walk(tree) if isinstance(node, ast.Match)]
    names = {
        ast.unparse(p.cls)
        for case in match.cases
        for p in ast.walk(case.pattern)
        if isinstance(p, ast.MatchClass)
    }
    return names, match.cases[-1]


INTERPRETERS = {
    "realtime": (realtime_ws.RealtimeConnection._run_effects, events.Effect),
    "openpi": (openpi_ws._Loop._execute, openpi.OpenPIEffect),
    "speech": (speech_stream.SpeechStream._run_effects, speech.SpeechEffect),
}


@pytest.mark.parametrize("name", sorted(INTERPRETERS))
def test_every_effect_type_has_its_case_and_the_rest_raises(name: str) -> None:
    interpreter, union = INTERPRETERS[name]
    handled, last = cases(interpreter)
    assert handled == effect_types(union), f"{name}: effects without a case, or cases of no effect"
    assert isinstance(last.pattern, ast.MatchAs) and last.pattern.pattern is None  # case _:
    assert ast.unparse(last.body[0]).startswith("unhandled(")


def test_the_listening_part_handles_every_listen_effect() -> None:

    handled, _ = cases(Listening.run)
    assert handled == effect_types(events.ListenEffect)
    assert effect_types(events.ListenEffect) <= effect_types(events.Effect)


async def test_an_unknown_effect_raises() -> None:
    with pytest.raises(TypeError, match="no interpreter for the effect"):
        realtime_ws.RealtimeConnection(
            cast(Any, fakes.FakeSocket()), fakes.gateway(), cast(Any, None)
        )._run_effects([cast(Any, object())])
    with pytest.raises(TypeError, match="no interpreter for the effect"):
        speech_stream.SpeechStream(cast(Any, fakes.FakeSocket()), fakes.gateway())._run_effects(
            [cast(Any, object())]
        )
