"""Memory settings chosen from the compiled step's memory plan and the free memory.

    shape = StepShape.of(train, model, length, state_bytes, prefix_width)
    candidates = options(train, auto, shape)     # fastest first
    choice = choose(candidates, shape, plan_of, budget=free_bytes)
    choice.settings.apply(train)                 # the TrainConfig to run
    print(choice.line())

Four settings trade speed for memory: optim.micro_batches and optim.remat (the update's
activations; exact up to float rounding), rollout.chunks (the rollout's KV cache and sampler
buffers: groups rolled out in sequential pieces, each with its own key, so the same
distribution with other random draws) and rollout.cache_dtype (bfloat16 halves the cache;
the sampler then differs from the trainer by bfloat16 rounding, rollout/logprob_diff_*). Those
left unset (None in api.default_config) are chosen here: the candidates are every combination
of their values, ordered by a step-time model fitted to this CPU's measured phases
(`relative_time`: the decode cost of a chunk's rows at the step's cache length, the positions
the update's row slices compute with a group's shared prompt once per slice, remat's extra
forward), of equal time the less memory first (micro-batches that keep whole groups together
are free), and a bfloat16 cache just behind the float32 one of the same chunks, as it is the
one inexact choice; the fastest whose compiled plan fits within (1 - MARGIN) of the free
memory is taken.

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
from starpo_jax.sizing.flops import matmul_weights
from starpo_jax.sizing.memory import GIB
from starpo_jax.models.config import ModelConfig
from starpo_jax.models.layers import CAUSAL_BLOCK
from starpo_jax.train.shared_prefix import PrefixPlan, slice_plans

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


# A step's time on this CPU, SmolLM2-135M, in ms (only their ratios rank settings; the costs
# scale with the model's matmul weights and, for attention, with its cache bytes per slot).
# Decode, per generated token of a chunk of r rows, each row's cache filled to S slots on
# average: DECODE_STEP / r + DECODE_ROW + S x DECODE_SLOT x (1 + DECODE_WIDE x log2(r / 32)),
# fitted (within 6%) to decode steps of SmolLM2 timed alone on this CPU (experiments/bench/
# sampler.py's decode step, float32 cache): per row-token 3.94 / 2.38 ms at 8 / 32 rows and 212
# filled slots (the quickstart's), 4.06 / 3.54 ms at 16 / 32 rows and 580 (the CPU suite's
# Sokoban), 5.40 / 4.77 / 5.01 / 6.16 ms at 16 / 32 / 64 / 128 rows and 1055 (the paper shape's).
# Larger chunks amortise the weights' read, but beyond 32 rows attention over the rows' caches
# costs more per slot: 32-row chunks are the fastest at long caches, one chunk at short ones.
# TRAIN_TOKEN: a forward and backward of 4 x 1288 positions in the same hour (6.3 ms each).
DECODE_STEP = 16.9  # per decode step whatever its rows: the weights read, the loop's own work
DECODE_ROW = 1.27  # per row and step: its matmuls
DECODE_SLOT = 2.85e-3  # per row, step and filled float32 cache slot: attention
DECODE_WIDE = 0.25  # attention's per-slot cost grows by this per doubling of rows beyond 32
TRAIN_TOKEN = 6.3  # per buffer position through forward and backward (a forward: a third)
# The update's slices on this CPU (the CPU suite's Sokoban GRPO step: 8 kept rows, L = 1288, a
# 208-token shared prompt, so 8848 / 4528 / 2368 / 1288 positions a slice in 1 / 2 / 4 / 8
# micro-batches as counted here; results/cpu/bench/update_micro_batches.txt and
# docs/performance.md): without remat a slice of many positions costs more per position (its
# stored activations: 75.1 / 66.3 / 75.0 s in 2 / 4 / 8 micro-batches, ~23% more per position
# at 4528 than at 2368 or 1288); with remat the same update took 50.1 / 59.5 / 63.3 s in 1 / 2
# / 4 micro-batches, the recomputed forward no dearer than the stored activations' traffic once
# slices are large. So between SLICE_FAST and SLICE_SLOW positions (bounds scaled inversely with
# the MLP's width, whose activations are the largest a position has) a slice without remat
# gains up to SLICE_EXCESS per position, and remat's extra forward (a third) fades to nothing.
SLICE_FAST = 2368
SLICE_SLOW = 4528
SLICE_EXCESS = 0.23
SMOLLM2 = {"weights": 134_479_872, "slot": 30 * 3 * 64,  # matmul_weights; layers x kv heads x hd
           "mlp": 1536}  # intermediate_size


def relative_time(shape: StepShape, train: TrainConfig, s: Settings) -> float:
    """A step's modelled time under settings `s` (ms of this CPU; see DECODE_* and TRAIN_TOKEN).

    Rollout: the chunk's rows r = rows / chunks set the decode cost per token above; fewer,
    larger chunks amortise the weights, but beyond 32 rows attention over the rows' caches
    costs more per slot. A bfloat16 cache ranks just behind the float32 one of the same
    chunks (it is the one inexact choice). Update and old log-probs: the positions the row
    slices compute, a group's shared first prompt once per slice that holds the group (the
    shared-prefix plans of shared_prefix.slice_plans), so micro-batches that keep whole groups
    together cost nothing and smaller ones recompute the prompt; a slice of many positions
    costs more per position without remat, and remat's extra forward (4/3) fades as slices
    grow (slice_cost); a PPO step runs it all for the critic too. Settings of equal time rank
    by memory (options).
    """
    m = shape.model
    weights = matmul_weights(m) / SMOLLM2["weights"]
    slot = m.num_layers * m.num_kv_heads * m.head_dim / SMOLLM2["slot"] * DECODE_SLOT
    r = shape.rows // s.chunks
    width = shape.prefix_width
    filled = (shape.length + (width if width is not None else 0)) / 2
    per_token = (weights * (DECODE_STEP / r + DECODE_ROW)
                 + filled * slot * (1 + DECODE_WIDE * max(0.0, math.log2(r / 32))))
    rollout = shape.rows * shape.decode_tokens * per_token
    rollout *= 1.001 if s.cache_dtype == "bfloat16" else 1.0
    prepare_plan, update_plan = slice_plans(width, s.apply(train))
    pieces = s.micro_batches
    prepare = pieces * _positions(prepare_plan, train.kept_rows // pieces, shape.length)
    rounds = train.minibatches * train.optim.ppo_epochs
    update = rounds * pieces * slice_cost(
        m, _positions(update_plan, shape.minibatch_rows // pieces, shape.length), s.remat)
    train_work = (prepare / 3 + update) * train.optim.rollout_reuse
    return rollout + (2 if shape.critic else 1) * weights * TRAIN_TOKEN * train_work


def slice_cost(model: ModelConfig, positions: int, remat: bool) -> float:
    """One update slice of `positions` positions through forward and backward, in positions of
    a small slice without remat (SLICE_FAST, SLICE_SLOW, SLICE_EXCESS): a large slice costs up
    to 1 + SLICE_EXCESS per position without remat; remat's extra forward (4/3 at small
    slices) fades to nothing at large ones."""
    scaled = positions * model.intermediate_size / SMOLLM2["mlp"]
    large = min(max((scaled - SLICE_FAST) / (SLICE_SLOW - SLICE_FAST), 0.0), 1.0)
    if remat:
        return positions * (1.0 + (1.0 - large) / 3)
    return positions * (1.0 + SLICE_EXCESS * large)


def _positions(plan: PrefixPlan | None, rows: int, length: int) -> int:
    """Positions one row slice's forward computes: every row whole without a plan; with one,
    its prefixes (slots x width) once and each row's remaining length - width."""
    if plan is None:
        return rows * length
    return plan.slots * plan.width + rows * (length - plan.width)


def options(train: TrainConfig, auto: tuple[str, ...], shape: StepShape) -> list[Settings]:
    """Every setting of the `auto` knobs (the others as in `train`), fastest first
    (relative_time), of equal modelled time the one needing less memory first (`estimate`:
    e.g. micro-batches that keep whole groups together cost no time and save memory). A
    bfloat16 cache is offered with all chunks only (at fewer chunks it saves what float32 at
    twice the chunks saves, exactly); with a bfloat16 sampler the cache is bfloat16 whatever
    cache_dtype says, so only that is offered."""
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
    if train.rollout.sampler_dtype == "bfloat16" and "rollout.cache_dtype" in auto:
        caches = [("bfloat16", c) for c in chunks]  # a bfloat16 sampler's cache is (jax_env.py)
    elif "rollout.cache_dtype" in auto:
        caches.append(("bfloat16", chunks[-1]))
    found = [Settings(m, r, dtype, c) for dtype, c in caches for r in remat for m in micro]
    return sorted(found, key=lambda s: (relative_time(shape, train, s), sum(estimate(shape, s))))


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What the estimates need of a step: the model, L (buffer tokens per row), the rows
    rolled out and those of one update mini-batch, the state's bytes, PPO or not, the tokens
    each row generates at most, and the width of the first prompt a group shares in the
    update's forwards (None: the rows run whole; train.shared_width)."""

    model: ModelConfig
    length: int
    rows: int
    minibatch_rows: int
    state_bytes: int
    critic: bool
    decode_tokens: int
    prefix_width: int | None

    @classmethod
    def of(cls, train: TrainConfig, model: ModelConfig, length: int, state_bytes: int,
           prefix_width: int | None = None) -> StepShape:
        r = train.rollout
        return cls(model, length, r.batch_size, train.kept_rows // train.minibatches,
                   state_bytes, train.algo == "ppo", r.max_turns * r.reply_tokens, prefix_width)


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
        """A JSON-able record (starpo_jax.run.loop puts it in config.json)."""
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
