"""Baselines of TextArena's offline single-player games: a random policy and SmolLM2 zero-shot.

    PYTHONPATH=. python experiments/textarena_baselines.py [--games GuessTheNumber-v0,...]
        [--episodes 64] [--zero-shot-games ...] [--zero-shot-episodes 16] [--turns 8]
        [--model smollm2-135m-instruct]

Every game is played under one budget, `--turns` moves (one move a turn, as
envs_host.textarena_env.TextArenaEnv's settings). Prints one markdown table, a row per game
and policy: success rate (TextArena's win: reward 1), mean final reward, and valid rate.

- random: `--episodes` games of seeds 0.. ; each move drawn uniformly from the game's own move
  format with values in the board's range (SAMPLERS: e.g. Mastermind "[a b c d]" of four
  distinct digits 1-6, TowerOfHanoi "[X Y]" of two distinct towers); its valid rate is the
  fraction of moves the game accepted (action_is_valid). The policy's generator is seeded
  apart from the game's (seeded with the same number, it would draw the game's own secrets).
- zero-shot: the model (the embedded SmolLM2-135M-Instruct by default) evaluated by the
  project's evaluator (api.build_evaluator: `--zero-shot-episodes` held-out games of seed 0,
  one rollout each, sampled at the evaluation's temperature, NoThink replies of up to 24
  tokens); its valid rate is the evaluator's action_is_valid (replies in the answer format).
  Slow on a CPU (minutes per game): only `--zero-shot-games` get this row.
The docs' table (docs/environments.md, "TextArena") comes from this script.
"""

from __future__ import annotations

import argparse
import os
import random
import string
import sys
import time

import numpy as np

from envs_host.textarena_env import TextArenaEnv


def _pick(*options):
    return lambda rng: rng.choice(options)


def _ints(*ranges, fmt="[{}]"):
    return lambda rng: fmt.format(" ".join(str(rng.randint(lo, hi)) for lo, hi in ranges))


MOVES = ("up", "down", "left", "right")
SAMPLERS = {
    "2048-v0-ultra-easy": _pick("[Up]", "[Down]", "[Left]", "[Right]"),
    "Bandit-v0": _pick("[red]", "[blue]", "[green]", "[yellow]", "[purple]"),
    "Blackjack-v0": _pick("[Hit]", "[Stand]"),
    "Countdown-v0": lambda rng: "[{} {} {}]".format(*rng.sample(range(6), 2), rng.choice("+-*/")),
    "Crosswords-v0": lambda rng: "[{} {} {}]".format(rng.randint(0, 11), rng.randint(0, 11),
                                                     rng.choice(string.ascii_lowercase)),
    "Cryptarithm-v0": lambda rng: f"[{rng.choice('SENDMORY')} {rng.randint(0, 9)}]",
    "FifteenPuzzle-v0": _pick(*(f"[{m}]" for m in MOVES)),
    "FrozenLake-v0": _pick(*(f"[{m}]" for m in MOVES)),
    "GuessTheNumber-v0": _ints((1, 20)),
    "LightsOut-v0": _ints((0, 4), (0, 4)),
    "Mastermind-v0": lambda rng: "[{}]".format(" ".join(map(str, rng.sample(range(1, 7), 4)))),
    "Minesweeper-v0-small": _ints((0, 4), (0, 4)),
    "PegJump-v0": lambda rng: "[{} {}]".format(*rng.sample(range(1, 16), 2)),
    "RushHour-v0": lambda rng: f"[{rng.choice('ABCDEFGHX')}{rng.choice('+-')}]",
    "Secretary-v0": _pick("[accept]", "[continue]"),
    "Set-v0": lambda rng: "[{}, {}, {}]".format(*rng.sample(range(1, 13), 3)),
    "Slitherlink-v0": lambda rng: "[{} {} {}]".format(rng.choice("hv"), rng.randint(0, 4),
                                                      rng.randint(0, 4)),
    "Sokoban-v0": _pick(*(f"[{m}]" for m in MOVES)),
    "Sudoku-v0-very-easy": _ints((1, 9), (1, 9), (1, 9)),
    "ThreeCardMonte-v0": _ints((0, 2)),
    "TowerOfHanoi-v0": lambda rng: "[{} {}]".format(*rng.sample("ABC", 2)),
}
ZERO_SHOT = ("GuessTheNumber-v0,Mastermind-v0,TowerOfHanoi-v0,Minesweeper-v0-small,"
             "FrozenLake-v0,ThreeCardMonte-v0,Secretary-v0")


def random_row(game: str, episodes: int, turns: int) -> dict[str, float]:
    """The random policy's success rate, mean final reward and valid-move rate."""
    env, sample = TextArenaEnv(game), SAMPLERS[game]
    wins, rewards, valid = [], [], []
    for seed in range(episodes):
        rng = random.Random(f"random policy {seed}")  # not the game's own seed: its draws
        env.reset(seed)
        total, success = 0.0, False
        for _ in range(turns):
            _, reward, done, info = env.step(sample(rng))
            total += reward
            success = info["success"]
            valid.append(info["action_is_valid"])
            if done:
                break
        wins.append(success)
        rewards.append(total)
    return {"success": np.mean(wins), "reward": np.mean(rewards), "valid": np.mean(valid)}


def _observation_tokens(game: str) -> int:
    """Room for the game's first observations (seeds 0-7), about 3 characters a token."""
    env = TextArenaEnv(game)
    longest = max(len(env.reset(seed)) for seed in range(8))
    return int(np.ceil((longest / 3 + 32) / 64) * 64)


def zero_shot_row(game: str, episodes: int, turns: int, model: str) -> dict[str, float]:
    """The model's held-out evaluation (sampled) through the project's evaluator."""
    from starpo_jax import api

    name = f"textarena:{game}"
    c = api.config_for(name, "grpo", groups=1, group_size=2, max_turns=turns,
                       max_actions_per_traj=turns, reply_tokens=24)
    c.model.source = model
    c.nothink = True
    c.env.kwargs = {"observation_tokens": _observation_tokens(game)}
    c.eval.update(episodes=episodes, modes="sampled", pass_k=1, seed=0)
    exp = api.build(c)
    evaluator = api.build_evaluator(exp)
    try:
        m = evaluator.evaluate(exp.state.actor).metrics
    finally:
        evaluator.close()
    key = f"val/{name}/sampled/"
    return {"success": m[key + "success"], "reward": m[key + "reward"],
            "valid": m[key + "action_is_valid"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--games", default=",".join(SAMPLERS))
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--zero-shot-games", default=ZERO_SHOT, help="'' for none")
    parser.add_argument("--zero-shot-episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    zero_shot = [g for g in args.zero_shot_games.split(",") if g]
    print(f"{args.turns} moves a game, one a turn\n")
    print("| game | policy | success | mean reward | valid |")
    print("|---|---|---|---|---|")
    for game in args.games.split(","):
        rows = [("random", args.episodes, lambda: random_row(game, args.episodes, args.turns))]
        if game in zero_shot:
            rows.append((f"{args.model} zero-shot", args.zero_shot_episodes,
                         lambda: zero_shot_row(game, args.zero_shot_episodes, args.turns,
                                               args.model)))
        for policy, n, run in rows:
            start = time.perf_counter()
            r = run()
            print(f"| {game} | {policy} (n={n}) | {r['success']:.0%} | {r['reward']:.2f} | "
                  f"{r['valid']:.0%} |", flush=True)
            print(f"{game} {policy}: {time.perf_counter() - start:.0f} s", file=sys.stderr,
                  flush=True)


if __name__ == "__main__":
    main()
