"""The command-line scripts of experiments/, run in this process as the shell runs them (their
flags and their one-line errors) without importing them as modules: runpy executes a script's
file once per process (its flags are defined then, as `python experiments/<name>.py` does,
but not parsed: that is its `main`'s), and a test calls the `main` it defines."""

from __future__ import annotations

import contextlib
import functools
import importlib
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


@functools.cache
def script(name: str) -> dict[str, Any]:
    """The globals of experiments/<name>.py run as a script that is not __main__ (its
    `if __name__ == "__main__"` parts are skipped), e.g. script("run")["main"]."""
    return runpy.run_path(str(EXPERIMENTS / f"{name}.py"), run_name=f"experiments_{name}")


@contextlib.contextmanager
def bench_module(name: str) -> Iterator[ModuleType]:
    """experiments/bench/<name>.py imported as the module `name` (with experiments/bench/ on
    sys.path while the block runs, as when the benchmark runs as a script)."""
    bench = str(EXPERIMENTS / "bench")
    sys.path.insert(0, bench)
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(bench)


def read_until(process: Any, lines: list[str], mark: str) -> None:
    """Appends `process`'s stdout lines to `lines` until one starting with `mark` (or its end)."""
    for line in process.stdout:
        lines.append(line)
        if line.startswith(mark):
            return


def interrupt(process: Any, timeout: float = 60) -> tuple[str, str, float]:
    """SIGINT to `process`, then its end: (the rest of its stdout, its stderr, the seconds from
    the signal to the exit)."""
    import signal
    import time

    process.send_signal(signal.SIGINT)
    sent = time.perf_counter()
    rest, err = process.communicate(timeout=timeout)
    return rest, err, time.perf_counter() - sent


def stopped_before_step_1(process: Any, mark: str) -> tuple[str, str]:
    """Ctrl-C to a run.py / sft.py `process` once its stdout shows a line starting with `mark`
    (a phase before step 1): it must end within 5 s with 128 + SIGINT, saying nothing was
    trained. Returns (its stdout, its stderr)."""
    import signal

    try:
        lines: list[str] = []
        read_until(process, lines, mark)
        rest, err, took = interrupt(process)
    finally:
        process.kill()
    out = "".join(lines) + rest
    assert process.returncode == 128 + signal.SIGINT, out[-3000:] + err[-3000:]
    assert took < 5, f"exited {took:.1f} s after Ctrl-C"
    assert "SIGINT before the first step: stopped; nothing was trained, nothing saved" in out
    return out, err
