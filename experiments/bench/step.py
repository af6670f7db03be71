"""Benchmark of the StarPO train step: compile time, per-phase time, tokens/s and peak memory.

    python experiments/bench/step.py            # tiny-random and SmolLM2, P=8, N=16, 5 turns
    python experiments/bench/step.py --quick    # tiny-random only, P=2, N=4, 2 turns
    python experiments/bench/step.py --compile-only --micro-batches 4 --remat --cache-dtype bfloat16
    python experiments/bench/step.py --config quickstart.py      # a run config's step, as run.py
    python experiments/bench/step.py --config quickstart.py --runs 3   # phases of the 3rd run
    python experiments/bench/step.py --config sokoban_ppo.py --set rollout.reply_tokens=100
    python experiments/bench/step.py --suite     # the CPU suite's multi-turn shape: Sokoban and
                                                 # FrozenLake, 4 x 8, 5 turns, 16-token replies,
                                                 # GRPO and PPO, full fine-tuning and LoRA
    python experiments/bench/step.py --paper     # sokoban_ppo.py with 100-token replies
    python experiments/bench/step.py --paper --compile-only # what autofit chooses, its plan
    python experiments/bench/step.py --suite --profile      # + rollout / update phase split
    python experiments/bench/step.py --suite --against 4eb1311 --pairs 2   # side by side

--suite and --paper bench run config files (as --config) and take --set the same way.
--profile adds, per config, the rollout's split into the first prompt's prefill, the later
turns' message prefills, the decode steps and the rest (environment, parsing, buffers), and
the update's into forward, backward and attention (each piece compiled alone at the step's
shapes and timed, its count from the config: an estimate beside the step's measured phases).
--against COMMIT checks COMMIT out into a git worktree (/tmp/starpo_against_<commit>) and, for
each config in turn, runs `--config FILE --set ...` alternately with that code's own copy of this
script (experiments/bench_step.py in commits before the move) and with this one (each run a
process of its own, `--pairs` times each), then prints each run's step and phases and the
ratio of the medians (older / this: > 1 is faster here).

--config benchmarks the step a run config file (experiments/configs) builds, exactly as
`experiments/run.py --config FILE` steps it: its model, shapes and settings, and the memory
knobs it leaves unset chosen from the compiled plan and the free memory (starpo_jax.sizing.autofit,
the line it prints says what it chose); `--set KEY=VALUE` overrides a key (repeatable).

--compile-only compiles the whole SmolLM2 step at the issue-5 shape without running it and
prints compile wall and CPU seconds, XLA's memory_analysis (temporaries, arguments, outputs:
temp + arguments is what the step needs resident) and the process's peak RSS. With --config,
--suite or --paper it compiles each config's step as run.py would run it instead: the memory
knobs the config leaves unset chosen by autofit first (the candidates it compiled are counted,
and their compiles are in the seconds), then the chosen step's plan against the free memory
(what to expect of a run before spending its step time, e.g. on a GPU whose compiles are long).

The step is compiled ahead of time (compile and run are timed apart) and run once, or `--runs
N` times in a row (each run the next step of the same state), the phases read from the last:
a compiled step's first run also sets up its kernels and touches its buffers for the first
time (the quickstart's first run takes ~3 s longer than its later ones). The step sends a
mark to the host as each phase ends
(`make_train_step(..., phase_clock=...)`, starpo_jax/phases.py), and a progress line goes to
stderr at each mark (rollout chunks, rollout, old log-probs, update). "rollout" is the
multi-turn rollout; "old_logprobs" the uncertainty filter, then one teacher-forced forward of
the kept rows (plus the critic's values for PPO); "update" the advantages and PPO passes.
Tokens/s counts every token in the buffers (prompts, env messages, replies) per second of the
whole step; generated tokens/s counts sampled tokens per second of the rollout. Peak RSS is the
process's (resource.getrusage) after the step, so it includes loading the model and compiling.

Then a table per model, one line per phase: its real (non-pad) tokens (every row's for the
rollout, the kept rows' for old log-probs and update) per second, and its model-FLOPs
utilisation: the phase's useful FLOPs (starpo_jax/sizing/flops.py: 2 x matmul weights per token per
forward plus causal attention, forward+backward = 3 forwards; real tokens only, a group's shared
first prompt once) / its seconds /
the f32 2048^3 matmul peak measured in the same run (bench/sampler.matmul_peak, the larger of
JAX's and torch's, as bench/sampler's table).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, NamedTuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from starpo_jax.hostmem import environ_without_huge_pages, reexec_with_huge_pages  # noqa: E402

if __name__ == "__main__":
    reexec_with_huge_pages()  # first: huge pages for XLA's CPU buffers (starpo_jax/hostmem.py)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import envs_jax  # noqa: E402
from sampler import matmul_peak  # noqa: E402
from starpo_jax import api  # noqa: E402
from starpo_jax.train.forward import sequence_logprobs  # noqa: E402
from starpo_jax.models import KVCache, layers  # noqa: E402
from starpo_jax.config import FilterConfig, OptimConfig, RolloutConfig, TrainConfig  # noqa: E402
from starpo_jax.sizing.flops import phase_flops  # noqa: E402
from starpo_jax.models import load_pretrained  # noqa: E402
from starpo_jax.phases import phase_name  # noqa: E402
from starpo_jax.analysis.suite import load_config  # noqa: E402
from starpo_jax.analysis.sweep import parse_overrides, setting_config  # noqa: E402
from starpo_jax.rollout.jax_env import buffer_length, prefill_cache  # noqa: E402
from starpo_jax.sizing.memory import host_available_bytes  # noqa: E402
from starpo_jax.text import build_codec  # noqa: E402
from starpo_jax.train.step import (filter_selection, init_train_state, make_train_fns,  # noqa: E402
                                   make_train_step)


PHASES = ("rollout", "old_logprobs", "update")


class Setup(NamedTuple):
    """What a bench runs: a label, the env's name and the pieces of its step."""

    name: str
    env_name: str
    model: Any
    tokenizer: Any
    env: Any
    codec: Any
    config: TrainConfig


def _setup(model_name: str, env_name: str, p: int, n: int, turns: int, reply: int, algo: str,
           knobs: dict):
    """The bench's own step: model_name's weights, P x N rows of env_name, the given knobs."""
    model, tok = load_pretrained(model_name)
    env = envs_jax.make(env_name)
    codec = build_codec(tok, env, mode="think", verify=20)  # announces the env's max tokens
    config = TrainConfig(
        algo=algo,
        rollout=RolloutConfig(groups=p, group_size=n, max_turns=turns, reply_tokens=reply,
                              cache_dtype=knobs["cache_dtype"], chunks=knobs["chunks"]),
        filter=FilterConfig(keep_ratio=0.25),
        optim=OptimConfig(micro_batches=knobs["micro_batches"],
                          remat=knobs["remat"]))
    return Setup(model_name, env_name, model, tok, env, codec, config)


def _read_config(name: str, sets: list[str]):
    """Run config file `name` with `sets` overrides ("KEY=VALUE"), every key and value checked
    (ValueError or FileNotFoundError naming the bad one)."""
    config = load_config(name)
    return setting_config(config, parse_overrides(sets, config))  # checks it, even with no sets


def _setup_config(name: str, config):
    """The step of run config `config` (read from file `name`) as experiments/run.py builds
    it, its unset memory knobs chosen against the free memory (api.check_memory)."""
    exp = api.build(config)
    if exp.auto:
        api.check_memory(exp)
        print(f"  {exp.memory.line()}", file=sys.stderr, flush=True)
    setup = Setup(f"{name}: {config.model.source}", config.env.name, exp.model, exp.tokenizer,
                  exp.env, exp.codec, exp.train)
    del exp  # its state and the choice's compiled step would count in the bench's peak
    gc.collect()
    jax.clear_caches()
    return setup


def compile_only(model_name: str, env_name: str, p: int, n: int, turns: int, reply: int, algo: str,
                 knobs: dict) -> dict:
    """Compiles the whole step on abstract inputs (nothing runs) and reads XLA's memory plan."""
    s = _setup(model_name, env_name, p, n, turns, reply, algo, knobs)
    config = s.config
    step = make_train_step(config, s.env, s.codec, model=s.model, eos_id=s.tokenizer.eos_token_id,
                           pad_id=s.tokenizer.pad_token_id)
    state = jax.eval_shape(lambda: init_train_state(config, jax.random.PRNGKey(1), model=s.model))
    wall, cpu = time.perf_counter(), time.process_time()
    compiled = step.lower(state, jax.random.PRNGKey(0)).compile()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    memory = compiled.memory_analysis()
    gib = 2**30
    return dict(model=model_name, B=p * n, L=buffer_length(s.codec, config.rollout), **knobs,
                compile_wall=wall, compile_cpu=cpu, temp_gib=memory.temp_size_in_bytes / gib,
                args_gib=memory.argument_size_in_bytes / gib,
                out_gib=memory.output_size_in_bytes / gib,
                temp_plus_args_gib=(memory.temp_size_in_bytes
                                    + memory.argument_size_in_bytes) / gib,
                peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)


def compile_config(name: str, config,
                   available: Callable[[], int | None] = host_available_bytes) -> dict:
    """Compiles run config `config`'s step (read from file `name`) as experiments/run.py does,
    without running it: the memory knobs it leaves unset chosen first (autofit compiles
    candidates against `available()`), then XLA's plan of the step that would run. Raises
    MemoryError, as run.py does, when that step does not fit."""
    exp = api.build(config)
    wall, cpu = time.perf_counter(), time.process_time()
    plan = api.check_memory(exp, available=available)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if exp.memory is not None:
        print(f"  {exp.memory.line()}", file=sys.stderr, flush=True)
    r, gib = exp.train.rollout, 2**30
    row = dict(model=f"{name}: {config.model.source}", B=r.groups * r.group_size,
               L=buffer_length(exp.codec, r), knobs=_knobs(exp.train),
               chosen=", ".join(exp.memory.auto) if exp.memory is not None
               else "none (set, or nothing to size against)",
               compiled=len(exp.memory.compiled) if exp.memory is not None else 1,
               compile_wall=wall, compile_cpu=cpu, needed_gib=plan.needed / gib,
               available_gib=None if plan.available is None else plan.available / gib,
               peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
    del exp  # the next config's (--suite) would otherwise be built beside it
    gc.collect()
    jax.clear_caches()
    return row


def _knobs(config: TrainConfig) -> str:
    """A step's memory knobs, as a row's `knobs` column shows them."""
    o, r = config.optim, config.rollout
    return f"mb {o.micro_batches}, remat {o.remat}, {r.cache_dtype} cache, {r.chunks} chunks"


class PhaseTimes:
    """The step's phase clock (starpo_jax/phases.py): seconds since `start()` of each mark, and a
    progress line on stderr as each phase ends (a SmolLM2 step runs for over an hour here)."""

    def __init__(self, total_chunks: int):
        self.total_chunks, self.marks, self.t0 = total_chunks, [], None

    def start(self) -> None:
        self.marks, self.t0 = [], time.perf_counter()

    def __call__(self, label: str, index: int) -> None:
        now = time.perf_counter() - self.t0
        self.marks.append((label, now))
        what = phase_name(label, index, self.total_chunks)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"  [{time.strftime('%H:%M:%S')}] {what} done at {now:.1f} s "
              f"(peak RSS so far {rss:.2f} GiB)", file=sys.stderr, flush=True)

    def at(self, label: str) -> float:
        """Seconds since start of the first mark called label."""
        return next(t for name, t in self.marks if name == label)


def _counting_step(fns, config: TrainConfig):
    """fns.step composed as make_train_step's program (same keys, same work), also returning
    what the useful FLOPs are counted from: the real tokens of every row [P, N] and of the rows
    of the K groups the filter selected [K, N], the groups' first-prompt lengths [P] and [K]
    (the prefix a group's rows share), and which of the K the filter really kept [K]."""
    group = config.rollout.group_size

    def step(state, key):
        rollout_key, update_key = jax.random.split(jax.random.fold_in(key, state.step))
        out = fns.rollout(state, rollout_key)
        state, metrics = fns.learn(state, out, update_key)
        selection = filter_selection(out, config)
        lengths = out.lengths.reshape(-1, group)
        prefix = out.prompt_lengths.reshape(-1, group)[:, 0]
        return state, metrics, (lengths, prefix, lengths[selection.indices],
                                 prefix[selection.indices], selection.kept)

    return jax.jit(step, donate_argnums=0)


def bench(setup: Setup, peak: float, runs: int = 1) -> dict:
    """The whole step of `setup` (_setup or _setup_config), compiled ahead of time and run
    `runs` times (each the next step of the same state); the last run's phases are read from
    marks the program sends to the host as each phase ends (a paper-shape SmolLM2 step takes
    tens of minutes on a 2-core CPU, so the phases are not run again on their own). peak: the
    machine's matmul FLOP/s, the MFU's denominator."""
    if runs < 1:
        raise ValueError(f"runs must be >= 1; got {runs!r}")
    name, env_name, model, tok, env, codec, config = setup
    r = config.rollout
    clock = PhaseTimes(r.chunks)
    fns = make_train_fns(config, env, codec, model=model, eos_id=tok.eos_token_id,
                         pad_id=tok.pad_token_id, phase_clock=clock)
    step = _counting_step(fns, config)
    model_config = model.config
    state = init_train_state(config, jax.random.PRNGKey(1), model=model)
    del model, setup  # the state holds the weights; the model's own copy would count in the peak
    start = time.perf_counter()
    compiled = step.lower(state, jax.random.PRNGKey(0)).compile()
    compile_time = time.perf_counter() - start
    print(f"  [{time.strftime('%H:%M:%S')}] {name}: step compiled in {compile_time:.1f} s",
          file=sys.stderr, flush=True)
    for _ in range(runs):
        clock.start()
        state, metrics, counts = jax.block_until_ready(compiled(state, jax.random.PRNGKey(0)))
        step_time = time.perf_counter() - clock.t0
    metrics, (lengths, prefix, kept, kept_prefix, really) = jax.device_get((metrics, counts))
    rollout_end, old_end = clock.at("rollout"), clock.at("old_logprobs")
    rows = r.groups * r.group_size
    generated = float(metrics["rollout/response_length"] * metrics["rollout/num_turns"]) * rows
    seconds = {"rollout": rollout_end, "old_logprobs": old_end - rollout_end,
               "update": step_time - old_end}
    kept, kept_prefix = kept[really], kept_prefix[really]
    tokens = {"rollout": int(lengths.sum()), "old_logprobs": int(kept.sum()),
              "update": int(kept.sum())}
    flops = phase_flops(model_config, config, lengths, kept, prefix, kept_prefix)
    length = buffer_length(codec, r)
    # Real tokens' share of the buffers the forwards run over: every row's for the rollout,
    # the kept rows' for the update.
    real_share = {"rollout": tokens["rollout"] / (rows * length),
                  "old_logprobs": tokens["update"] / max(kept.size * length, 1),
                  "update": tokens["update"] / max(kept.size * length, 1)}
    phases = {name: dict(seconds=seconds[name], tokens=tokens[name],
                         real_share=real_share[name],
                         tok_s=tokens[name] / seconds[name], gflop=flops[name] / 1e9,
                         mfu=flops[name] / seconds[name] / peak) for name in PHASES}
    return dict(model=name, env=env_name, algo=config.algo, B=rows,
                L=length, turns=r.max_turns, reply=r.reply_tokens, knobs=_knobs(config),
                compile_step=compile_time, **seconds, step=step_time,
                tok_s=tokens["rollout"] / step_time, gen_tok_s=generated / rollout_end,
                mfu=sum(flops.values()) / step_time / peak,
                peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                phases=phases)


def phase_table(row: dict) -> str:
    """The markdown table of one bench() row's phases: seconds, real tokens, tokens/s, useful
    GFLOP and MFU."""
    lines = [f"{row['model']} ({row['env']}, {row['algo']}, B={row['B']}, L={row['L']}):",
             "| phase | seconds | real tokens | real share | tokens/s | useful GFLOP | MFU |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, ph in row["phases"].items():
        lines.append(f"| {name} | {ph['seconds']:.2f} | {ph['tokens']} | "
                     f"{100 * ph['real_share']:.0f}% | {ph['tok_s']:.1f} | {ph['gflop']:.1f} | "
                     f"{100 * ph['mfu']:.1f}% |")
    return "\n".join(lines)


# The CPU suite's multi-turn shape (issue 32, target 1): each game's CPU config (GRPO, 4 x 8, 5
# turns, 16-token NoThink replies) with GRPO and PPO, full fine-tuning and LoRA (rank 32, the
# solver SFT start's adapters).
SUITE_VARIANTS = ([], ["algo=ppo"], ["lora.rank=32"], ["algo=ppo", "lora.rank=32"])
SUITE = tuple((name, variant) for name in ("sokoban_cpu.py", "frozen_lake_cpu.py")
              for variant in SUITE_VARIANTS)
PAPER = ("sokoban_ppo.py", ["rollout.reply_tokens=100"])  # issue 32's paper shape
COLUMNS = ("model", "env", "algo", "B", "L", "turns", "reply", "knobs", "compile_step", "rollout",
           "old_logprobs", "update", "step", "tok_s", "gen_tok_s", "mfu", "peak_rss_gib")


def _timed(fn, *args, reps: int = 2) -> float:
    """Best seconds of `reps` runs of a compiled fn(*args) (compiled and run once first)."""
    compiled = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        best = min(best, time.perf_counter() - start)
    return best


def profile(setup: Setup) -> dict:
    """Seconds of the step's pieces, each compiled alone at the setup's shapes and timed, times
    its count in one step (an estimate; the step's own phases are measured by bench()).

    rollout (per chunk of rollout.chunks): the groups' first prompts prefilled into an empty
    cache (once), a turn's environment message prefilled for every row into a half-full cache
    (max_turns - 1 times; as the rollout does, jax_env.prefill_cache: up to the longest real
    message of the rows' initial states, not the static width), one decode step of every row
    against a half-full cache (max_turns x reply_tokens times: an upper bound, replies that
    stop early take fewer). update: one micro-batch slice of the kept rows, a teacher-forced
    pass over the whole buffer without and with the gradient (the per-row path), and its causal
    attention alone (every layer, forward and forward+backward), times the slices, mini-batches
    and epochs."""
    model, codec, config = setup.model, setup.codec, setup.config
    r, o, mc = config.rollout, config.optim, setup.model.config
    rows, length = r.groups * r.group_size // r.chunks, buffer_length(codec, r)
    graph, params = nnx.split(model)
    ids = lambda b, t: jnp.ones((b, t), jnp.int32)  # noqa: E731 any token: the work is the same

    def cache(b: int, end: int) -> KVCache:
        empty = KVCache.init(mc, b, length, r.cache_dtype)
        return empty.replace(end=jnp.full((b,), end, jnp.int32))

    def prefill(params, tokens, kv):
        return prefill_cache(nnx.merge(graph, params), tokens,
                             jnp.full((tokens.shape[0],), tokens.shape[1], jnp.int32), kv)

    states, _ = jax.vmap(setup.env.reset)(jax.random.split(jax.random.PRNGKey(0), rows))
    symbols = jax.vmap(setup.env.render_symbols)(states)
    first_real = int(jnp.max(codec.first_prompt(symbols, jnp.zeros((rows,), jnp.int32))[1]))
    later_real = int(jnp.max(codec.next_prompt(jnp.full((rows,), 2), jnp.zeros((rows,)),
                                               symbols, jnp.zeros((rows,), jnp.int32))[1]))

    def decode(params, tokens, kv):
        return nnx.merge(graph, params)(tokens, cache=kv)

    half = length // 2
    out = {"first_prefill": r.chunks * _timed(prefill, params,
                                              ids(r.groups // r.chunks, first_real),
                                              cache(r.groups // r.chunks, 0)),
           "message_prefill": r.chunks * (r.max_turns - 1) * _timed(
               prefill, params, ids(rows, later_real), cache(rows, half)),
           "decode": r.chunks * r.max_turns * r.reply_tokens * _timed(
               decode, params, ids(rows, 1), cache(rows, half))}
    slice_rows = max(config.kept_rows // config.minibatches // o.micro_batches, 1)
    times = o.micro_batches * config.minibatches * o.ppo_epochs
    tokens = ids(slice_rows, length)
    lengths = jnp.full((slice_rows,), length, jnp.int32)
    slots = r.max_turns * r.reply_tokens
    mask = jnp.broadcast_to(jnp.arange(length) >= length - slots, tokens.shape)

    def logprob_sum(params):
        m = nnx.merge(graph, params)
        chunk = min(o.logit_chunk, slots)
        return sequence_logprobs(m, tokens, lengths, mask, slots, chunk)[0].sum()

    out["update_forward"] = times * _timed(logprob_sum, params)
    out["update_forward_backward"] = times * _timed(jax.grad(logprob_sum), params)
    heads, kv_heads, hd = mc.num_heads, mc.num_kv_heads, mc.head_dim
    q = jnp.ones((slice_rows, length, heads, hd), jnp.float32) * 0.1
    k = jnp.ones((slice_rows, kv_heads, length, hd), jnp.float32) * 0.1
    visible = jnp.broadcast_to(jnp.tril(jnp.ones((length, length), bool)),
                               (slice_rows, length, length))
    attend = lambda q, k, v: layers.attention(q, k, v, visible, causal=True).sum()  # noqa: E731
    layer_times = times * mc.num_layers
    out["attention_forward"] = layer_times * _timed(attend, q, k, k)
    out["attention_forward_backward"] = layer_times * _timed(
        jax.grad(attend, argnums=(0, 1, 2)), q, k, k)
    return out


def profile_table(row: dict) -> str:
    """The markdown table of one profile(): each piece's estimated seconds per step."""
    lines = [f"{row['model']}: pieces timed alone (seconds per step, estimated):",
             "| piece | seconds |", "|---|---:|"]
    lines += [f"| {name} | {sec:.2f} |" for name, sec in row["profile"].items()]
    rollout = row["rollout"] - sum(row["profile"][k] for k in ("first_prefill", "message_prefill",
                                                              "decode"))
    lines.append(f"| rollout rest (measured rollout - the three above) | {rollout:.2f} |")
    return "\n".join(lines)


def format_row(row: dict) -> str:
    """One bench() row as printed under the COLUMNS header (parse_rows reads it back)."""
    return " | ".join(f"{row[c]:.2f}" if isinstance(row[c], float) else str(row[c])
                      for c in COLUMNS)


def parse_rows(stdout: str) -> list[dict]:
    """The result rows a run of this script printed (the COLUMNS header, then one " | "-joined
    line per config until a blank line), numbers as floats; older commits print the same."""
    lines = stdout.splitlines()
    at = lines.index(" | ".join(COLUMNS)) + 1
    rows = []
    for line in lines[at:]:
        values = line.split(" | ")
        if len(values) != len(COLUMNS):
            break
        row = dict(zip(COLUMNS, values))
        for key in ("compile_step", "rollout", "old_logprobs", "update", "step", "mfu",
                    "peak_rss_gib"):
            row[key] = float(row[key])
        rows.append(row)
    return rows


def _script(root: str) -> str:
    """This benchmark's file in checkout `root` (experiments/bench_step.py before the move)."""
    for relative in ("experiments/bench/step.py", "experiments/bench_step.py"):
        if os.path.isfile(os.path.join(root, relative)):
            return os.path.join(root, relative)
    raise FileNotFoundError(f"no experiments/bench/step.py or experiments/bench_step.py in {root}")


def against(commit: str, cases: list[tuple[str, list[str]]], extra: list[str],
            pairs: int) -> None:
    """Benchmarks each run config of `cases` ((file, ["KEY=VALUE", ...])) on `commit`'s code (a
    git worktree, run with its own copy of this script) and on this checkout's, alternating one
    process per run, `pairs` runs each, and prints the runs and the ratio of the medians."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sha = subprocess.run(["git", "-C", here, "rev-parse", "--short", commit], check=True,
                         capture_output=True, text=True).stdout.strip()
    tree = f"/tmp/starpo_against_{sha}"
    if not os.path.isdir(tree):
        subprocess.run(["git", "-C", here, "worktree", "add", "--detach", tree, sha], check=True)
    codes = ((sha, tree, _script(tree)), ("this", here, os.path.abspath(__file__)))
    runs: dict[tuple[int, str], list[dict]] = {}
    for index, (name, sets) in enumerate(cases):
        for pair in range(pairs):
            for label, root, script in codes:
                print(f"[{time.strftime('%H:%M:%S')}] {name} {' '.join(sets)}: run {pair + 1}/"
                      f"{pairs} of {label} ({root}); load average {os.getloadavg()}", flush=True)
                command = [sys.executable, script, "--config", name, *extra]
                command += [f"--set={s}" for s in sets]
                # The older code runs as it did: without the huge pages this one adds.
                env = os.environ if label == "this" else environ_without_huge_pages(os.environ)
                done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True,
                                      env=dict(env, PYTHONPATH=root))
                print(done.stdout, end="", flush=True)
                runs.setdefault((index, label), []).extend(parse_rows(done.stdout))
    print(f"\nside by side ({pairs} runs each, alternating; load average now "
          f"{os.getloadavg()}); ratio = median {sha} / median this (> 1: faster here):")
    print("| config | phase | " + " | ".join(f"{sha} run {i + 1}" for i in range(pairs))
          + " | " + " | ".join(f"this run {i + 1}" for i in range(pairs)) + " | ratio |")
    print("|---|---|" + "---:|" * (2 * pairs + 1))
    for index, (name, sets) in enumerate(cases):
        label = " ".join([name, *sets])
        for phase in ("rollout", "old_logprobs", "update", "step", "compile_step",
                      "peak_rss_gib"):
            old = [row[phase] for row in runs[index, sha]]
            new = [row[phase] for row in runs[index, "this"]]
            new_median = statistics.median(new)
            ratio = (f"{statistics.median(old) / new_median:.2f}x" if new_median > 0
                     else "-")  # a phase this config does not have (GRPO's old log-probs)
            print(f"| {label} | {phase} | " + " | ".join(f"{x:.2f}" for x in old + new)
                  + f" | {ratio} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny-random only, small batch")
    parser.add_argument("--model", default=None,
                        help="only this model (tiny-random or smollm2-135m-instruct)")
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--algo", default="ppo", choices=("ppo", "grpo"))
    parser.add_argument("--reply", type=int, default=100, help="reply token budget per turn")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the step, print its memory plan (with --config, "
                        "--suite or --paper: each config's step with the memory knobs autofit "
                        "chooses; else SmolLM2, P=8, N=16, 5 turns with the knob flags)")
    parser.add_argument("--micro-batches", type=int, default=1, help="optim.micro_batches")
    parser.add_argument("--remat", action="store_true", help="optim.remat")
    parser.add_argument("--cache-dtype", default="float32", choices=("float32", "bfloat16"),
                        help="rollout.cache_dtype")
    parser.add_argument("--rollout-chunks", type=int, default=1, help="rollout.chunks")
    parser.add_argument("--config", default=None,
                        help="bench this run config file's step instead (experiments/configs), "
                        "its unset memory knobs chosen as run.py chooses them")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="with --config: override a config key (repeatable)")
    parser.add_argument("--runs", type=int, default=1,
                        help="run the compiled step this many times, report the last run")
    parser.add_argument("--suite", action="store_true",
                        help="bench the CPU suite's multi-turn shape: sokoban_cpu.py and "
                             "frozen_lake_cpu.py, each GRPO / PPO x full / LoRA rank 32")
    parser.add_argument("--paper", action="store_true",
                        help=f"bench the paper shape: {PAPER[0]} with {PAPER[1][0]}")
    parser.add_argument("--profile", action="store_true",
                        help="also time the rollout's and the update's pieces alone")
    parser.add_argument("--against", default=None, metavar="COMMIT",
                        help="run side by side with COMMIT's code (a git worktree), alternating")
    parser.add_argument("--pairs", type=int, default=1, help="with --against: runs of each")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args()
    names = ([(args.config, [])] if args.config else list(SUITE) if args.suite
             else [PAPER] if args.paper else [])
    if args.runs < 1:
        parser.error(f"--runs must be >= 1; got {args.runs}")
    if args.set and not names:
        parser.error("--set goes with --config, --suite or --paper")
    if args.against:
        if not names or args.profile or args.json or args.compile_only:
            parser.error("--against goes with --config, --suite or --paper (and not --profile, "
                         "--json or --compile-only): it runs each config on both codes")
        if args.pairs < 1:
            parser.error(f"--pairs must be >= 1; got {args.pairs}")
        against(args.against, [(name, sets + args.set) for name, sets in names],
                [f"--runs={args.runs}"], args.pairs)
        return
    knobs = dict(micro_batches=args.micro_batches, remat=args.remat, cache_dtype=args.cache_dtype,
                 chunks=args.rollout_chunks)
    if names:
        try:
            configs = [(name, _read_config(name, sets + args.set)) for name, sets in names]
        except (ValueError, FileNotFoundError) as error:
            parser.error(str(error))
    if args.compile_only:
        rows = ([compile_config(n, c) for n, c in configs] if names else
                [compile_only("smollm2-135m-instruct", args.env, 8, 16, 5, args.reply,
                              args.algo, knobs)])
        print(" | ".join(rows[0]))
        for row in rows:
            print(" | ".join(f"{v:.2f}" if isinstance(v, float) else str(v)
                             for v in row.values()))
        return
    if names:
        cases = [lambda n=n, c=c: _setup_config(n, c) for n, c in configs]
    elif args.quick:
        cases = [lambda: _setup("tiny-random", args.env, 2, 4, 2, 16, args.algo, knobs)]
    else:
        cases = [lambda m=m: _setup(m, args.env, 8, 16, 5, args.reply, args.algo, knobs)
                 for m in ("tiny-random", "smollm2-135m-instruct") if args.model in (None, m)]
    peak = max(matmul_peak(2048, 3))
    print(f"devices: {jax.devices()}; f32 2048^3 matmul peak: {peak / 1e9:.1f} GFLOP/s")
    print(" | ".join(COLUMNS))
    rows = []
    for case in cases:
        setup = [case()]  # popped into bench(): no reference left here to count in the peak
        pieces = profile(setup[0]) if args.profile else None
        rows.append(bench(setup.pop(), peak, args.runs))
        if pieces:
            rows[-1]["profile"] = pieces
        print(format_row(rows[-1]), flush=True)
    for row in rows:
        print(f"\n{phase_table(row)}")
        if "profile" in row:
            print(f"\n{profile_table(row)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
