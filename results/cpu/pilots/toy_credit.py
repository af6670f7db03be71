"""GiGPO against GRPO on the toy two-turn game of the tests (tests/helpers/toy_lake.py: a fixed
2x2 FrozenLake, only Right then Down wins; tiny-random model, SFT on `random` demonstrations,
then 8 x 4 rollouts a step, no filter, group-mean baselines, lr 2e-3), seeds 0-2, 60 steps:
how fast each learns the plan. A table on stdout (minutes on a 2-core CPU):

    python results/cpu/pilots/toy_credit.py [--steps 60] [--seeds 0,1,2]

GiGPO's anchor groups here: every first turn starts from the same state, and second turns
group by where the first move left the player, so its step-level advantage compares second
moves made from the same square, the credit GRPO spreads over the whole trajectory.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))

import numpy as np  # noqa: E402

from starpo_jax import api  # noqa: E402
from helpers.toy_lake import rl_config, sft_start  # noqa: E402


def first_step_at(success: list[float], level: float, window: int = 5) -> int | None:
    """The first step whose trailing `window`-step mean success reaches `level`."""
    for i in range(window, len(success) + 1):
        if np.mean(success[i - window:i]) >= level:
            return i
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seeds", default="0,1,2")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        start = Path(tmp) / "sft"
        sft_start(start)
        rows = []
        for estimator in ("grpo", "gigpo"):
            for seed in seeds:
                c = rl_config(start, seed=seed)
                c.advantage.estimator = estimator
                if estimator == "gigpo":
                    c.advantage.step_mode = "mean"  # as the episode level's grpo_mode
                exp = api.build(c)
                success, anchors = [], []
                for _ in range(args.steps):
                    metrics = exp.step()
                    success.append(float(metrics["train/success"]))
                    anchors.append(float(metrics.get("rollout/anchor_share", float("nan"))))
                rows.append((estimator, seed, success, anchors))
                print(estimator, seed, np.round(success, 2).tolist(), flush=True)
    print(f"\n| estimator | seed | success, steps 1-5 | success, last 5 | first step at 0.5 "
          f"(5-step mean) | first step at 0.8 | mean success over {args.steps} steps | "
          "anchor share |")
    print("|---|---|---|---|---|---|---|---|")
    for estimator, seed, success, anchors in rows:
        at = [first_step_at(success, level) for level in (0.5, 0.8)]
        print(f"| {estimator} | {seed} | {np.mean(success[:5]):.2f} | {np.mean(success[-5:]):.2f}"
              f" | {at[0] or '-'} | {at[1] or '-'} | {np.mean(success):.2f} | "
              f"{np.nanmean(anchors):.2f} |")


if __name__ == "__main__":
    main()
