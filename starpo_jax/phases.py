"""Phase marks inside a compiled program: a host call when a phase's outputs exist.

    marks = []
    step = make_train_step(..., phase_clock=lambda label, index: marks.append(
        (label, index, time.perf_counter())))

`mark(clock, label, tree, index)` returns `tree` unchanged, but only after `clock(label, index)`
has run on the host, and that call runs only once every array of `tree` is computed. An
optimisation barrier ties the call's token to the tree, so later work that reads the returned
tree cannot start before the call. One compiled run of the whole step thus tells where its time
goes (bench/step.py prints it), without running the phases again as programs of their own.

With clock None, `mark` is the identity and nothing is added to the program. Each mark costs
one host round trip (a handful per step, against steps of seconds to minutes); experiments/
run.py's progress lines (`StepProgress`, config.progress_after) use it in single-device runs.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, TextIO

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

PhaseClock = Callable[[str, int], None]


def mark(clock: PhaseClock | None, label: str, tree: Any, index: jax.Array | int = 0) -> Any:
    """tree, after clock(label, int(index)) has run on the host (see the module docstring)."""
    if clock is None:
        return tree
    leaves = [x for x in jax.tree.leaves(tree)
              if jnp.issubdtype(x.dtype, jnp.number) or x.dtype == jnp.bool_]
    # A sum over every element of every array: the call then waits for all of the phase's work
    # (one element each let XLA defer the rest of a forward past the mark, so a phase's time
    # landed in the next one), and still moves 4 bytes to the host.
    probe = sum((jnp.sum(x.astype(jnp.float32)) for x in leaves), jnp.float32(0))

    def host(_, i):
        clock(label, int(i))
        return np.int32(0)

    token = io_callback(host, jax.ShapeDtypeStruct((), jnp.int32), probe,
                        jnp.asarray(index, jnp.int32))
    return jax.lax.optimization_barrier((tree, token))[0]


def phase_name(label: str, index: int, chunks: int) -> str:
    """A mark as people read it: "rollout chunk 2/8" for ("rollout_chunk", 1), else the label."""
    return f"rollout chunk {index + 1}/{chunks}" if label == "rollout_chunk" else label


class StepProgress:
    """A phase clock that prints a progress line for each mark of a step that arrives `after`
    seconds or more after `start(step)`: long steps (minutes on a CPU) say where they are,
    short ones print nothing. Lines go to `stream`, by default whatever sys.stdout is when
    they are printed."""

    def __init__(self, after: float, chunks: int, total_steps: int,
                 stream: TextIO | None = None):
        self.after, self.chunks, self.total, self.stream = after, chunks, total_steps, stream
        self.step, self.t0 = 0, None

    def start(self, step: int) -> None:
        """Step `step` (1-based) starts now."""
        self.step, self.t0 = step, time.perf_counter()

    def __call__(self, label: str, index: int) -> None:
        if self.t0 is None:
            return
        elapsed = time.perf_counter() - self.t0
        if elapsed < self.after:
            return
        what = phase_name(label, index, self.chunks)
        minutes, seconds = divmod(int(elapsed), 60)
        print(f"  step {self.step}/{self.total}: {what} done at {minutes}m{seconds:02d}s",
              file=self.stream or sys.stdout, flush=True)
