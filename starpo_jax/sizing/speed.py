"""This machine's speed now: the step-time estimate run.py prints before step 1, calibrated by a
matmul timed in this process.

    rate = matmul_rate()                       # f32 2048^3 matmuls, timed once per process
    seconds = step_seconds(modelled_ms, rate)  # autofit.relative_time's ms, at this rate
    low, high = step_range(seconds, rate)      # what the printed "~5-8 s a step" says

autofit's step-time model (relative_time) is in ms of the CPU its constants were fitted on,
where the same f32 matmul ran at REFERENCE_MATMUL_FLOPS. A step's FLOPs (sizing/flops.py) at the
efficiency that model implies (FLOPs / (REFERENCE_MATMUL_FLOPS x the modelled time)) take
modelled time x REFERENCE_MATMUL_FLOPS / rate on a machine whose matmul runs at `rate`: a
machine that is slower, or loaded by other processes while the matmul is timed, gets a longer
estimate. The estimate at a fixed 2-core model was 2-6x too low on a loaded machine.

The range: the fastest and the slowest of the timed matmuls (a machine whose load comes and
goes), widened by MODEL_BAND, how far measured steps fell from the model on the fitted CPU.
Nothing is cached across processes: the load it measures is the load of now.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time

# The f32 matmul rate (jax, 2048^3, the best of 3) of the CPU the step-time model's constants
# were fitted on, measured in the same runs (results/cpu/bench/chunks_refit.txt: 371-429
# GFLOP/s; "matmul peak jax 423 GFLOP/s" beside the decode fits of autofit.DECODE_*).
REFERENCE_MATMUL_FLOPS = 4.2e11
# Measured steps against the model at the reference rate: the quickstart's 5.7-7.6 s a step
# against its modelled 5.9 s (docs/quickstart.md), rounded outwards. Replies shorter than their
# budget make a step faster still (the model counts every reply at its full budget).
MODEL_BAND = (0.9, 1.3)
MATMUL_N = 2048  # the reference's size: a smaller matmul runs at a lower fraction of the peak
MATMUL_REPS = 3
MATMUL_BUDGET = 0.3  # seconds of timed matmuls at most (at least one is timed)


@dataclasses.dataclass(frozen=True)
class MatmulRate:
    """FLOP/s of the f32 MATMUL_N^3 matmul as timed: its fastest and slowest repeat."""

    fastest: float
    slowest: float

    @property
    def typical(self) -> float:
        """The geometric mean of the two: the rate the central estimate uses."""
        if self.fastest == self.slowest:
            return self.fastest
        return math.sqrt(self.fastest * self.slowest)

    def describe(self) -> str:
        """The rate as text: "120 GFLOP/s", or "95-120 GFLOP/s" when the repeats differ."""
        low, high = round(self.slowest / 1e9), round(self.fastest / 1e9)
        return f"{high} GFLOP/s" if low == high else f"{low}-{high} GFLOP/s"


def time_matmul(n: int = MATMUL_N, reps: int = MATMUL_REPS,
                budget: float = MATMUL_BUDGET) -> MatmulRate:
    """Times `reps` f32 [n, n] @ [n, n] matmuls after a first (compiling) one, stopping early
    once `budget` seconds were spent timing (at least one is timed)."""
    import jax
    import jax.numpy as jnp

    x = jnp.full((n, n), 0.5, jnp.float32)
    matmul = jax.jit(lambda a: a @ a)
    matmul(x).block_until_ready()
    times: list[float] = []
    begun = time.perf_counter()
    while not times or (len(times) < reps and time.perf_counter() - begun < budget):
        start = time.perf_counter()
        matmul(x).block_until_ready()
        times.append(max(time.perf_counter() - start, 1e-9))
    flops = 2.0 * n**3
    return MatmulRate(flops / min(times), flops / max(times))


# The fitted CPU's rate: estimates at it are the model's own (the phase marks' decision,
# experiment.PROGRESS_MARGIN, is made at it, so that the compiled step does not depend on a
# timing).
REFERENCE = MatmulRate(REFERENCE_MATMUL_FLOPS, REFERENCE_MATMUL_FLOPS)


@functools.cache
def matmul_rate() -> MatmulRate:
    """This process's measurement (time_matmul, once: well under a second on a 2-core CPU)."""
    return time_matmul()


def step_seconds(modelled_ms: float, rate: MatmulRate) -> float:
    """A step autofit's model puts at `modelled_ms` (ms of the fitted CPU), in seconds here."""
    return modelled_ms / 1e3 * REFERENCE_MATMUL_FLOPS / rate.typical


def step_range(seconds: float, rate: MatmulRate) -> tuple[float, float]:
    """(low, high) seconds around the estimate `seconds` made at rate.typical: at the fastest
    and the slowest timed rate, widened by MODEL_BAND."""
    return (seconds * rate.typical / rate.fastest * MODEL_BAND[0],
            seconds * rate.typical / rate.slowest * MODEL_BAND[1])
