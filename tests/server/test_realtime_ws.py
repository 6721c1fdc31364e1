"""The realtime connection's reader: large frames are decoded on a thread, in order."""

from __future__ import annotations

import base64
import json
import threading
from typing import Any, cast

import pytest

from realtime_gw.protocols import realtime as rt
from realtime_gw.server import realtime_input, realtime_ws
from tests.server import fakes


def _append(n_bytes: int) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\1\0" * (n_bytes // 2)).decode()})


async def test_large_frames_are_decoded_off_the_loop_and_keep_their_order(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded_on: list[tuple[int, bool]] = []
    decode = rt.decode_client_event

    def spy(raw: bytes | str) -> Any:
        decoded_on.append((len(raw), threading.current_thread() is threading.main_thread()))
        return decode(raw)

    monkeypatch.setattr(rt, "decode_client_event", spy)
    ws = fakes.FakeSocket()
    conn = realtime_ws.RealtimeConnection(cast(Any, ws), fakes.gateway(), cast(Any, None))
    big = realtime_input.OFFLOAD_DECODE_BYTES
    frames = [_append(3200), _append(big), _append(6400), json.dumps({"type": "input_audio_buffer.commit"})]
    for frame in frames:
        ws.feed_text(frame)
    ws.feed_disconnect()
    await conn._reader()
    events = [conn.mailbox.get_nowait().event for _ in range(len(frames))]
    assert [len(e.audio) for e in events[:3]] == [3200, big // 2 * 2, 6400]
    assert isinstance(events[3], rt.InputAudioBufferCommitEvent)
    assert [on_loop for _, on_loop in decoded_on] == [True, False, True, True]
