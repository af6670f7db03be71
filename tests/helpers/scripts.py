"""The command-line scripts of experiments/, run in this process as the shell runs them (their
flags and their one-line errors) without importing them as modules: runpy executes a script's
file once per process (its flags are defined then, as `python experiments/<name>.py` does,
but not parsed: that is its `main`'s), and a test calls the `main` it defines."""

from __future__ import annotations

import functools
import runpy
from pathlib import Path
from typing import Any

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


@functools.cache
def script(name: str) -> dict[str, Any]:
    """The globals of experiments/<name>.py run as a script that is not __main__ (its
    `if __name__ == "__main__"` parts are skipped), e.g. script("run")["main"]."""
    return runpy.run_path(str(EXPERIMENTS / f"{name}.py"), run_name=f"experiments_{name}")
