"""Side-by-side timing of the step's learning half (prepare + update) with the shared-prefix
forward on and off, on one rollout, in one process.

    python experiments/bench/shared_prefix.py                      # quickstart, keep 1.0
    python experiments/bench/shared_prefix.py --micro-batches 4 --repeats 3
    python experiments/bench/shared_prefix.py --config sokoban_ppo.py --keep-ratio 0.25

One rollout of the config is sampled; `learn` (filter, old log-probs / values, the PPO / GRPO
updates) is compiled for optim.shared_prefix True and False and run on it alternately
(on, off, on, off, ...), so both see the same load on a shared machine. Prints each variant's
compile seconds, XLA's temporary memory for the program (GiB), the median seconds of a run and
the buffer tokens of the kept rows (kept rows x mean row length) per second, and checks that
both give the same metrics.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from starpo_jax import api  # noqa: E402
from starpo_jax.train.step import make_train_fns  # noqa: E402
from starpo_jax.analysis.suite import load_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="quickstart.py", help="a file in experiments/configs")
    parser.add_argument("--keep-ratio", type=float, default=1.0, help="filter.keep_ratio")
    parser.add_argument("--micro-batches", type=int, default=1, help="optim.micro_batches")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each variant")
    args = parser.parse_args()
    config = load_config(args.config)
    config.filter.keep_ratio = args.keep_ratio
    config.optim.micro_batches = args.micro_batches
    exp = api.build(config)
    kw = dict(model=exp.model, eos_id=exp.tokenizer.eos_token_id,
              pad_id=exp.tokenizer.pad_token_id)
    state, key = exp.state, jax.random.PRNGKey(0)
    out = jax.block_until_ready(
        jax.jit(make_train_fns(exp.train, exp.env, exp.codec, **kw).rollout)(state, key))
    rows = exp.train.kept_rows
    print(f"{args.config}: {rows} kept rows of L = {out.tokens.shape[1]}, micro_batches "
          f"{args.micro_batches}; mean row length {float(out.lengths.mean()):.0f} tokens, "
          f"first prompt {float(out.prompt_lengths.mean()):.0f}", flush=True)
    compiled, results = {}, {}
    for shared in (True, False):
        train = dataclasses.replace(exp.train, optim=dataclasses.replace(
            exp.train.optim, shared_prefix=shared))
        learn = jax.jit(make_train_fns(train, exp.env, exp.codec, **kw).learn)
        start = time.perf_counter()
        compiled[shared] = learn.lower(state, out, key).compile()
        temp = compiled[shared].memory_analysis().temp_size_in_bytes / 2**30
        results[shared] = dict(compile=time.perf_counter() - start, temp_gib=temp, runs=[])
    metrics = {}
    for _ in range(args.repeats):
        for shared in (True, False):
            start = time.perf_counter()
            _, metrics[shared] = jax.block_until_ready(compiled[shared](state, out, key))
            results[shared]["runs"].append(time.perf_counter() - start)
    tokens = float(out.lengths.mean()) * rows  # buffer tokens of the kept rows, on average
    print("shared_prefix | compile s | temp GiB | learn s (median) | kept tokens/s | runs")
    for shared, r in results.items():
        median = statistics.median(r["runs"])
        print(f"{shared} | {r['compile']:.1f} | {r['temp_gib']:.2f} | {median:.2f} | "
              f"{tokens / median:.0f} | {' '.join(f'{t:.2f}' for t in r['runs'])}")
    gap, name = max((abs(float(metrics[True][k]) - float(metrics[False][k])), k)
                    for k in metrics[False])
    print(f"largest metric difference on / off: {gap:.2e} ({name})")
    np.testing.assert_allclose(
        [float(metrics[True][k]) for k in sorted(metrics[False])],
        [float(metrics[False][k]) for k in sorted(metrics[False])], rtol=1e-3, atol=1e-5)


if __name__ == "__main__":
    main()
