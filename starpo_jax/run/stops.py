"""Stopping a run on SIGINT / SIGTERM: `StopRequests` (what a stop asks, heard on a watcher
thread even while the main thread is inside a compiled step or a compile) and
`stop_on_signals`, the context that installs it. The training loop (starpo_jax.run.loop) tells
it each step's start and expected time, the newest checkpoint, and when the run starts (`begin`):
before that a stop ends run.py / sft.py at once with nothing saved; after it, the run saves
after the current step.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from starpo_jax.run.writers import human_duration


class StopRequests(threading.Event):
    """Set by the first SIGINT / SIGTERM (the loop saves after its current step and stops).

    The signals are heard at once, even while the main thread is inside the compiled step (a
    Python signal handler runs only between the main thread's bytecodes, so it would wait
    for the step, hours at the paper's shape on a CPU): Python's C-level handler writes each
    signal's number to a pipe (signal.set_wakeup_fd), which a watcher thread reads. The first
    prints that the stop was heard and about how long the step has left (`step_started`,
    `step_seconds`: set by the loop); a later SIGINT (Ctrl-C again) ends the process at once
    with status 128 + SIGINT, the newest complete checkpoint (`saved_step`) left as the resume
    point (saves are atomic; the lock file keeps this run's name and the next run takes it
    over). A later SIGTERM does not: one kill often arrives twice (`timeout` signals the
    process and then its process group; a scheduler may signal every process of the job),
    and the save it asked for is kept; a supervisor that will not wait sends SIGKILL.

    Before the run starts (`begin`: after the slow setup of model, restore and compile, before
    config.json is written and step 1 runs) there is nothing to save: with `exit_before_start`
    (run.py, sft.py) a stop then ends the process at once, even inside a compile, which JAX
    cannot interrupt (the watcher runs the `on_exit_before_start` cleanups, last added first:
    what the run made is removed, its lock released; then `exit(128 + signal)`); without it
    the loop ends before its first step and saves nothing.
    """

    def __init__(self, exit: Callable[[int], None] = os._exit, exit_before_start: bool = False):
        super().__init__()
        self.step_started: float | None = None  # time.perf_counter() when the step began
        self.step_seconds: float | None = None  # what a step is expected to take
        self.saved_step: int | None = None  # newest complete checkpoint
        self.resumed = False  # the run continues a workdir's (set by the loop)
        self.stepped = False  # a step has begun in this process
        self.exit_before_start = exit_before_start
        self._exit = exit
        self._started = False
        self._cleanups: list[Callable[[], None]] = []
        self._guard = threading.Lock()  # begin() against a stop's exit before the start

    def begin(self) -> None:
        """The run starts: from now on a stop saves after the current step."""
        with self._guard:
            self._started = True

    def on_exit_before_start(self, cleanup: Callable[[], None]) -> None:
        """`cleanup` runs (before those added earlier) if a stop ends the process before
        `begin`."""
        with self._guard:
            self._cleanups.append(cleanup)

    def nothing_done(self) -> str:
        """What a stop before this process's first step leaves."""
        return ("nothing was trained; the workdir's checkpoints and config.json are as they "
                "were" if self.resumed else "nothing was trained, nothing saved")

    def heard(self, signum: int) -> None:
        """One SIGINT / SIGTERM (called on the watcher thread)."""
        name = signal.Signals(signum).name
        if self.exit_before_start and not self.is_set():
            with self._guard:
                if not self._started:
                    self.set()
                    print(f"\n{name} before the first step: stopped; {self.nothing_done()}",
                          flush=True)
                    for cleanup in reversed(self._cleanups):
                        with contextlib.suppress(Exception):
                            cleanup()
                    self._exit(128 + signum)
                    return
        if self.is_set() and signum == signal.SIGTERM:
            print(f"\n{name} again: still saving after this step (Ctrl-C stops at once)",
                  flush=True)
            return
        if self.is_set():
            saved = (f"the newest complete checkpoint, step {self.saved_step}, is where --resume "
                     "continues" if self.saved_step is not None else
                     "no checkpoint was saved yet: --resume starts again from step 0")
            print(f"\n{name} again: stopping now without saving; {saved}", flush=True)
            self._exit(128 + signum)
            return
        self.set()
        if not self.stepped and self.step_started is None:
            print(f"\n{name}: stop requested before the first step: the run ends before it, "
                  "once the current phase returns (JAX cannot interrupt a compile), saving "
                  "nothing; press Ctrl-C again to stop now", flush=True)
            return
        print(f"\n{name}: stop requested: saving after this step{self._left()}; press Ctrl-C "
              "again to stop now", flush=True)

    def _left(self) -> str:
        if self.step_started is None or self.step_seconds is None:
            return ""
        left = self.step_seconds - (time.perf_counter() - self.step_started)
        if left <= 0:
            return " (it has run past the step-time estimate)"
        return f" (about {human_duration(left)} left by the step-time estimate)"


@contextmanager
def stop_on_signals(exit: Callable[[int], None] = os._exit, exit_before_start: bool = False,
                    ) -> Iterator[StopRequests]:
    """StopRequests answering SIGINT / SIGTERM while the context is open (from the main
    thread; a SIGINT after the first signal calls `exit(128 + SIGINT)`, and so does any stop
    before the run's start with `exit_before_start`); the previous handlers and wakeup fd come
    back on exit."""
    stop = StopRequests(exit, exit_before_start)
    read, write = os.pipe()
    os.set_blocking(write, False)  # set_wakeup_fd's contract: the C handler must never block

    def watch() -> None:
        while data := os.read(read, 64):
            for signum in data:
                if signum in (signal.SIGINT, signal.SIGTERM):
                    stop.heard(signum)
        os.close(read)

    previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)}
    previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    threading.Thread(target=watch, name="stop-watcher", daemon=True).start()
    try:
        yield stop
    finally:
        signal.set_wakeup_fd(previous_fd)
        for s, h in previous.items():
            signal.signal(s, h)
        os.close(write)  # the watcher reads the end of the pipe and ends
