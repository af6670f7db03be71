"""What a long phase of building, training or evaluating is doing, said when it starts.

    with announce.phase("loading model smollm2-135m-instruct"):
        ...    # prints "loading model smollm2-135m-instruct ...", then, had it taken 5 s
               # or more, "loading model smollm2-135m-instruct: done in 47 s"

Model loading, compiling, restoring and saving a checkpoint and evaluating take from seconds to
minutes on a CPU; each says so as it starts (run.py, evaluate.py, sft.py and api.build alike).
The lines are records of the Python logger "starpo_jax.progress" at INFO, printed as plain
lines on stdout by the logger's own handler (so that they show in a terminal and a notebook with
no logging set up, and do not pass through the root logger's handlers: absl's prefixes). Silence
them as any library's INFO logging:

    import logging
    logging.getLogger("starpo_jax.progress").setLevel(logging.WARNING)

In a multi-process run, process 0 alone says them.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager
from typing import Iterator

from starpo_jax.run.writers import human_duration

LOGGER = logging.getLogger("starpo_jax.progress")
#: A phase that took this long or more is followed by its "done in" line.
SLOW_SECONDS = 5.0


class _Stdout(logging.Handler):
    """Each record as a plain line on whatever sys.stdout is when it is said, flushed."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stdout, flush=True)
        except Exception:  # noqa: BLE001 (logging's contract: never raise from a handler)
            self.handleError(record)


if not LOGGER.handlers:
    LOGGER.addHandler(_Stdout())
    LOGGER.propagate = False
    if LOGGER.level == logging.NOTSET:
        LOGGER.setLevel(logging.INFO)


def _primary() -> bool:
    import jax  # loaded already wherever a phase runs

    return jax.process_index() == 0


def say(line: str) -> None:
    """One line at INFO (process 0 only)."""
    if LOGGER.isEnabledFor(logging.INFO) and _primary():
        LOGGER.info(line)


@contextmanager
def phase(what: str, more: str = "", slow: float = SLOW_SECONDS) -> Iterator[None]:
    """Says "<what><more> ..." now and "<what>: done in <duration>" at the end if it took
    `slow` seconds or more (nothing more if it raised)."""
    say(f"{what}{more} ...")
    start = time.perf_counter()
    yield
    seconds = time.perf_counter() - start
    if seconds >= slow:
        say(f"{what}: done in {human_duration(seconds)}")
