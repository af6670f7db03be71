"""Benchmark of the StarPO train step: compile time, per-phase time, tokens/s and peak memory.

    python experiments/bench_step.py            # tiny-random and SmolLM2, P=8, N=16, 5 turns
    python experiments/bench_step.py --quick    # tiny-random only, P=2, N=4, 2 turns
    python experiments/bench_step.py --compile-only --micro-batches 4 --remat --cache-dtype bfloat16

--compile-only compiles the whole SmolLM2 step at the issue-5 shape without running it and
prints compile wall and CPU seconds, XLA's memory_analysis (temporaries, arguments, outputs:
temp + arguments is what the step needs resident) and the process's peak RSS.

The step is compiled ahead of time (compile and run are timed apart) and run once. Its phases
are read from that one run: the step sends a mark to the host as each phase ends
(`make_train_step(..., phase_clock=...)`, starpo_jax/phases.py), and a progress line goes to
stderr at each mark (rollout chunks, rollout, old log-probs, update). "rollout" is the
multi-turn rollout; "old_logprobs" the uncertainty filter, then one teacher-forced forward of
the kept rows (plus the critic's values for PPO); "update" the advantages and PPO passes.
Tokens/s counts every token in the buffers (prompts, env messages, replies) per second of the
whole step; generated tokens/s counts sampled tokens per second of the rollout. Peak RSS is the
process's (resource.getrusage) after the step, so it includes loading the model and compiling.

Then a table per model, one line per phase: its real (non-pad) tokens (every row's for the
rollout, the kept rows' for old log-probs and update) per second, and its model-FLOPs
utilisation: the phase's useful FLOPs (starpo_jax/flops.py: 2 x matmul weights per token per
forward plus causal attention, forward+backward = 3 forwards; real tokens only) / its seconds /
the f32 2048^3 matmul peak measured in the same run (bench_sampler.matmul_peak, the larger of
JAX's and torch's, as bench_sampler's table).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import envs_jax  # noqa: E402
from bench_sampler import matmul_peak  # noqa: E402
from starpo_jax.config import FilterConfig, OptimConfig, RolloutConfig, TrainConfig  # noqa: E402
from starpo_jax.filtering import select_groups  # noqa: E402
from starpo_jax.flops import phase_flops  # noqa: E402
from starpo_jax.models import load_pretrained  # noqa: E402
from starpo_jax.phases import phase_name  # noqa: E402
from starpo_jax.rollout import buffer_length  # noqa: E402
from starpo_jax.text import build_codec  # noqa: E402
from starpo_jax.train import init_train_state, make_train_fns, make_train_step  # noqa: E402


PHASES = ("rollout", "old_logprobs", "update")


def _setup(model_name: str, env_name: str, p: int, n: int, turns: int, reply: int, algo: str,
           knobs: dict):
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
    return model, tok, env, codec, config


def compile_only(model_name: str, env_name: str, p: int, n: int, turns: int, reply: int, algo: str,
                 knobs: dict) -> dict:
    """Compiles the whole step on abstract inputs (nothing runs) and reads XLA's memory plan."""
    model, tok, env, codec, config = _setup(model_name, env_name, p, n, turns, reply, algo, knobs)
    step = make_train_step(config, env, codec, model=model, eos_id=tok.eos_token_id,
                           pad_id=tok.pad_token_id)
    state = jax.eval_shape(lambda: init_train_state(config, jax.random.PRNGKey(1), model=model))
    wall, cpu = time.perf_counter(), time.process_time()
    compiled = step.lower(state, jax.random.PRNGKey(0)).compile()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    memory = compiled.memory_analysis()
    gib = 2**30
    return dict(model=model_name, B=p * n, L=buffer_length(codec, config.rollout), **knobs,
                compile_wall=wall, compile_cpu=cpu, temp_gib=memory.temp_size_in_bytes / gib,
                args_gib=memory.argument_size_in_bytes / gib,
                out_gib=memory.output_size_in_bytes / gib,
                temp_plus_args_gib=(memory.temp_size_in_bytes
                                    + memory.argument_size_in_bytes) / gib,
                peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)


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
    the real tokens of every row [B] and of the rows the update trains on [K, N] (zero for
    groups the filter did not really keep): the counts the FLOPs are computed from."""
    group = config.rollout.group_size

    def step(state, key):
        rollout_key, update_key = jax.random.split(jax.random.fold_in(key, state.step))
        out = fns.rollout(state, rollout_key)
        state, metrics = fns.learn(state, out, update_key)
        selection = select_groups(out.scores_without_penalty.reshape(-1, group), config.filter)
        kept = out.lengths.reshape(-1, group)[selection.indices] * selection.kept[:, None]
        return state, metrics, out.lengths, kept

    return jax.jit(step, donate_argnums=0)


def bench(model_name: str, env_name: str, p: int, n: int, turns: int, reply: int, algo: str,
          knobs: dict, peak: float):
    """The whole step, compiled ahead of time and run once; its phases are read from marks the
    program sends to the host as each phase ends (one run: a SmolLM2 step takes over an hour on
    a 2-core CPU, so the phases are not run again on their own). peak: the machine's matmul
    FLOP/s, the MFU's denominator."""
    model, tok, env, codec, config = _setup(model_name, env_name, p, n, turns, reply, algo, knobs)
    clock = PhaseTimes(knobs["chunks"])
    fns = make_train_fns(config, env, codec, model=model, eos_id=tok.eos_token_id,
                         pad_id=tok.pad_token_id, phase_clock=clock)
    step = _counting_step(fns, config)
    model_config = model.config
    state = init_train_state(config, jax.random.PRNGKey(1), model=model)
    del model  # the state holds the weights; the model's own copy would count in the peak
    start = time.perf_counter()
    compiled = step.lower(state, jax.random.PRNGKey(0)).compile()
    compile_time = time.perf_counter() - start
    print(f"  [{time.strftime('%H:%M:%S')}] {model_name}: step compiled in {compile_time:.1f} s",
          file=sys.stderr, flush=True)
    clock.start()
    state, metrics, lengths, kept = jax.block_until_ready(compiled(state,
                                                                   jax.random.PRNGKey(0)))
    step_time = time.perf_counter() - clock.t0
    metrics, lengths, kept = jax.device_get((metrics, lengths, kept))
    rollout_end, old_end = clock.at("rollout"), clock.at("old_logprobs")
    rows = p * n
    generated = float(metrics["rollout/response_length"] * metrics["rollout/num_turns"]) * rows
    seconds = {"rollout": rollout_end, "old_logprobs": old_end - rollout_end,
               "update": step_time - old_end}
    kept = np.asarray(kept).ravel()
    kept = kept[kept > 0]
    tokens = {"rollout": int(lengths.sum()), "old_logprobs": int(kept.sum()),
              "update": int(kept.sum())}
    flops = phase_flops(model_config, config, lengths, kept)
    phases = {name: dict(seconds=seconds[name], tokens=tokens[name],
                         tok_s=tokens[name] / seconds[name], gflop=flops[name] / 1e9,
                         mfu=flops[name] / seconds[name] / peak) for name in PHASES}
    return dict(model=model_name, env=env_name, algo=algo, B=rows,
                L=buffer_length(codec, config.rollout), turns=turns, reply=reply,
                compile_step=compile_time, **seconds, step=step_time,
                tok_s=tokens["rollout"] / step_time, gen_tok_s=generated / rollout_end,
                mfu=sum(flops.values()) / step_time / peak,
                peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                phases=phases)


def phase_table(row: dict) -> str:
    """The markdown table of one bench() row's phases: seconds, real tokens, tokens/s, useful
    GFLOP and MFU."""
    lines = [f"{row['model']} ({row['env']}, {row['algo']}, B={row['B']}, L={row['L']}):",
             "| phase | seconds | real tokens | tokens/s | useful GFLOP | MFU |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, ph in row["phases"].items():
        lines.append(f"| {name} | {ph['seconds']:.2f} | {ph['tokens']} | {ph['tok_s']:.1f} | "
                     f"{ph['gflop']:.1f} | {100 * ph['mfu']:.1f}% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny-random only, small batch")
    parser.add_argument("--model", default=None,
                        help="only this model (tiny-random or smollm2-135m-instruct)")
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--algo", default="ppo", choices=("ppo", "grpo"))
    parser.add_argument("--reply", type=int, default=100, help="reply token budget per turn")
    parser.add_argument("--compile-only", action="store_true",
                        help="SmolLM2, P=8, N=16, 5 turns: compile the step, print its memory plan")
    parser.add_argument("--micro-batches", type=int, default=1, help="optim.micro_batches")
    parser.add_argument("--remat", action="store_true", help="optim.remat")
    parser.add_argument("--cache-dtype", default="float32", choices=("float32", "bfloat16"),
                        help="rollout.cache_dtype")
    parser.add_argument("--rollout-chunks", type=int, default=1, help="rollout.chunks")
    args = parser.parse_args()
    knobs = dict(micro_batches=args.micro_batches, remat=args.remat, cache_dtype=args.cache_dtype,
                 chunks=args.rollout_chunks)
    if args.compile_only:
        row = compile_only("smollm2-135m-instruct", args.env, 8, 16, 5, args.reply, args.algo,
                           knobs)
        print(" | ".join(row))
        print(" | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row.values()))
        return
    if args.quick:
        cases = [("tiny-random", 2, 4, 2, 16)]
    else:
        cases = [(m, 8, 16, 5, args.reply) for m in ("tiny-random", "smollm2-135m-instruct")
                 if args.model in (None, m)]
    peak = max(matmul_peak(2048, 3))
    print(f"devices: {jax.devices()}; f32 2048^3 matmul peak: {peak / 1e9:.1f} GFLOP/s")
    cols = ("model", "env", "algo", "B", "L", "turns", "reply", "compile_step", "rollout",
            "old_logprobs", "update", "step", "tok_s", "gen_tok_s", "mfu", "peak_rss_gib")
    print(" | ".join(cols))
    rows = []
    for model_name, p, n, turns, reply in cases:
        rows.append(bench(model_name, args.env, p, n, turns, reply, args.algo, knobs, peak))
        print(" | ".join(f"{rows[-1][c]:.2f}" if isinstance(rows[-1][c], float)
                         else str(rows[-1][c]) for c in cols), flush=True)
    for row in rows:
        print(f"\n{phase_table(row)}")


if __name__ == "__main__":
    main()
