"""examples/gradio_demo.py: its turn generator streams a reply (no browser); the UI builds where gradio is."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from realtime_gw.client import RealtimeClient
from realtime_gw.client.protocol import user_text
from realtime_gw.protocols import realtime as rt
from realtime_gw.testing.gateway import LiveServer
from tests.conftest import ROOT


def load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gradio_demo", ROOT / "examples" / "gradio_demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def collect(gen: AsyncIterator[Any]) -> list[Any]:
    return [u async for u in gen]


async def test_text_turn_streams_audio_in_chunks(voice_server: LiveServer) -> None:
    demo = load_demo()
    text = "Thank you very much for your help. We will meet at the station tomorrow morning."

    async def start(c: RealtimeClient) -> None:
        await c.send(user_text(text))
        await c.send(rt.ResponseCreateEvent())

    updates = await collect(
        demo._turn(voice_server.http, "test-key", {"audio": {"input": {"turn_detection": None}}}, start)
    )
    chunks = [u[0] for u in updates if u[0] is not None]
    assert len(chunks) >= 3, "the reply arrives in several pieces, not at the end"
    assert all(rate == 24000 and pcm.dtype == np.dtype("<i2") for rate, pcm in chunks)
    assert sum(len(pcm) for _, pcm in chunks) > 24000
    assert updates[-1][1] == text
    assert "status completed" in updates[-1][2]


def test_ui_builds_when_gradio_is_installed() -> None:
    pytest.importorskip("gradio")
    demo = load_demo().build("http://127.0.0.1:1", None)
    assert type(demo).__name__ == "Blocks"
