"""Memory settings chosen from the compiled step's memory plan and the free memory.

    candidates = options(train, auto)            # fastest first
    choice = choose(candidates, shape, plan_of, budget=free_bytes)
    choice.settings.apply(train)                 # the TrainConfig to run
    print(choice.line())

Four settings trade speed for memory: optim.micro_batches and optim.remat (the update's
activations; exact up to float rounding), rollout.chunks (the rollout's KV cache and sampler
buffers: groups rolled out in sequential pieces, each with its own key, so the same
distribution with other random draws) and rollout.cache_dtype (bfloat16 halves the cache;
the sampler then differs from the trainer by bfloat16 rounding, rollout/logprob_diff_*). Those
left unset (None in api.default_config) are chosen here: the candidates are every combination
of their values, ordered by a rough step-time model (`relative_time`: more chunks slow the
rollout's decode, remat adds a forward to the update, micro-batches cost little; the bfloat16
cache only after every float32 setting, as it is the one inexact choice), and the fastest
whose compiled plan fits within (1 - MARGIN) of the free memory is taken.

Compiling the paper-shape step takes 25 s to minutes, so candidates are not compiled in turn:
`estimate` sizes each from the shapes (the KV cache exactly; the update's activations from
per-token byte counts fitted to XLA's CPU plans of SmolLM2 at L = 3258, see ESTIMATE), scaled
by what each compile shows, and only the fastest candidate whose estimate fits is compiled to
verify it; a refuted estimate is rescaled and the next one compiled, at most MAX_COMPILES in
all. The step's phases run one after another, so its plan is about the state plus the larger
of the rollout's and the update's temporaries: the two are estimated, and rescaled, apart.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from starpo_jax.config import TrainConfig
from starpo_jax.memory import GIB
from starpo_jax.models.config import ModelConfig
from starpo_jax.models.layers import CAUSAL_BLOCK

KNOBS = ("optim.micro_batches", "optim.remat", "rollout.cache_dtype", "rollout.chunks")
MARGIN = 0.1  # the plan may use 90% of the free memory: the process needs some beyond it
MAX_COMPILES = 4
# Bytes per row, as multiples of one layer's training activations (`_layer_bytes`), that
# XLA's CPU plans of the SmolLM2 sokoban step hold (L = 3258; 1, 4, 16 and 32 rows per
# micro-batch): without remat ~2.2 layer-sets per layer stay for the backward; with remat each
# layer's input plus ~1.2 layer-sets live in the backward of one layer; the optimizer's
# temporaries ~1.15 x the state; the rollout ~1.25 x its KV cache. With one micro-batch a PPO
# step's actor and critic passes are not ordered by a loop, and may be live together: x 2.
ESTIMATE = {"stored": 2.2, "live": 1.2, "optimizer": 1.15, "rollout": 1.25}


@dataclasses.dataclass(frozen=True)
class Settings:
    """One value of each memory knob."""

    micro_batches: int
    remat: bool
    cache_dtype: str
    chunks: int

    @classmethod
    def of(cls, train: TrainConfig) -> Settings:
        return cls(train.optim.micro_batches, train.optim.remat, train.rollout.cache_dtype,
                   train.rollout.chunks)

    def apply(self, train: TrainConfig) -> TrainConfig:
        """`train` with these settings."""
        return dataclasses.replace(
            train, optim=dataclasses.replace(train.optim, micro_batches=self.micro_batches,
                                             remat=self.remat),
            rollout=dataclasses.replace(train.rollout, cache_dtype=self.cache_dtype,
                                        chunks=self.chunks))

    def values(self) -> dict[str, int | bool | str]:
        """{"optim.micro_batches": 4, ...} in KNOBS order."""
        return dict(zip(KNOBS, (self.micro_batches, self.remat, self.cache_dtype, self.chunks)))

    def describe(self, keys: tuple[str, ...] = KNOBS) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.values().items() if k in keys)

    def at_least_as_frugal(self, other: Settings) -> bool:
        """Needs no more memory than `other` knob by knob (each knob is monotone)."""
        return (self.micro_batches >= other.micro_batches and self.remat >= other.remat
                and self.chunks >= other.chunks
                and (self.cache_dtype == "bfloat16" or other.cache_dtype == "float32"))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def relative_time(s: Settings) -> float:
    """A rough step time, 1.0 = one chunk, float32 cache, no remat, one micro-batch; rollout
    and update taken as half the step each (this CPU's paper-shape step: 891 s rollout, 1168 s
    after). A decode step of 16 rows runs ~1.45x longer per row than one of 128 (README,
    bench_sampler.py), so each halving of the chunk's rows adds 0.15; remat runs a second
    forward (4/3 of the update's work); a micro-batch halving adds 2%; a bfloat16 cache ranks
    just behind the float32 one of the same chunks."""
    rollout = 1 + 0.15 * math.log2(s.chunks) + (0.01 if s.cache_dtype == "bfloat16" else 0.0)
    update = (1 + 0.02 * math.log2(s.micro_batches)) * (4 / 3 if s.remat else 1.0)
    return 0.5 * rollout + 0.5 * update


def options(train: TrainConfig, auto: tuple[str, ...]) -> list[Settings]:
    """Every setting of the `auto` knobs (the others as in `train`), fastest first
    (relative_time). A bfloat16 cache is offered with all chunks only (at fewer chunks it
    saves what float32 at twice the chunks saves, exactly)."""
    unknown = sorted(set(auto) - set(KNOBS))
    if unknown:
        raise ValueError(f"auto = {unknown} is invalid; valid: knobs from {KNOBS}")
    now = Settings.of(train)
    rows = train.kept_rows // train.minibatches
    micro = _divisors(rows) if "optim.micro_batches" in auto else [now.micro_batches]
    remat = [False, True] if "optim.remat" in auto else [now.remat]
    chunks = _divisors(train.rollout.groups) if "rollout.chunks" in auto else [now.chunks]
    caches = [("float32", c) for c in chunks] if "rollout.cache_dtype" in auto else \
        [(now.cache_dtype, c) for c in chunks]
    if "rollout.cache_dtype" in auto:
        caches.append(("bfloat16", chunks[-1]))
    found = [Settings(m, r, dtype, c) for dtype, c in caches for r in remat for m in micro]
    return sorted(found, key=relative_time)


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What the estimate needs of a step: the model, L (buffer tokens per row), the rows
    rolled out and those of one update mini-batch, the state's bytes, PPO or not."""

    model: ModelConfig
    length: int
    rows: int
    minibatch_rows: int
    state_bytes: int
    critic: bool

    @classmethod
    def of(cls, train: TrainConfig, model: ModelConfig, length: int,
           state_bytes: int) -> StepShape:
        return cls(model, length, train.rollout.batch_size,
                   train.kept_rows // train.minibatches, state_bytes, train.algo == "ppo")


def cache_bytes(model: ModelConfig, rows: int, length: int, dtype: str) -> int:
    """The KV cache of `rows` rows of `length` slots: [layers, rows, kv heads, length, head
    dim] keys and values."""
    item = 2 if dtype == "bfloat16" else 4
    return 2 * model.num_layers * rows * model.num_kv_heads * length * model.head_dim * item


def _layer_bytes(model: ModelConfig, length: int) -> int:
    """One row's float32 activations in one layer of a training forward: the causal attention
    probabilities (query blocks of CAUSAL_BLOCK against the keys up to the block's end), the
    MLP's three [L, intermediate] arrays and six [L, hidden] ones."""
    pairs = length * (length + CAUSAL_BLOCK) / 2
    return int(4 * (model.num_heads * pairs + 3 * length * model.intermediate_size
                    + 6 * length * model.hidden_size))


def estimate(shape: StepShape, s: Settings) -> tuple[float, float]:
    """(rollout, update) temporaries in bytes under settings `s`, unscaled (see ESTIMATE)."""
    m, length = shape.model, shape.length
    rollout = ESTIMATE["rollout"] * cache_bytes(m, shape.rows // s.chunks, length,
                                                s.cache_dtype)
    layer = _layer_bytes(m, length)
    if s.remat:
        per_row = m.num_layers * 4 * length * m.hidden_size + ESTIMATE["live"] * layer
    else:
        per_row = m.num_layers * ESTIMATE["stored"] * layer
    together = 2 if shape.critic and s.micro_batches == 1 else 1
    update = (ESTIMATE["optimizer"] * shape.state_bytes
              + together * per_row * shape.minibatch_rows / s.micro_batches)
    return rollout, update


@dataclasses.dataclass(frozen=True)
class Choice:
    """The chosen settings, their compiled plan, and every plan compiled on the way."""

    settings: Settings
    needed: int  # bytes of the chosen step's plan
    budget: int  # bytes free when choosing
    where: str  # "host RAM" or the device kind
    auto: tuple[str, ...]  # the knobs chosen here (the others were set)
    compiled: tuple[tuple[Settings, int], ...]  # (settings, plan bytes) in compile order
    faster: int | None  # the least bytes a faster candidate needs (plan, or else estimate)

    def line(self) -> str:
        """One line: what was chosen and why."""
        why = ("" if self.faster is None else
               f"; every faster setting needs >= {self.faster / GIB:.1f} GiB")
        return (f"memory settings (unset, so chosen): {self.settings.describe(self.auto)}, the "
                f"fastest that fits {100 * (1 - MARGIN):.0f}% of the free memory: "
                f"{self.needed / GIB:.1f} GiB needed, {self.budget / GIB:.1f} GiB {self.where} "
                f"available{why} ({len(self.compiled)} compiled)")

    def record(self) -> dict:
        """A JSON-able record (experiments/run.py puts it in config.json)."""
        return {"settings": self.settings.values(), "auto": list(self.auto),
                "needed_gib": round(self.needed / GIB, 3),
                "available_gib": round(self.budget / GIB, 3), "where": self.where,
                "compiled": [{**s.values(), "needed_gib": round(n / GIB, 3)}
                             for s, n in self.compiled],
                "faster_needs_gib": None if self.faster is None else round(self.faster / GIB, 3)}


def choose(candidates: list[Settings], shape: StepShape, plan_of: Callable[[Settings], int],
           budget: int, where: str, auto: tuple[str, ...], hint: str = "",
           max_compiles: int = MAX_COMPILES) -> Choice:
    """The fastest of `candidates` (fastest first) whose plan fits (1 - MARGIN) x `budget`
    bytes; plan_of(settings) compiles the step with them and returns its plan's bytes. Raises
    MemoryError (with `hint`) when none that was compiled fits."""
    limit = (1 - MARGIN) * budget
    scale = [1.0, 1.0]  # rollout, update: compiled plan / estimate, as last seen
    compiled: list[tuple[Settings, int]] = []
    best: int | None = None

    def guess(i: int) -> float:
        rollout, update = estimate(shape, candidates[i])
        return shape.state_bytes + max(rollout * scale[0], update * scale[1])

    for _ in range(max_compiles):
        done = {s for s, _ in compiled}
        failed = [s for s, n in compiled if n > limit]
        pool = [i for i in range(len(candidates) if best is None else best)
                if candidates[i] not in done
                and not any(f.at_least_as_frugal(candidates[i]) for f in failed)]
        fitting = [i for i in pool if guess(i) <= limit]
        if fitting:
            i = fitting[0]
        elif best is None and pool:  # no estimate fits: the most frugal may still (of
            i = min(pool, key=lambda i: (guess(i), -i))  # equal estimates, the slowest)
        else:
            break
        needed = plan_of(candidates[i])
        compiled.append((candidates[i], needed))
        _rescale(scale, estimate(shape, candidates[i]), needed - shape.state_bytes)
        if needed <= limit:
            best = i
    if best is None:
        smallest = min(compiled, key=lambda c: c[1])
        raise MemoryError(
            f"the compiled train step would not fit with any memory settings tried: the most "
            f"frugal, {smallest[0].describe()}, needs {smallest[1] / GIB:.1f} GiB, "
            f"{budget / GIB:.1f} GiB {where} available ({100 * (1 - MARGIN):.0f}% may be "
            f"used). {hint}")
    plans = dict(compiled)
    faster = [plans.get(candidates[i], guess(i)) for i in range(best)]
    return Choice(candidates[best], plans[candidates[best]], budget, where,
                  tuple(k for k in KNOBS if k in auto), tuple(compiled),
                  int(min(faster)) if faster else None)


def _rescale(scale: list[float], estimates: tuple[float, float], temporaries: float) -> None:
    """After a compile: the larger scaled estimate becomes the plan's temporaries; the other
    is at most that (the step's phases run one after another, its plan is their maximum)."""
    temporaries = max(temporaries, 1.0)
    big = 0 if estimates[0] * scale[0] >= estimates[1] * scale[1] else 1
    for k in (0, 1):
        ratio = temporaries / max(estimates[k], 1.0)
        scale[k] = ratio if k == big else min(scale[k], ratio)
