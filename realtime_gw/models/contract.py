"""The backend contract: what a stage worker asks of a model, as plain records.

Backend contract (see ``Backend``):
- ``open(request) -> state``: allocate per-request state (a slot). Raise ``NoFreeSlot`` when full.
- ``step(work) -> results``: advance every state in ``work`` by one iteration. ``work`` is a list of
  ``(state, inputs)`` where ``inputs`` are the items pushed to that request since its last step.
  Returns one ``StepResult`` per state, in order.
- ``release(state)``: free the slot. Called exactly once per opened state (finish, cancel or fault).
- ``has_work(state) -> bool``: whether the state can advance without new input (a generating stream).
  It must depend on the state alone (it changes only in ``open`` and ``step``): a hosted backend
  answers it from the value its child reported after the last iteration.
- ``warmup()``: one real inference, so ``/readyz`` means the model really runs; it fills the report
  ``describe`` gives.
- ``tick(due)`` (optional, ``Ticked``): a stage stepped on a lockstep clock (``models/lockstep.py``) is
  told, before each iteration, when the frame that iteration steps was due (``time.monotonic()``), and
  times its outputs against that deadline: whatever delayed the step (the last one, the thread, an
  ``open`` before it) counts.
- ``describe() -> BackendInfo``: what the backend is, as a plain record (voices, rates, slots, the
  policy's spec, the warm-up report). The server reads only this record, never attributes of the
  object: the record crosses a process boundary (``process_backend``) and Ray (``remote``) as it is.

One worker iteration is a plain record (``Iteration``: states to release, requests to open, states to
step) executed by ``run_iteration`` next to the backend and answered by one ``IterationResult``. In
the gateway's process that runs on the worker's thread; a *hosted* backend
(``process_backend.ProcessBackend``) carries the same record to a child process in one message, so an
iteration crosses the boundary once whatever the batch.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

import msgspec

from realtime_gw.records.policy import PolicySpec
from realtime_gw.records.s2s import S2sSpec

log = logging.getLogger(__name__)

S = TypeVar("S")


class NoFreeSlot(RuntimeError):
    """The worker is full; the caller should tell its client instead of waiting."""


class WorkerFault(RuntimeError):
    """The backend raised while serving this request."""


class RequestRefused(WorkerFault):
    """The worker refused the request as given, before any work (its cost bound, its model's limits):
    the client's to change, e.g. HTTP 400 rather than 500."""


@dataclass(slots=True)
class StepResult:
    outputs: list[Any] = field(default_factory=list)
    done: bool = False
    error: str | None = None


class BackendInfo(msgspec.Struct, frozen=True, kw_only=True):
    """How a backend describes itself to the server (``Backend.describe``): plain data, the same in the
    gateway's process, a hosted backend's child and a Ray stage actor. Fields a role has no use for stay
    at their defaults."""

    name: str
    slots: int | None = None
    """Streams it holds at once (a full backend refuses ``open`` with ``NoFreeSlot``); None: no fixed pool."""
    voices: tuple[str, ...] = ()
    """TTS: the voice names it answers to besides "default" and OpenAI's names."""
    default_voice: str | None = None
    """TTS: what "default" and OpenAI's voice names map to."""
    voice_kinds: tuple[str, ...] = ()
    """TTS: the custom voices it makes at run time (``records.voice.VOICE_KINDS``): none, ``audio_sample``
    (cloned from a recording), ``prompt`` (designed from a description)."""
    native_rate: int | None = None
    """The model's own audio rate (Hz): what it synthesizes (TTS) or listens at (ASR, VAD, turn)."""
    output_rate: int | None = None
    """TTS: the rate of the frames it yields (Hz)."""
    frame_samples: int | None = None
    """TTS: samples per frame it yields (the last frame of a stream may be shorter)."""
    word_times: bool = False
    """ASR: it can time each word of a transcript (``AsrStreamRequest.word_times``)."""
    policy_spec: PolicySpec | None = None
    """Policy: what it consumes and produces (the robot socket's session is built from it)."""
    s2s: S2sSpec | None = None
    """Speech-to-speech: its step, rate, context, text padding ids and capabilities (the duplex session
    is built from it)."""
    warmup_report: dict[str, Any] = {}
    """What its last warm-up ran and built (``/readyz`` ``detail``); empty before a warm-up."""


class Backend(Protocol[S]):
    name: str

    def open(self, request: Any) -> S: ...

    def step(self, work: list[tuple[S, list[Any]]]) -> list[StepResult]: ...

    def release(self, state: S) -> None: ...

    def has_work(self, state: S) -> bool: ...

    def warmup(self) -> None: ...

    def describe(self) -> BackendInfo: ...


@runtime_checkable
class Ticked(Protocol):
    """A backend that times its outputs against the lockstep's deadlines (``Iteration.due``)."""

    def tick(self, due: float) -> None: ...


def warmup_seconds(start: float) -> float:
    """A warm-up report's ``seconds``: the time since ``start`` (``time.perf_counter``), rounded."""
    return round(time.perf_counter() - start, 3)


class HostedBackend(Backend[S], Protocol):
    """A backend whose states live elsewhere (a child process): the worker hands it whole iterations,
    and after a hang or a crash it is ``reset`` (the host is killed and started afresh) instead of
    having its states released one by one."""

    def start(self) -> None: ...

    def iterate(self, iteration: Iteration) -> IterationResult: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


def is_hosted(backend: object) -> bool:
    return all(callable(getattr(backend, m, None)) for m in ("start", "iterate", "reset", "close"))


@dataclass(slots=True)
class Iteration:
    """What one worker iteration asks of a backend, as plain data (it may cross a process boundary)."""

    release: list[Any] = field(default_factory=list)
    """States of requests that finished or were cancelled: released first, so their slots are free."""
    open: list[tuple[Any, list[Any]]] = field(default_factory=list)
    """New requests, each with the inputs pushed to it so far."""
    work: list[tuple[Any, list[Any]]] = field(default_factory=list)
    """Open states to advance, each with the inputs pushed since its last step."""
    max_batch: int = 1
    """A new request joins this very step when it can run and the batch has room (a one-shot request
    then answers in one iteration, not two)."""
    due: float | None = None
    """A lockstep worker's iteration: when the frame it steps was due (``lockstep.Tick.due``, on
    ``time.monotonic()``), told to a ``Ticked`` backend before anything runs; None: no clock."""


@dataclass(slots=True)
class Opened:
    state: Any = None
    error: str | None = None
    """Why the request could not be opened; the request ends with it."""
    no_slot: bool = False
    joined: bool = False
    """It ran in this step: its result follows the ``work`` results, in ``open`` order."""


@dataclass(slots=True)
class IterationResult:
    opened: list[Opened] = field(default_factory=list)
    results: list[StepResult] = field(default_factory=list)
    """One per ``work`` state, then one per joined new request. Done or failed states are released."""
    step_seconds: float | None = None
    step_failed: bool = False


def run_iteration(backend: Backend[Any], it: Iteration) -> IterationResult:
    """Release, open, then one batched step: the executing half of a worker iteration, run next to
    the backend (the worker's thread, or the child process of a hosted backend)."""
    if it.due is not None and isinstance(backend, Ticked):
        backend.tick(it.due)  # before the opens: a prompt prefilled there delays this step's frames
    for state in it.release:
        _release_quietly(backend, state)
    out = IterationResult()
    work = list(it.work)
    try:
        for request, inputs in it.open:
            try:
                state = backend.open(request)
            except NoFreeSlot as e:
                out.opened.append(Opened(error=str(e), no_slot=True))
                continue
            except Exception as e:  # bad request content: fail this request only
                log.warning("worker %s open failed: %s", backend.name, e)
                out.opened.append(Opened(error=f"{backend.name}: {e}"))
                continue
            joined = len(work) < it.max_batch and (bool(inputs) or backend.has_work(state))
            if joined:
                work.append((state, inputs))
            out.opened.append(Opened(state=state, joined=joined))
        if work:
            t0 = time.perf_counter()
            try:
                out.results = backend.step(work)
            except Exception as e:
                log.exception("worker %s step raised", backend.name)
                out.step_failed = True
                out.results = [StepResult(done=True, error=f"{backend.name}: {e}") for _ in work]
            out.step_seconds = time.perf_counter() - t0
            for (state, _), r in zip(work, out.results, strict=True):
                if r.done or r.error is not None:
                    _release_quietly(backend, state)
    except BaseException:
        # Dying mid-iteration (the supervisor restarts the worker): the states opened here belong to
        # no stream yet, so nobody else could give their slots back.
        for o in out.opened:
            if o.state is not None:
                _release_quietly(backend, o.state)
        raise
    return out


def _release_quietly(backend: Backend[Any], state: Any) -> None:
    try:
        backend.release(state)
    except Exception:
        log.exception("worker %s release failed", backend.name)


def unreleased(it: Iteration, result: IterationResult) -> list[Any]:
    """States an iteration left open: its work and new states that did not finish in its step."""
    n = len(it.work)
    left = [
        st
        for (st, _), r in zip(it.work, result.results[:n], strict=False)
        if not (r.done or r.error is not None)
    ]
    joined = iter(result.results[n:])
    for o in result.opened:
        if o.state is None:
            continue
        if o.joined and ((r := next(joined)).done or r.error is not None):
            continue
        left.append(o.state)
    return left


class _EndOfInput:
    def __repr__(self) -> str:
        return "END_OF_INPUT"

    def __reduce__(self) -> str:
        return "END_OF_INPUT"  # unpickles as this module's one instance: ``is END_OF_INPUT`` holds in a child


END_OF_INPUT: Any = _EndOfInput()
"""Pushed by ``Stream.close_input``; backends treat it as 'no more input will come'."""
