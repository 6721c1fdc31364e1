"""Coverage-guided fuzzing (atheris / libFuzzer) of the two wire decoders, for a set time.

    python -m loadtest.abuse.fuzz_decoders realtime --seconds 300      # decode_client_event
    python -m loadtest.abuse.fuzz_decoders openpi --seconds 300        # unpackb + PolicyConnection.handle
    python -m loadtest.abuse.fuzz_decoders all --seconds 60            # each target in turn, in a subprocess
    python -m loadtest.abuse.fuzz_decoders openpi --seconds 60 -- -jobs=2 -workers=2   # extra libFuzzer flags

Targets and their contract (a violation is a crash: libFuzzer stops and writes ``crash-<sha1>`` with the
input into ``--artifacts``; replay one with ``python -m loadtest.abuse.fuzz_decoders TARGET --seconds 0 FILE``):

- ``realtime``: ``decode_client_event(frame)`` for the frame as bytes and as the text a WebSocket would
  carry (valid UTF-8) returns a client event or an ``ErrorEvent`` of type ``invalid_request_error`` with
  a message; nothing raises.
- ``openpi``: ``unpackb(frame)`` returns a value or raises the module's ``DecodeError`` with a message;
  a decoded value fed to ``PolicyConnection.handle`` (as the socket does) gets exactly one effect and
  raises nothing.

Half of the mutations are structure-aware (the frame is parsed as JSON / msgpack, one node changed and
re-encoded); the rest are libFuzzer's byte mutations (``--bytes-only`` for those alone).
Only our pure-Python modules are instrumented (msgspec/msgpack/numpy are C and run uninstrumented).
The seed corpus (one frame per event type / observation shape) and a JSON token dictionary are written
to ``--corpus`` when it is empty, so a run starts from realistic frames; the corpus grows as libFuzzer
finds new coverage and can be reused by the next run.

``--allow-known-bugs`` counts the inputs that trip the bugs reported in docs/reliability.md (and
pinned by strict-xfail tests in tests/fuzz) instead of stopping on them, so the run can look further.
Needs ``atheris`` (in the ``dev`` extra on Linux x86-64). Touches no network.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

TARGETS = ("realtime", "openpi")

# -- seeds ------------------------------------------------------------------------------------------------
REALTIME_SEEDS: list[dict[str, Any]] = [
    {"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief.", "output_modalities": ["audio"],
     "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "transcription": {"model": "asr"},
                         "turn_detection": {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 500,
                                            "idle_timeout_ms": 5000}, "noise_reduction": None},
               "output": {"format": {"type": "audio/pcmu"}, "voice": "default", "speed": 1.0}},
     "max_output_tokens": "inf", "tools": [], "duplex": {"overlap_short_ack_ms": 700}}},
    {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}}},
    {"type": "input_audio_buffer.append", "audio": "AAABAAIAAwA=", "event_id": "e1"},
    {"type": "input_audio_buffer.commit"},
    {"type": "input_audio_buffer.clear"},
    {"type": "output_audio_buffer.clear"},
    {"type": "conversation.item.create", "previous_item_id": "root",
     "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}},
    {"type": "conversation.item.create",
     "item": {"id": "a1", "type": "message", "role": "assistant", "status": "completed",
              "content": [{"type": "output_audio", "transcript": "hello", "audio": None}]}},
    {"type": "conversation.item.retrieve", "item_id": "item_1"},
    {"type": "conversation.item.truncate", "item_id": "item_1", "content_index": 0, "audio_end_ms": 1500},
    {"type": "conversation.item.delete", "item_id": "item_1"},
    {"type": "response.create", "response": {"conversation": "none", "output_modalities": ["text"], "instructions": "x",
     "metadata": {"k": "v"}, "max_output_tokens": 64, "audio": {"output": {"voice": "default"}},
     "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]}]}},
    {"type": "response.cancel", "response_id": "resp_1"},
    {"type": "playback.ack", "response_id": "resp_1", "played_ms": 320},
    {"type": "session.close"},
]  # fmt: skip
JSON_TOKENS = [
    "{", "}", "[", "]", ":", ",", '"', "null", "true", "false", "0", "-1", "1e308", "\\u0000", '"type"',
    '"event_id"', '"session"', '"audio"', '"item"', '"item_id"', '"content"', '"content_index"', '"audio_end_ms"',
    '"response"', '"response_id"', '"played_ms"', '"previous_item_id"', '"turn_detection"', '"server_vad"',
    '"semantic_vad"', '"format"', '"rate"', '"voice"', '"speed"', '"output_modalities"', '"input"', '"output"',
    '"role"', '"message"', '"input_text"', '"output_audio"', '"max_output_tokens"', '"inf"', '"duplex"',
]  # fmt: skip


def openpi_seeds() -> list[bytes]:
    import msgpack
    import numpy as np

    from realtime_gw.protocols.openpi import packb

    img = np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3)
    obs = {
        "observation/exterior_image_1_left": img,
        "observation/wrist_image_left": img,
        "observation/state": np.zeros(8, np.float32),
        "prompt": "pick up the cup",
        "session_id": "robot-1",
        "seed": 7,
        "num_inference_steps": 3,
    }
    return [
        packb(obs),
        packb({**obs, "observation/exterior_image_2_left": None, "observation/state": [0.0] * 8}),
        packb({"endpoint": "reset", "session_id": "robot-1"}),
        packb(
            {
                "a": np.float32(1.5),
                "b": np.int64(-3),
                "c": [np.zeros((2, 0), np.int16), {"d": np.ones(3, ">f8")}],
            }
        ),
        msgpack.packb({b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "<f4", b"shape": [2]}),
        msgpack.packb({b"__npgeneric__": True, b"data": 3, b"dtype": "<u2"}),
    ]


def write_seeds(target: str, corpus: Path) -> None:
    corpus.mkdir(parents=True, exist_ok=True)
    if any(corpus.iterdir()):
        return
    seeds = [json.dumps(s).encode() for s in REALTIME_SEEDS] if target == "realtime" else openpi_seeds()
    for i, seed in enumerate(seeds):
        (corpus / f"seed-{i:02d}").write_bytes(seed)


def write_dict(path: Path) -> Path:
    from realtime_gw.protocols.realtime import CLIENT_EVENT_TYPES

    tokens = JSON_TOKENS + [json.dumps(t) for t in sorted(CLIENT_EVENT_TYPES)]
    path.write_text("".join(f"{json.dumps(t)}\n" for t in tokens))
    return path


# -- structure-aware mutation ------------------------------------------------------------------------------
POOL: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**63 - 1, 2**64 - 1, -(2**63), 0.5, 1e308, "", "x" * 300, "\u00e9", [], {},
    "audio/pcm", "audio/pcmu", "server_vad", "semantic_vad", "message", "user", "assistant", "input_text",
    "output_audio", "inf", "reset", "<f4", "|u1", "|O", "<c8", "V8", "(2,)f4", "<M8[ns]", "S0", "<U2147483647",
    [2**63, 0], [0, 2**63 - 1], [1] * 20, [-1], [224, 224, 3],
]  # fmt: skip


def _nodes(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _nodes(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _nodes(v, (*path, i))
    return out


def mutate_tree(obj: Any, rng: Any, pool: list[Any]) -> Any:
    """One node of a decoded frame changed: type confusion, a value from the pool, removal, wrapping,
    duplication, or a key from elsewhere in the frame."""

    def pick() -> Any:
        return copy.deepcopy(rng.choice(pool))  # never share (and later mutate) a pool object

    path = rng.choice(_nodes(obj))
    if not path:
        return rng.choice([[obj], {"type": obj}, pick()])
    parent = obj
    for p in path[:-1]:
        parent = parent[p]
    key, op = path[-1], rng.randrange(6)
    if op == 0:
        parent[key] = pick()
    elif op == 1:
        del parent[key]
    elif op == 2:
        parent[key] = [parent[key]]
    elif op == 3:
        parent[key] = {"type": parent[key]}
    elif op == 4 and isinstance(parent, dict):
        keys = [k for p in _nodes(obj) for k in p[-1:] if isinstance(k, (str, bytes))]
        parent[rng.choice(keys or ["k"])] = copy.deepcopy(parent[key])
    else:
        parent[key] = (
            pick() if not isinstance(parent[key], (int, float)) else parent[key] * rng.choice([-1, 2**32, 0])
        )
    return obj


def custom_mutator(target: str) -> Any:
    import random

    import atheris

    def mutate(data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        if rng.random() < 0.5:
            try:
                if target == "realtime":
                    tree = json.loads(data)
                    out = json.dumps(mutate_tree(tree, rng, POOL), ensure_ascii=rng.random() < 0.5).encode()
                else:
                    import msgpack

                    tree = msgpack.unpackb(data, raw=False, strict_map_key=False)
                    out = msgpack.packb(mutate_tree(tree, rng, POOL))
                if len(out) <= max_size:
                    return out
            except Exception:
                pass  # not a tree (any more): mutate the bytes
        return atheris.Mutate(data, max_size)

    return mutate


# -- targets ----------------------------------------------------------------------------------------------
class Stats:
    def __init__(self) -> None:
        self.inputs = 0
        self.ok = 0
        self.refused = 0
        self.known: dict[str, int] = {}
        self.started = self.last = time.monotonic()

    def known_bug(self, name: str) -> None:
        self.known[name] = self.known.get(name, 0) + 1

    def tick(self, target: str) -> None:
        self.inputs += 1
        now = time.monotonic()
        if now - self.last >= 10:
            self.last = now
            print(
                f"[fuzz_decoders {target}] {self.inputs} inputs in {now - self.started:.0f} s: {self.ok} decoded, "
                f"{self.refused} refused, known bugs {self.known or 'none'}",
                file=sys.stderr,
                flush=True,
            )


def realtime_target(allow_known: bool, stats: Stats) -> Any:
    from realtime_gw.protocols import realtime as rt

    def check(out: Any) -> None:
        if isinstance(out, rt.ErrorEvent):
            assert out.error.type == "invalid_request_error", out
            assert out.error.message, out
            rt.encode_server_event(out)
            stats.refused += 1
        else:
            assert isinstance(out, rt.ClientEvent), f"decoded to {type(out).__name__}"
            stats.ok += 1

    def one(data: bytes) -> None:
        stats.tick("realtime")
        for frame in (data, data.decode("utf-8", "replace")):
            try:
                out = rt.decode_client_event(frame)
            except RecursionError:
                if not allow_known:
                    raise
                stats.known_bug("deep JSON nesting -> RecursionError")
                continue
            except UnicodeDecodeError:
                if not allow_known or isinstance(frame, str):
                    raise
                stats.known_bug("invalid UTF-8 bytes -> UnicodeDecodeError")
                continue
            check(out)

    return one


KNOWN_OPENPI_MESSAGES: dict[str, str] = {}
"""Exception message fragment -> open bug (the shape and array-endpoint bugs it once listed are fixed)."""


def openpi_target(allow_known: bool, stats: Stats) -> Any:
    import warnings

    import numpy as np

    from realtime_gw.protocols.openpi import DecodeError, unpackb
    from realtime_gw.records.policy import PolicySpec
    from realtime_gw.sessions.policy_request_reply import Infer, PolicyConnection, SendError, SendReply

    warnings.simplefilter("ignore")  # NumPy 1.x overflow/deprecation warnings on odd scalars
    spec = PolicySpec(model="fuzz", action_horizon=4, action_dim=8, state_dim=8, image_history=(-1, 0))

    def one(data: bytes) -> None:
        stats.tick("openpi")
        try:
            try:
                value = unpackb(data)
            except DecodeError as e:
                assert type(e) is DecodeError and str(e), "a refusal says why"
                stats.refused += 1
                return
            conn = PolicyConnection(spec, max_robots=4)
            effects = conn.handle(value)
        except (ValueError, TypeError) as e:
            known = next((v for k, v in KNOWN_OPENPI_MESSAGES.items() if k in str(e)), None)
            if not allow_known or known is None or isinstance(e, DecodeError):
                raise
            stats.known_bug(known)
            return
        assert len(effects) == 1 and isinstance(effects[0], (Infer, SendReply, SendError)), effects
        if isinstance(effects[0], Infer):
            conn.on_actions(np.zeros((4, 8), np.float32))
            stats.ok += 1
        else:
            stats.refused += 1

    return one


# -- driver -----------------------------------------------------------------------------------------------
def run_one(target: str, args: argparse.Namespace, extra: list[str]) -> None:
    import atheris

    instrumented = (
        ["realtime_gw.protocols.realtime"]
        if target == "realtime"
        else [
            "realtime_gw.protocols.openpi",
            "realtime_gw.sessions.observation",
            "realtime_gw.sessions.policy_request_reply",
        ]
    )
    with atheris.instrument_imports(include=instrumented):
        if target == "realtime":
            import realtime_gw.protocols.realtime  # noqa: F401
        else:
            import realtime_gw.protocols.openpi  # noqa: F401
            import realtime_gw.sessions.observation  # noqa: F401
            import realtime_gw.sessions.policy_request_reply  # noqa: F401
    stats = Stats()
    test_one = (realtime_target if target == "realtime" else openpi_target)(args.allow_known_bugs, stats)
    artifacts = Path(args.artifacts or ROOT / "test-artifacts" / "fuzz-decoders")
    artifacts.mkdir(parents=True, exist_ok=True)
    flags = [
        f"-artifact_prefix={artifacts}/{target}-",
        "-timeout=10",
        "-rss_limit_mb=2048",
        f"-max_len={args.max_len}",
        "-print_final_stats=1",
    ]
    if args.seconds > 0:
        flags.append(f"-max_total_time={args.seconds}")
    if args.runs is not None:
        flags.append(f"-runs={args.runs}")
    if args.seed is not None:
        flags.append(f"-seed={args.seed}")
    inputs = [a for a in extra if not a.startswith("-")]
    if not inputs:  # a fuzzing run (else: replay the given files)
        corpus = (
            Path(args.corpus) / target if args.corpus else Path(tempfile.mkdtemp(prefix=f"fuzz-{target}-"))
        )
        write_seeds(target, corpus)
        inputs = [str(corpus)]
        if target == "realtime":
            flags.append(f"-dict={write_dict(artifacts / 'realtime.dict')}")
    print(f"[fuzz_decoders {target}] libFuzzer {' '.join(flags + extra)} {' '.join(inputs)}", file=sys.stderr)
    mutator = None if args.bytes_only else custom_mutator(target)
    atheris.Setup(
        [sys.argv[0], *flags, *[a for a in extra if a.startswith("-")], *inputs],
        test_one,
        custom_mutator=mutator,
    )
    atheris.Fuzz()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("target", choices=(*TARGETS, "all"))
    parser.add_argument("--seconds", type=int, default=60, help="fuzzing time per target (0: no limit)")
    parser.add_argument("--runs", type=int, default=None, help="stop after this many inputs")
    parser.add_argument(
        "--corpus", default=None, help="corpus root (TARGET/ inside); default a fresh temp dir"
    )
    parser.add_argument(
        "--artifacts", default=None, help="where crashes go (default test-artifacts/fuzz-decoders)"
    )
    parser.add_argument("--max-len", type=int, default=8192, help="largest input libFuzzer makes")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--bytes-only", action="store_true", help="libFuzzer's byte mutations only (no tree mutator)"
    )
    parser.add_argument(
        "--allow-known-bugs", action="store_true", help="count the reported bugs, do not stop"
    )
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    if args.target != "all":
        run_one(args.target, args, extra)
        return 0
    failed = []
    for target in TARGETS:
        cmd = [sys.executable, "-m", "loadtest.abuse.fuzz_decoders", target, *sys.argv[2:]]
        print(f"== {target}", flush=True)
        if subprocess.run(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=ROOT).returncode != 0:
            failed.append(target)
    print(f"fuzz_decoders: {'FAILED ' + ', '.join(failed) if failed else 'no crash'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
