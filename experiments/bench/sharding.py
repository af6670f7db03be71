"""Per-device memory of the compiled train step: one device against a 4-way data-sharded mesh.

    python experiments/bench/sharding.py                 # tiny-random, bandit PPO, B = 64 rows
    python experiments/bench/sharding.py --rows 128 --devices 8
    python experiments/bench/sharding.py --run --json    # also run both steps and compare them

The step (rollout, prepare, update: `make_train_step`) is compiled on abstract inputs for one
device (mesh None) and for a ("fsdp", "tp") mesh of --devices x 1, and XLA's memory plan of each
is printed per device: temporaries (activations, KV cache, logits), arguments (weights and
optimiser state) and the KV cache buffer read from the optimised HLO (its per-device shape
[layers, rows, kv_heads, L, head_dim]). With --run both steps run once from the same state and
key and the largest differences of their metrics and parameters are printed. The random
model's next-token distribution is nearly uniform over 49152 tokens, and the sampler inverts its
CDF: at temperature 1 a last-bit difference of the logits (a matmul of 4 rows rounds unlike one
of 16) moves a few sampled tokens, and the runs then differ by more than rounding; a low
--temperature (0.03) concentrates each draw on a few tokens, robust to rounding (much lower
saturates the softmax: the gradients vanish).
Fake CPU devices: XLA_FLAGS=--xla_force_host_platform_device_count is set before jax starts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

_parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
_parser.add_argument("--rows", type=int, default=64, help="B = groups x group_size rows")
_parser.add_argument("--group-size", type=int, default=4)
_parser.add_argument("--devices", type=int, default=4)
_parser.add_argument("--reply-tokens", type=int, default=16)
_parser.add_argument("--turns", type=int, default=2)
_parser.add_argument("--minibatch-rows", type=int, default=32)
_parser.add_argument("--micro-batches", type=int, default=1)
_parser.add_argument("--temperature", type=float, default=1.0,
                     help="rollout temperature (--run: see the module docstring)")
_parser.add_argument("--run", action="store_true", help="run both steps and compare them")
_parser.add_argument("--json", action="store_true", help="print one JSON line (for tests)")

if __name__ == "__main__":
    _args = _parser.parse_args()
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform"
                                   f"_device_count={_args.devices}")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import envs_jax  # noqa: E402
from starpo_jax.config import FilterConfig, OptimConfig, RolloutConfig, TrainConfig  # noqa: E402
from starpo_jax.models import load_pretrained  # noqa: E402
from starpo_jax.rollout.jax_env import buffer_length  # noqa: E402
from starpo_jax.models.sharding import make_mesh, shard_state  # noqa: E402
from starpo_jax.text import build_codec  # noqa: E402
from starpo_jax.train.step import init_train_state, make_train_step  # noqa: E402

# A short prompt: the rows' KV cache and activations, not the prompt, set the step's size.
SHORT_TEMPLATE = dict(system="", intro="",
                      turn="Turn {turn}:\n{state}\nActions left: {actions_left}. "
                           "Max {max_tokens} tokens.")


def setup(args: argparse.Namespace):
    """(model, tokenizer, env, codec, config): tiny-random on bandit, PPO, every row kept."""
    model, tok = load_pretrained("tiny-random")
    env = envs_jax.make("bandit")
    codec = build_codec(tok, env, mode="nothink", max_tokens=args.reply_tokens, verify=20,
                        **SHORT_TEMPLATE)
    if args.rows % args.group_size:
        raise ValueError(f"--rows {args.rows} must be a multiple of --group-size "
                         f"{args.group_size}")
    config = TrainConfig(
        algo="ppo",
        rollout=RolloutConfig(groups=args.rows // args.group_size, group_size=args.group_size,
                              max_turns=args.turns, reply_tokens=args.reply_tokens,
                              mode="nothink", temperature=args.temperature),
        filter=FilterConfig(keep_ratio=1.0),
        optim=OptimConfig(minibatch_rows=args.minibatch_rows, micro_batches=args.micro_batches))
    return model, tok, env, codec, config


def cache_rows(hlo: str, model, length: int) -> list[int]:
    """Row counts of the KV cache buffers in optimised HLO: every f32[layers, R, kv_heads, L,
    head_dim] shape (the cache's layout, unique to it at these shapes)."""
    c = model.config
    pattern = rf"f32\[{c.num_layers},(\d+),{c.num_kv_heads},{length},{c.head_dim}\]"
    return sorted({int(rows) for rows in re.findall(pattern, hlo)})


def measure(args: argparse.Namespace) -> dict:
    model, tok, env, codec, config = setup(args)
    length = buffer_length(codec, config.rollout)
    c = model.config
    out: dict = {"B": args.rows, "L": length, "devices": args.devices,
                 "actor_lr": config.optim.actor_lr, "critic_lr": config.optim.critic_lr}
    abstract = jax.eval_shape(lambda: init_train_state(config, jax.random.PRNGKey(1), model=model))
    meshes = {"single": None, "sharded": make_mesh(tp=1, devices=jax.devices()[:args.devices])}
    steps = {}
    for name, mesh in meshes.items():
        step = make_train_step(config, env, codec, model=model, eos_id=tok.eos_token_id,
                               pad_id=tok.pad_token_id, mesh=mesh)
        compiled = step.lower(abstract, jax.random.PRNGKey(0)).compile()
        memory = compiled.memory_analysis()
        rows = cache_rows(compiled.as_text(), model, length)
        out[name] = {"temp_bytes": memory.temp_size_in_bytes,
                     "argument_bytes": memory.argument_size_in_bytes,
                     "output_bytes": memory.output_size_in_bytes,
                     "cache_rows": rows,
                     # k and v of the largest cache buffer on one device
                     "cache_bytes": 2 * 4 * c.num_layers * max(rows, default=0) * c.num_kv_heads
                     * length * c.head_dim}
        steps[name] = compiled
    if args.run:
        results = {}
        start = jax.device_get(init_train_state(config, jax.random.PRNGKey(1), model=model))
        for name, mesh in meshes.items():
            state = init_train_state(config, jax.random.PRNGKey(1), model=model)
            if mesh is not None:
                state = shard_state(state, model, mesh)
            state, metrics = steps[name](state, jax.random.PRNGKey(0))
            results[name] = jax.device_get((state.actor, state.critic, metrics))
        (a1, c1, m1), (a2, c2, m2) = results["single"], results["sharded"]
        out["metrics"] = {k: [float(m1[k]), float(m2[k])] for k in m1}
        for name, x, y in (("actor", a1, a2), ("critic", c1, c2)):
            diff = np.concatenate([np.abs(u - v).ravel() for u, v in
                                   zip(jax.tree.leaves(x), jax.tree.leaves(y))])
            out[f"{name}_max_abs_diff"] = float(diff.max())
            out[f"{name}_max_step"] = max(float(np.max(np.abs(u - v))) for u, v in zip(
                jax.tree.leaves(x), jax.tree.leaves(getattr(start, name))))
            # Adam moves a weight by ~lr whatever its gradient's size: a near-zero gradient whose
            # sign float rounding flips moves it 2 lr apart. How many weights that is:
            out[f"{name}_share_diff_over_1e-7"] = float(np.mean(diff > 1e-7))
    return out


def main(args: argparse.Namespace) -> None:
    out = measure(args)
    if args.json:
        print("RESULT" + json.dumps(out))
        return
    mib = 2**20
    single, sharded = out["single"], out["sharded"]
    print(f"tiny-random, bandit PPO, B = {out['B']} rows, L = {out['L']}, "
          f"{out['devices']} devices (per device)")
    print(f"| {'':18} | {'1 device':>10} | {str(out['devices']) + ' devices':>10} | ratio |")
    print(f"|{'-' * 20}|{'-' * 11}:|{'-' * 11}:|------:|")
    for key, label in (("temp_bytes", "temp MiB"), ("argument_bytes", "arguments MiB"),
                       ("cache_bytes", "KV cache MiB")):
        a, b = single[key] / mib, sharded[key] / mib
        print(f"| {label:18} | {a:10.2f} | {b:10.2f} | {b / a if a else float('nan'):5.2f} |")
    print(f"| {'KV cache rows':18} | {str(single['cache_rows']):>10} | "
          f"{str(sharded['cache_rows']):>10} |       |")
    if "metrics" in out:
        worst = max(abs(a - b) / max(abs(a), 1e-3) for a, b in out["metrics"].values())
        print(f"sharded vs single: metrics max relative diff {worst:.2e}; weights max |diff| "
              f"actor {out['actor_max_abs_diff']:.2e} (lr {out['actor_lr']:g}), critic "
              f"{out['critic_max_abs_diff']:.2e} (lr {out['critic_lr']:g}); share of "
              f"weights > 1e-7 apart: actor {out['actor_share_diff_over_1e-7']:.2e}, critic "
              f"{out['critic_share_diff_over_1e-7']:.2e}")
        for key, (a, b) in sorted(out["metrics"].items()):
            if abs(a - b) > 2e-4 + 2e-3 * abs(a):
                print(f"  {key}: {a:.6g} vs {b:.6g}")


if __name__ == "__main__":
    sys.exit(main(_args))
