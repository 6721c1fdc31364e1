"""A backend hosted in a child process, behind the ordinary ``Backend`` interface.

Backends that hold the GIL for long stretches (pocketsphinx's search, Piper's phonemizer and VITS
graph) would stall the event loop and every other stage if they ran on a worker thread. Here such a
backend runs in its own process, built there by a picklable top-level ``factory``; the stage worker
sees a ``ProcessBackend`` whose states are small handles (``RemoteState``, an id) while the real state
lives in the child. One worker iteration (``contract.Iteration``) is one message each way.

The child is started with multiprocessing's "spawn" method, never "fork": the gateway has threads (the
event loop, other workers, maybe torch's pools) whose locks a forked child would inherit held.

A step past the worker's deadline is handled by the supervisor calling ``reset``: the child is killed
(SIGTERM, then SIGKILL after a short grace) and a fresh one started, so the stuck work really stops and
every slot it held is free again.

The child's side (``BackendHost``) knows nothing of pipes: it maps ids to states and runs
``run_iteration``. (A Ray stage actor does not use it: it hosts a whole ``StageWorker``, so the streams
of every front-end share one batch; see ``models/remote/actor.py``.)
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import signal
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from prometheus_client import Gauge

from realtime_gw.models.contract import (
    BackendInfo,
    Iteration,
    IterationResult,
    NoFreeSlot,
    StepResult,
    run_iteration,
)

log = logging.getLogger(__name__)

LAUNCH = 0
"""In a child: which start of its ``ProcessBackend`` this process is (0 = the first). Test faults fire
only in the first, so a fault that kills the child happens once, not on every restart."""

SPARE_READY = Gauge(
    "realtime_gw_backend_spare_ready", "Whether a warm spare child process waits for a reset", ["worker"]
)


class BackendProcessDied(RuntimeError):
    """The child process exited (killed, crashed) while the parent waited for its answer."""


@dataclass(slots=True, eq=False)
class RemoteState:
    """The parent's handle on a state that lives in the child."""

    id: int
    has_work: bool = False
    """As the child reported after the last iteration (``has_work`` depends on the state alone)."""


class BackendHost:
    """The child's side: ids <-> the backend's states, one ``run_iteration`` per message."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.states: dict[int, Any] = {}
        self._ids = itertools.count(1)

    def describe(self) -> BackendInfo:
        return self.backend.describe()  # type: ignore[no-any-return]

    def iterate(self, wire: Iteration) -> tuple[IterationResult, dict[int, bool]]:
        """Run one iteration whose states are ids; answer with ids, and ``has_work`` of every state
        it touched that is still open."""
        it = Iteration(
            release=[st for i in wire.release if (st := self.states.pop(i, None)) is not None],
            open=wire.open,
            work=[(self.states[i], inputs) for i, inputs in wire.work],
            max_batch=wire.max_batch,
            due=wire.due,
        )
        result = run_iteration(self.backend, it)
        stepped = [i for i, _ in wire.work]
        touched = list(stepped)
        for o in result.opened:
            if o.state is not None:
                i = next(self._ids)
                self.states[i] = o.state
                o.state = i
                touched.append(i)
                if o.joined:
                    stepped.append(i)
        for i, r in zip(stepped, result.results, strict=True):
            if r.done or r.error is not None:
                del self.states[i]  # run_iteration released it
        return result, {i: self.backend.has_work(self.states[i]) for i in touched if i in self.states}

    def warmup(self) -> BackendInfo:
        """Warm up, then answer the description again: the warm-up fills its report."""
        self.backend.warmup()
        return self.describe()


def _serve(conn: Connection, factory: Callable[[], Any], launch: int, log_level: int) -> None:
    """The child process: build the backend, then answer one message at a time until told to close or
    the parent goes away."""
    global LAUNCH
    LAUNCH = launch
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which stops us in order
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s[child]: %(message)s")
    try:
        host = BackendHost(factory())
    except Exception:
        conn.send(("failed", traceback.format_exc()))
        return
    conn.send(("ready", host.describe()))
    while True:
        try:
            op, arg = conn.recv()
        except EOFError:
            return  # the parent is gone
        if op == "close":
            return
        try:
            reply: tuple[str, Any] = ("ok", host.iterate(arg) if op == "iterate" else host.warmup())
            conn.send(reply)
        except Exception as e:  # an answer we cannot give (or pickle) fails the iteration, not the child
            log.exception("hosted backend %s: %s failed", host.backend.name, op)
            conn.send(("error", f"{type(e).__name__}: {e}"))


@dataclass(eq=False)
class _Child:
    process: Any
    conn: Connection
    info: BackendInfo
    """The hosted backend's description: sent when it is built, again after its warm-up."""
    warmed: bool = False


class ProcessBackend:
    """``Backend`` (and ``HostedBackend``) whose real backend runs in a child process.

    ``factory`` must be picklable (a top-level function or class, or a ``functools.partial`` of one):
    it is sent to the child, which calls it to build the backend. The child starts on the first use
    (``warmup``, an iteration, or ``describe``) and again after every ``reset``.

    With ``spare``, a second child is built and warmed in the background once the first is warm; a
    ``reset`` switches to it at once (then prepares the next), so a worker is back in well under a
    second instead of after a fresh start and warm-up (seconds: pocketsphinx decodes a clip per slot).
    It costs that backend's memory twice.
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        name: str,
        spare: bool = False,
        start_method: str = "spawn",
        start_timeout_s: float = 120.0,
        kill_grace_s: float = 0.5,
    ) -> None:
        self.factory = factory
        self.name = name
        self.spare = spare
        self.start_timeout_s = start_timeout_s
        self.kill_grace_s = kill_grace_s
        self.launches = 0
        self._context = multiprocessing.get_context(start_method)
        self._child: _Child | None = None
        self._described: BackendInfo | None = None
        """The description of the last child that ran: answered while a reset starts the next."""
        self._lock = threading.Lock()  # start/kill may come from a new worker thread while an old one waits
        self._spare: _Child | None = None
        self._preparing: threading.Thread | None = None
        self._spare_lock = threading.Lock()  # the spare is prepared on a thread of its own
        self._closed = False

    # -- the child ---------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        child = self._child
        return child.process.pid if child is not None else None

    @property
    def _process(self) -> Any:
        child = self._child
        return child.process if child is not None else None

    def start(self) -> None:
        """Make sure a child runs (the spare, when one is ready); returns once its backend is built."""
        with self._lock:
            if self._child is not None and self._child.process.is_alive():
                return
            self._closed = False
            child = self._take_spare() or self._launch()
            self._child, self._described = child, child.info
        log.info("%s runs in child process %d", self.name, child.process.pid)

    def _take_spare(self) -> _Child | None:
        preparing = self._preparing
        if preparing is not None:
            preparing.join()  # already under way: sooner than a launch from scratch
        with self._spare_lock:
            spare, self._spare = self._spare, None
        SPARE_READY.labels(self.name).set(0)
        if spare is not None and not spare.process.is_alive():
            return None
        return spare

    def _launch(self) -> _Child:
        here, there = self._context.Pipe()
        with self._spare_lock:
            launch = self.launches
            self.launches += 1
        process = self._context.Process(
            target=_serve,
            args=(there, self.factory, launch, logging.getLogger().getEffectiveLevel()),
            name=f"backend-{self.name}",
            daemon=True,
        )
        process.start()
        there.close()
        status, value = self._receive(here, process, self.start_timeout_s, "start")
        if status != "ready":
            self._kill(process)
            raise RuntimeError(f"{self.name}: the child process could not build the backend:\n{value}")
        return _Child(process, here, value)

    def _prepare_spare(self) -> None:
        def prepare() -> None:
            child: _Child | None = None
            try:
                child = self._launch()
                self._warm(child)
            except Exception:
                log.exception("%s: preparing a spare child process failed", self.name)
                if child is not None:
                    self._kill(child.process)
                child = None
            with self._spare_lock:
                self._preparing = None
                if child is not None and self._closed:
                    self._kill(child.process)
                elif child is not None:
                    self._spare = child
                    SPARE_READY.labels(self.name).set(1)

        with self._spare_lock:
            if not self.spare or self._closed or self._spare is not None or self._preparing is not None:
                return
            self._preparing = threading.Thread(target=prepare, name=f"spare-{self.name}", daemon=True)
            self._preparing.start()

    def reset(self) -> None:
        """Kill the child (whatever it is doing) and switch to a fresh one: every state and slot it held
        is gone. The caller warms it up (a no-op for a spare, warmed when it was prepared)."""
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            self._kill(child.process)
        self.start()

    def close(self) -> None:
        with self._spare_lock:
            self._closed = True
            spare, self._spare = self._spare, None
        SPARE_READY.labels(self.name).set(0)
        with self._lock:
            child, self._child = self._child, None
        for c in (child, spare):
            if c is None:
                continue
            with contextlib.suppress(OSError, ValueError):
                c.conn.send(("close", None))
            c.process.join(self.kill_grace_s)
            self._kill(c.process)

    def _kill(self, process: Any) -> None:
        if process.is_alive():
            process.terminate()
            process.join(self.kill_grace_s)
        if process.is_alive():
            process.kill()
        process.join()
        # The parent's end of the old pipe is not closed here: a worker thread may still be reading it
        # (it gets EOF now); it closes when that last reference goes.

    def _receive(self, conn: Connection, process: Any, timeout: float | None, op: str) -> tuple[str, Any]:
        try:
            if timeout is not None and not conn.poll(timeout):
                self._kill(process)
                raise TimeoutError(f"{self.name}: child process did not answer {op} within {timeout:g} s")
            reply: tuple[str, Any] = conn.recv()
            return reply
        except (EOFError, OSError) as e:
            process.join(0.2)  # for its exit code
            raise BackendProcessDied(
                f"{self.name}: child process exited during {op} (exit code {process.exitcode})"
            ) from e

    def _call(self, op: str, arg: Any, child: _Child | None = None) -> Any:
        # Pickle over a multiprocessing Connection: both ends are our own processes running the same
        # code, so plain records (dataclasses, bytes) cross without a schema; nothing a client sends is
        # ever unpickled here unwrapped (requests are built by the gateway). One message per iteration.
        if child is None:
            if self._child is None:
                self.start()  # first use, or after close: start lazily
            child = self._child
            assert child is not None
            if not child.process.is_alive():  # died while idle: the supervisor resets, states and all
                raise BackendProcessDied(
                    f"{self.name}: child process exited (exit code {child.process.exitcode})"
                )
        try:
            child.conn.send((op, arg))
        except OSError as e:
            raise BackendProcessDied(f"{self.name}: child process gone before {op}") from e
        status, value = self._receive(child.conn, child.process, None, op)  # the worker owns the deadline
        if status == "error":
            raise RuntimeError(f"{self.name} (child process): {value}")
        return value

    def _warm(self, child: _Child) -> None:
        child.info = self._call("warmup", None, child)
        child.warmed = True

    # -- Backend -----------------------------------------------------------------------------------
    def iterate(self, it: Iteration) -> IterationResult:
        wire = Iteration(
            release=[h.id for h in it.release],
            open=it.open,
            work=[(h.id, inputs) for h, inputs in it.work],
            max_batch=it.max_batch,
            due=it.due,
        )
        result, has_work = self._call("iterate", wire)
        handles = [h for h, _ in it.work]
        for o in result.opened:
            if o.state is not None:
                o.state = RemoteState(o.state)
                handles.append(o.state)
        for h in handles:
            h.has_work = has_work.get(h.id, False)
        return result  # type: ignore[no-any-return]

    def open(self, request: Any) -> RemoteState:
        (o,) = self.iterate(Iteration(open=[(request, [])], max_batch=0)).opened
        if o.error is not None:
            raise NoFreeSlot(o.error) if o.no_slot else ValueError(o.error)
        state: RemoteState = o.state
        return state

    def step(self, work: list[tuple[RemoteState, list[Any]]]) -> list[StepResult]:
        """Direct use (no stage worker): states that finish are released in the child at once."""
        return self.iterate(Iteration(work=list(work), max_batch=len(work))).results

    def release(self, state: RemoteState) -> None:
        self.iterate(Iteration(release=[state]))

    def has_work(self, state: RemoteState) -> bool:
        return state.has_work

    def warmup(self) -> None:
        self.start()
        child = self._child
        assert child is not None
        if not child.warmed:
            self._warm(child)
        self._prepare_spare()  # only now: at start-up the first warm-up has the cores to itself

    def describe(self) -> BackendInfo:
        """The hosted backend's description as its child last sent it (at start, after warm-up); the
        child is started first if none runs yet."""
        child = self._child
        if child is not None:
            return child.info
        if self._described is None:
            self.start()
            return self.describe()
        return self._described
