"""Many host-env instances stepped in parallel, one per rollout row, none able to hang the run.

    pool = EnvPool("webshop", envs_host.factory("webshop"), rows=16, config=PoolConfig())
    observations = pool.reset(seeds)                  # [rows] str, or None for a failed row
    results = pool.step({row: action_text, ...})      # row -> (obs, reward, done, info) | None
    pool.failures                                     # what failed since the last reset

Backends: daemon threads (the default: `workers` of them; a hung call keeps its thread, which
is replaced, and never blocks the interpreter's exit) or, with `processes=True`, one spawned
process per row (for envs that hold the GIL or are not thread-safe; a hung one is killed).
A call that raises, or runs longer than `timeout` seconds, fails its row: the failure is
recorded with the env's name, the row and its seed, and the instance is discarded (a new one
is built from the factory when the row is next used). Results that break the protocol (a
non-string observation, a reward that is not finite, an info without "success") are the env's
bug, not bad luck: they raise HostEnvError naming the env, seed and value, and so does an env
whose own call (or constructor) raises HostEnvError: it says the run cannot go on (e.g. its
server is unreachable; envs_host.openenv_client). After a rollout, `end_episodes()` calls the
instances' `end_episode()`, where their class defines one (a session on a server released).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, NamedTuple

from envs_host.base import HostEnv, HostEnvError, check_observation, check_step


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoolConfig:
    """How instances are stepped: `workers` threads, or one process per row; `timeout`
    seconds per env call (reset or one step) before the row is failed; `start_timeout`
    seconds to build an instance."""

    workers: int = 8
    processes: bool = False
    timeout: float = 60.0
    start_timeout: float = 600.0  # building an instance (a process's start, loading data)

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or isinstance(self.workers, bool) or self.workers < 1:
            raise ValueError(f"host.workers = {self.workers!r} is invalid; valid: an int >= 1")
        if not isinstance(self.processes, bool):
            raise ValueError(f"host.processes = {self.processes!r} is invalid; valid: a bool")
        for name in ("timeout", "start_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"host.{name} = {value!r} is invalid; valid: seconds > 0")


class Failure(NamedTuple):
    """One failed env call: the row, the seed it was reset with, the call and why."""

    env: str
    row: int
    seed: int
    call: str
    reason: str

    def __str__(self) -> str:
        return (f"env {self.env!r} row {self.row} (seed {self.seed}): {self.call} {self.reason};"
                " instance replaced, the row ends with reward 0")


_OK, _ERROR, _TIMEOUT, _BROKEN = "ok", "error", "timeout", "broken"


def _describe(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"raised {type(error).__name__}: {error}{where}"


class _DaemonThreads:
    """A minimal thread pool whose threads are daemons (a hung call cannot block exit)."""

    def __init__(self, n: int):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = 0
        for _ in range(n):
            self.add()

    def add(self) -> None:
        threading.Thread(target=self._work, daemon=True).start()
        self._threads += 1

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn = item
            future.started = time.monotonic()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as error:  # noqa: BLE001  (reported as the row's failure)
                future.set_exception(error)

    def submit(self, fn: Callable[[], Any]) -> Future:
        future: Future = Future()
        future.started = None
        self._queue.put((future, fn))
        return future

    def close(self) -> None:
        for _ in range(self._threads):
            self._queue.put(None)


def _serve(conn: Any, factory: Callable[[], HostEnv]) -> None:
    """A row's process: builds the env and says so, then answers (method, args) until told
    to stop."""
    try:
        env = factory()
        conn.send((_OK, None))
    except Exception as error:  # noqa: BLE001  (sent to the parent as the row's failure)
        conn.send(_failed(error))
        return
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        method, args = message
        try:
            conn.send((_OK, getattr(env, method)(*args)))
        except Exception as error:  # noqa: BLE001  (sent to the parent as the row's failure)
            conn.send(_failed(error))


def _failed(error: Exception) -> tuple[str, str]:
    """A process's answer for a call that raised: the run stops on a HostEnvError."""
    return (_BROKEN, str(error)) if isinstance(error, HostEnvError) \
        else (_ERROR, _describe(error))


class EnvPool:
    """`rows` instances of one env (see the module docstring)."""

    def __init__(self, name: str, factory: Callable[[], HostEnv], rows: int,
                 config: PoolConfig = PoolConfig()):
        self.name, self.rows, self.config = name, rows, config
        self._factory = factory
        self.seeds = [0] * rows
        self.failures: list[Failure] = []
        self._envs: list[HostEnv | None] = [None] * rows
        if config.processes:
            self._context = multiprocessing.get_context("spawn")  # fork is unsafe under JAX
            self._procs: list[Any] = [None] * rows
        else:
            self._threads = _DaemonThreads(min(config.workers, rows))

    # ------------------------------------------------------------------ calls
    def _call(self, calls: dict[int, tuple[str, tuple]]) -> dict[int, tuple[str, Any]]:
        """Runs calls[row] = (method, args) on the rows' instances, building missing ones
        first (within start_timeout): row -> (_OK, value) | (_ERROR, why) | (_TIMEOUT, None)."""
        processes = self.config.processes
        fresh = [r for r in calls if (self._procs[r] if processes else self._envs[r]) is None]
        built = (self._start_processes if processes else self._build_threads)(fresh)
        results = {row: (_ERROR, f"could not build its instance: {why}")
                   for row, why in built.items()}
        run = {row: call for row, call in calls.items() if row not in results}
        results.update((self._call_processes if processes else self._call_threads)(run))
        return results

    def _wait_threads(self, futures: dict[int, Future], timeout: float):
        """Waits for each future at most `timeout` seconds from its start; a timed-out row's
        instance is abandoned to its thread, which the pool replaces."""
        results, pending = {}, dict(futures)
        while pending:
            now = time.monotonic()
            started = [f.started for f in pending.values() if f.started is not None]
            limit = min((s + timeout - now for s in started), default=timeout)
            wait(pending.values(), timeout=max(limit, 0.0), return_when=FIRST_COMPLETED)
            now = time.monotonic()
            for row, future in list(pending.items()):
                if future.done():
                    error = future.exception()
                    if isinstance(error, HostEnvError):
                        raise error  # the env says the run cannot go on
                    results[row] = (_OK, future.result()) if error is None \
                        else (_ERROR, _describe(error))
                elif future.started is not None and now - future.started >= timeout:
                    results[row] = (_TIMEOUT, None)
                    self._envs[row] = None
                    self._threads.add()  # that thread is lost: keep the pool's width
                else:
                    continue
                del pending[row]
        return results

    def _build_threads(self, rows: list[int]) -> dict[int, str]:
        futures = {row: self._threads.submit(self._factory) for row in rows}
        failed = {}
        for row, (kind, value) in self._wait_threads(futures,
                                                     self.config.start_timeout).items():
            if kind == _OK:
                self._envs[row] = value
            else:
                failed[row] = value if kind == _ERROR else \
                    f"timed out after {self.config.start_timeout:g} s"
        return failed

    def _call_threads(self, calls):
        futures = {row: self._threads.submit(
            lambda env=self._envs[row], c=call: getattr(env, c[0])(*c[1]))
            for row, call in calls.items()}
        return self._wait_threads(futures, self.config.timeout)

    def _start_processes(self, rows: list[int]) -> dict[int, str]:
        """Starts a process per row; each builds its env and says so (or why not)."""
        for row in rows:
            parent, child = self._context.Pipe()
            process = self._context.Process(target=_serve, args=(child, self._factory),
                                            daemon=True)
            process.start()
            child.close()
            self._procs[row] = (process, parent)
        return {row: why for row, (kind, why) in self._receive(
            rows, self.config.start_timeout).items() if kind != _OK}

    def _kill(self, row: int) -> None:
        process, conn = self._procs[row]
        process.kill()
        process.join()
        conn.close()
        self._procs[row] = None

    def _receive(self, rows, timeout: float) -> dict[int, tuple[str, Any]]:
        """Each row's answer within `timeout` seconds from now; a row that is late, dead or
        failed loses its process (a fresh one is started when the row is next used)."""
        deadline = time.monotonic() + timeout
        results = {}
        for row in rows:
            process, conn = self._procs[row]
            try:
                if conn.poll(max(deadline - time.monotonic(), 0.0)):
                    results[row] = conn.recv()
                else:
                    results[row] = (_TIMEOUT, f"timed out after {timeout:g} s")
            except (EOFError, OSError):
                process.join()
                results[row] = (_ERROR, f"killed its process (exit code {process.exitcode})")
            if results[row][0] != _OK:
                self._kill(row)
            if results[row][0] == _BROKEN:
                raise HostEnvError(results[row][1])  # the env says the run cannot go on
        return results

    def _call_processes(self, calls):
        for row, call in calls.items():
            self._procs[row][1].send(call)
        return self._receive(list(calls), self.config.timeout)

    def _fail(self, row: int, call: str, outcome: tuple[str, Any]) -> None:
        reason = f"timed out after {self.config.timeout:g} s" if outcome[0] == _TIMEOUT \
            else outcome[1]
        self.failures.append(Failure(self.name, row, self.seeds[row], call, reason))
        if not self.config.processes:
            if outcome[0] == _ERROR and self._envs[row] is not None:
                self._close_quietly(self._envs[row])
            self._envs[row] = None

    @staticmethod
    def _close_quietly(env: HostEnv) -> None:
        try:
            env.close()
        except Exception:  # noqa: BLE001  (the instance is being discarded after a failure)
            pass

    # ------------------------------------------------------------------ public
    def reset(self, seeds: Sequence[int]) -> list[str | None]:
        """reset(seeds[r]) on every row's instance -> observations (None: the row failed)."""
        if len(seeds) != self.rows:
            raise ValueError(f"{len(seeds)} seeds for a pool of {self.rows} rows")
        self.seeds = [int(s) for s in seeds]
        self.failures = []
        outcomes = self._call({r: ("reset", (s,)) for r, s in enumerate(self.seeds)})
        out: list[str | None] = [None] * self.rows
        for row, outcome in outcomes.items():
            if outcome[0] == _OK:
                out[row] = check_observation(self.name, self.seeds[row], outcome[1])
            else:
                self._fail(row, "reset", outcome)
        return out

    def step(self, actions: dict[int, str]) -> dict[int, tuple[str, float, bool, dict] | None]:
        """step(action) on the given rows' instances -> row: (obs, reward, done, info), or
        None when the call failed (recorded in `failures`)."""
        outcomes = self._call({row: ("step", (a,)) for row, a in actions.items()})
        out = {}
        for row, outcome in outcomes.items():
            if outcome[0] == _OK:
                out[row] = check_step(self.name, self.seeds[row], actions[row], outcome[1])
            else:
                self._fail(row, f"step({actions[row]!r:.80})", outcome)
                out[row] = None
        return out

    def end_episodes(self) -> None:
        """Calls end_episode() on each live instance, if their class defines it (after a
        rollout: the rows' episodes are over). Failures are ignored; nothing is built."""
        made = getattr(self._factory, "func", self._factory)
        if not hasattr(made, "end_episode"):
            return
        live = self._procs if self.config.processes else self._envs
        calls = {row: ("end_episode", ()) for row, held in enumerate(live) if held is not None}
        (self._call_processes if self.config.processes else self._call_threads)(calls)

    def close(self) -> None:
        """Closes every instance and stops the workers (hung threads are left to exit)."""
        if self.config.processes:
            for row, proc in enumerate(self._procs):
                if proc is not None:
                    try:
                        proc[1].send(None)
                    except OSError:
                        pass
                    proc[0].join(timeout=1)
                    if proc[0].is_alive():
                        self._kill(row)
        else:
            for env in self._envs:
                if env is not None:
                    self._close_quietly(env)
            self._threads.close()
        self._envs = [None] * self.rows
