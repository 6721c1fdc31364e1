"""Gradio demo: type text or record audio, hear the gateway's reply as it streams.

    pip install -e '.[demo]'                      # gradio is optional: the `demo` extra
    realtime-gw serve --port 8000 --policy none &
    python examples/gradio_demo.py --url http://127.0.0.1:8000 [--api-key KEY] [--port 7860]

Built on ``realtime_gw.client.RealtimeClient``: every turn opens a session, sends the text (or the
recording, then commits), and yields the 80 ms frames to a streaming ``gr.Audio`` in ~0.4 s chunks while
the transcript and timings fill in. Gradio needs ``ffmpeg`` on PATH for streamed audio output
(``apt-get install ffmpeg``); without it the demo still works and plays the whole reply at its end.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np

from realtime_gw.client import RealtimeClient, input_session
from realtime_gw.client.protocol import text_turn
from realtime_gw.protocols import realtime as rt
from realtime_gw.protocols.audio import resample

RATE = 24000
CHUNK_SAMPLES = RATE * 4 // 10  # hand gradio ~0.4 s at a time: fewer, larger pieces play smoother
Update = tuple[tuple[int, np.ndarray] | None, str, str]


async def _turn(
    url: str, api_key: str | None, session: dict[str, Any], start: Callable[[RealtimeClient], Awaitable[None]]
) -> AsyncIterator[Update]:
    """Run one turn; yield (audio chunk, transcript, timings) as frames arrive."""
    frames: asyncio.Queue[Any] = asyncio.Queue()

    wanted = (
        rt.ResponseAudioDeltaEvent,
        rt.ResponseDoneEvent,
        rt.ErrorEvent,
        rt.ConversationItemInputAudioTranscriptionCompletedEvent,
    )

    def on_event(ev: Any, reply: Any) -> None:
        if isinstance(ev, wanted):
            frames.put_nowait(ev)

    t0 = time.perf_counter()
    heard = ""
    async with RealtimeClient(url, api_key, play=False, on_event=on_event) as client:
        await client.update_session(session)
        await start(client)
        pending = bytearray()
        first: float | None = None
        while True:
            ev = await asyncio.wait_for(frames.get(), 120)
            if isinstance(ev, rt.ConversationItemInputAudioTranscriptionCompletedEvent):
                heard = ev.transcript
                continue
            if isinstance(ev, rt.ErrorEvent):
                yield None, f"error: {ev.error.message}", ""
                return
            reply = client.state.current or client.state.last
            transcript = (f"heard: {heard}\n" if heard else "") + (reply.transcript if reply else "")
            if isinstance(ev, rt.ResponseAudioDeltaEvent):
                first = first or time.perf_counter()
                pending += ev.delta
                if len(pending) >= CHUNK_SAMPLES * 2:
                    yield (
                        (RATE, np.frombuffer(bytes(pending), dtype="<i2")),
                        transcript,
                        _timings(t0, first, reply),
                    )
                    pending.clear()
            else:  # response.done
                chunk = (RATE, np.frombuffer(bytes(pending), dtype="<i2")) if pending else None
                yield chunk, transcript, _timings(t0, first, reply, done=True)
                return


def _timings(t0: float, first: float | None, reply: Any, done: bool = False) -> str:
    parts = [f"first audio after {(first - t0) * 1000:.0f} ms" if first else "waiting for audio"]
    if reply is not None and reply.time_to_first_audio is not None:
        parts.append(f"server TTFA {reply.time_to_first_audio * 1000:.0f} ms")
    if done and reply is not None:
        parts.append(f"{reply.audio_ms / 1000:.1f} s of audio, {reply.frames} frames, status {reply.status}")
    return "; ".join(parts)


async def _whole(updates: AsyncIterator[Update]) -> AsyncIterator[Update]:
    """For a non-streaming player: pass text updates through, hand over the audio once, at the end."""
    audio: list[np.ndarray] = []
    async for chunk, transcript, timings in updates:
        if chunk is not None:
            audio.append(chunk[1])
        yield None, transcript, timings
    if audio:
        yield (RATE, np.concatenate(audio)), transcript, timings


def build(url: str, api_key: str | None, streaming: bool | None = None) -> Any:
    import gradio as gr

    # Gradio encodes streamed audio with ffmpeg; without it, play the reply whole.
    stream = shutil.which("ffmpeg") is not None if streaming is None else streaming

    async def from_text(text: str) -> AsyncIterator[Update]:
        async def start(c: RealtimeClient) -> None:
            for event in text_turn(text):
                await c.send(event)

        turn = _turn(url, api_key, {"audio": {"input": {"turn_detection": None}}}, start)
        async for update in turn if stream else _whole(turn):
            yield update

    async def from_audio(recording: tuple[int, np.ndarray] | None) -> AsyncIterator[Update]:
        if recording is None:
            yield None, "record or upload something first", ""
            return
        rate, data = recording
        mono = data if data.ndim == 1 else data.mean(axis=1)
        if mono.dtype.kind == "f":  # gradio hands float arrays for some formats
            mono = np.clip(mono * 32767, -32768, 32767)
        pcm = resample(np.asarray(mono, dtype="<i2").tobytes(), int(rate), RATE)

        async def start(c: RealtimeClient) -> None:
            await c.stream_pcm(pcm, RATE, chunk_ms=100, speed=0)  # a finished recording: no need to pace
            await c.commit()
            await c.create_response()

        turn = _turn(url, api_key, input_session(RATE, vad=False), start)
        async for update in turn if stream else _whole(turn):
            yield update

    with gr.Blocks(title="realtime_gw demo") as demo:
        gr.Markdown(f"### realtime_gw — talking to `{url}`")
        with gr.Tab("Type"):
            text = gr.Textbox(label="Say", value="Hello! This reply is streamed as it is synthesized.")
            go_text = gr.Button("Speak")
        with gr.Tab("Record"):
            mic = gr.Audio(sources=["microphone", "upload"], type="numpy", label="Your turn")
            go_audio = gr.Button("Send recording")
        out = gr.Audio(label="Reply", streaming=stream, autoplay=True)
        transcript = gr.Textbox(label="Transcript", lines=3)
        timings = gr.Textbox(label="Timings")
        go_text.click(from_text, text, [out, transcript, timings])
        go_audio.click(from_audio, mic, [out, transcript, timings])
    return demo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=7860)
    args = ap.parse_args()
    build(args.url, args.api_key).launch(server_name=args.host, server_port=args.port)


if __name__ == "__main__":
    main()
