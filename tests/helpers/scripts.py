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
