"""Client subcommands of ``realtime-gw``: ``say``, ``talk`` and ``robot``. Progress goes to stderr,
results (transcripts, actions) to stdout. Heavy imports wait until a command runs, so ``serve`` does not
pay for them."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"  # client.protocol.DEFAULT_URL, not imported: the parser stays light


def add_client_commands(sub: Any) -> None:
    """Register the client subcommands on ``build_parser``'s subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=os.environ.get("REALTIME_GW_URL", DEFAULT_URL),
        help="server base URL (http[s]:// or ws[s]://; a path, if given, is used as is) [$REALTIME_GW_URL]",
    )
    common.add_argument(
        "--api-key", default=os.environ.get("REALTIME_GW_API_KEY"), help="API key [$REALTIME_GW_API_KEY]"
    )
    common.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for a reply")

    say = sub.add_parser("say", parents=[common], help="speak text through the server's TTS into a WAV")
    say.add_argument("text")
    say.add_argument("-o", "--output", default="say.wav", help="output WAV (24 kHz PCM16)")
    say.add_argument("--voice", default=None)
    say.set_defaults(func=cmd_say)

    talk = sub.add_parser(
        "talk", parents=[common], help="stream a WAV as a microphone would (server VAD) and save the reply"
    )
    talk.add_argument("input", help="input sound file (any rate; 16/24 kHz are sent as is)")
    talk.add_argument("-o", "--output", default="reply.wav", help="reply WAV (24 kHz PCM16)")
    talk.add_argument("--speed", type=float, default=1.0, help="pacing relative to real time (0 = unpaced)")
    talk.add_argument("--tail-ms", type=int, default=1500, help="silence appended, as a mic keeps sending")
    talk.add_argument("--no-vad", action="store_true", help="commit manually instead of server VAD")
    talk.add_argument("--voice", default=None)
    talk.set_defaults(func=cmd_talk)

    robot = sub.add_parser("robot", parents=[common], help="OpenPI round trips against the robot socket")
    robot.add_argument(
        "--obs", default="sample", help="'sample' (zeros shaped from the metadata frame) or an .npz of arrays"
    )
    robot.add_argument("--steps", type=int, default=3, help="observations to send")
    robot.add_argument("--prompt", default="pick up the cup")
    robot.add_argument("--seed", type=int, default=None, help="random images/state instead of zeros")
    robot.set_defaults(func=cmd_robot)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1000:.0f} ms"


# -- say ---------------------------------------------------------------------------------------------------
def _run(coro: Any) -> int:
    """Run a command; connection and server errors become one line and exit status 2, not a traceback."""
    import websockets

    from realtime_gw.client.protocol import ServerError

    try:
        return asyncio.run(coro)
    except (
        OSError,
        TimeoutError,
        websockets.InvalidHandshake,
        websockets.ConnectionClosed,
        ServerError,
    ) as e:
        _log(f"realtime-gw: {type(e).__name__}: {e}")
        return 2


def cmd_say(args: argparse.Namespace) -> int:
    return _run(_say(args))


async def _say(args: argparse.Namespace) -> int:
    from realtime_gw.client.audio import write_wav
    from realtime_gw.client.realtime import RealtimeClient

    t0 = time.perf_counter()
    async with RealtimeClient(args.url, args.api_key, play=False) as c:
        _log(f"connected to {c.url} as {c.session_id} in {_ms(c.connect_s)}")
        session: dict[str, Any] = {"audio": {"input": {"turn_detection": None}}}
        if args.voice:
            session["audio"]["output"] = {"voice": args.voice}
        await c.update_session(session)
        reply = await c.say(args.text, timeout=args.timeout)
    assert reply.audio is not None
    write_wav(args.output, bytes(reply.audio))
    _log(
        f"{reply.status}: {reply.frames} frames, {reply.audio_ms / 1000:.2f} s of audio -> {args.output}; "
        f"first audio {_ms(reply.time_to_first_audio)}, total {_ms(time.perf_counter() - t0)}"
    )
    print(reply.transcript)
    return 0 if reply.status == "completed" and reply.frames else 1


# -- talk --------------------------------------------------------------------------------------------------
def cmd_talk(args: argparse.Namespace) -> int:
    return _run(_talk(args))


async def _talk(args: argparse.Namespace) -> int:
    from realtime_gw.client.audio import read_wav, silence, write_wav
    from realtime_gw.client.protocol import input_session
    from realtime_gw.client.realtime import RealtimeClient
    from realtime_gw.protocols import realtime as rt

    pcm, rate = read_wav(args.input)
    pcm += silence(args.tail_ms, rate)
    t0 = time.perf_counter()

    def on_event(ev: Any, reply: Any) -> None:
        now = time.perf_counter() - t0
        if isinstance(ev, rt.InputAudioBufferSpeechStartedEvent):
            _log(f"[{now:6.2f}s] speech started at {ev.audio_start_ms} ms")
        elif isinstance(ev, rt.InputAudioBufferSpeechStoppedEvent):
            _log(f"[{now:6.2f}s] speech stopped at {ev.audio_end_ms} ms")
        elif isinstance(ev, rt.ConversationItemInputAudioTranscriptionCompletedEvent):
            _log(f"[{now:6.2f}s] heard: {ev.transcript!r}")
        elif isinstance(ev, rt.ResponseAudioDeltaEvent) and ev.seq == 0:
            _log(
                f"[{now:6.2f}s] first reply audio ({_ms(reply.turn_latency if reply else None)} after speech stopped)"
            )
        elif isinstance(ev, rt.ResponseDoneEvent):
            _log(f"[{now:6.2f}s] response {ev.response.status}")
        elif isinstance(ev, rt.ErrorEvent):
            _log(f"[{now:6.2f}s] error: {ev.error.message}")

    async with RealtimeClient(args.url, args.api_key, play=False, on_event=on_event) as c:
        _log(f"connected to {c.url} as {c.session_id} in {_ms(c.connect_s)}")
        await c.update_session(input_session(rate, vad=not args.no_vad, voice=args.voice))
        _log(f"streaming {args.input} ({len(pcm) / 2 / rate:.2f} s at {rate} Hz, x{args.speed or 'inf'})")
        await c.stream_pcm(pcm, rate, speed=args.speed)
        if args.no_vad:
            await c.commit()
            await c.create_response()
        replies = await _await_turns(c, args.timeout)
    if not replies:
        _log("no reply: no speech was detected in the input")
        return 1
    audio = b"".join(bytes(r.audio or b"") for r in replies)
    write_wav(args.output, audio)
    _log(
        f"{len(replies)} repl{'y' if len(replies) == 1 else 'ies'}, {len(audio) / 48000:.2f} s -> {args.output}"
    )
    for r in replies:
        print(r.transcript)
    return 0 if all(r.status == "completed" for r in replies) else 1


async def _await_turns(c: Any, timeout: float) -> list[Any]:
    """Wait until every committed turn has been answered (no response running, none about to start)."""
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    while time.monotonic() < deadline:
        st = c.state
        busy = st.speaking or st.current is not None or st.responses_created < st.commits
        if busy:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > 1.0:  # grace for VAD/commit events still on their way
            break
        await asyncio.sleep(0.05)
    return [r for r in c.state.replies.values() if r.done]


# -- robot -------------------------------------------------------------------------------------------------
def cmd_robot(args: argparse.Namespace) -> int:
    import numpy as np

    from realtime_gw.client.openpi import OpenPIClient, PolicyServerError, sample_observation

    t0 = time.perf_counter()
    client = OpenPIClient(args.url, args.api_key)
    try:
        metadata = client.connect()
    except Exception as e:  # refused upgrade (policy=none), connection refused, ...
        _log(f"robot socket at {client.url} did not answer: {e}")
        return 2
    with client:
        cfg = metadata.get("policy_server_config", {})
        _log(
            f"connected to {client.url} in {_ms(time.perf_counter() - t0)}: model={cfg.get('model')} "
            f"cameras={cfg.get('camera_keys')} state={cfg.get('state_key')}[{cfg.get('state_dim')}] "
            f"horizon={cfg.get('action_horizon')} action_dim={cfg.get('action_dim')}"
        )
        if args.obs == "sample":
            obs = sample_observation(metadata, args.prompt, args.seed)
        else:
            with np.load(args.obs) as npz:
                obs = {k: npz[k] for k in npz.files}
            obs.setdefault(cfg.get("prompt_key", "prompt"), args.prompt)
        rtts: list[float] = []
        for step in range(args.steps):
            try:
                out = client.infer(obs, timeout=args.timeout)
            except PolicyServerError as e:
                _log(f"step {step}: server refused the observation: {e}")
                return 1
            rtts.append(client.last_rtt_s or 0.0)
            actions = np.asarray(out.get(cfg.get("action_key", "actions")))
            timing = out.get("server_timing", {})
            _log(
                f"step {step}: round trip {_ms(client.last_rtt_s)}, server infer {timing.get('infer_ms', 0):.1f} ms"
            )
            np.set_printoptions(precision=4, suppress=True, linewidth=120)
            print(
                f"actions {actions.shape} {actions.dtype}: first row {actions[0] if actions.ndim > 1 else actions}"
            )
        rtts.sort()
        _log(f"{len(rtts)} round trips: median {_ms(rtts[len(rtts) // 2])}, max {_ms(rtts[-1])}")
    return 0
