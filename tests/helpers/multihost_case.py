"""One training iteration's pieces, dumped for tests/test_multihost.py: run as a script by 2
processes (one CPU device each, gloo collectives), by 1 process on one device, or by 1 process
on 4 fake devices (a 2 x 2 fsdp x tp mesh), it builds each case's experiment as run.py does
(api.build: a mesh over every device of every process) and writes, from process 0, an .npz of
the rollout's tokens, prepare's values / advantages / returns / old log-probs, the update's
metrics, and the parameters and AdamW's state after it (gathered whole to the host).

    python tests/helpers/multihost_case.py OUT.npz CASE[,CASE...] [TP]

CASE: ppo_full, grpo_full, ppo_lora, grpo_lora (tiny-random, Bandit, 2 x 2 rows).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from starpo_jax.run.distributed import distributed_arguments, maybe_initialize  # noqa: E402

if distributed_arguments(os.environ) is not None:  # before any JAX computation
    maybe_initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from starpo_jax import api  # noqa: E402
from starpo_jax.train.step import make_train_fns, step_keys  # noqa: E402

CASES = ("ppo_full", "grpo_full", "ppo_lora", "grpo_lora")


def case_config(case: str, tp: int = 1) -> api.ConfigDict:
    """The tiny config of a case: PPO or GRPO, full fine-tuning or LoRA rank 4. tiny-random
    answers no bandit prompt validly, so every reward is equal and GRPO's advantages are 0: its
    gradient is the entropy bonus's (no KL term: at step 1 the policy is its reference, and the
    k3 term's gradient there is float rounding, which Adam's first step would amplify)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from helpers.tiny import tiny_config

    algo, tuning = case.split("_")
    config = tiny_config()
    config.algo = algo
    config.check_memory = False  # the same (default) memory knobs in every layout
    config.mesh.tp = tp
    if tuning == "lora":
        config.lora.rank = 4
    return config


def host(x) -> np.ndarray:
    """A (possibly multi-process) global array, whole, on the host."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def run_case(case: str, tp: int) -> dict[str, np.ndarray]:
    exp = api.build(case_config(case, tp))
    fns = make_train_fns(exp.train, exp.env, exp.codec, model=exp.model, mesh=exp.mesh,
                         eos_id=exp.tokenizer.eos_token_id, pad_id=exp.tokenizer.pad_token_id)
    state = exp.state
    rollout_key, update_key = step_keys(exp.key, state.step)
    # Each piece waited for: a CPU program runs once its inputs are ready, so a later
    # independent one (the gathers below) could otherwise run beside it, and two processes
    # would enter their collectives in different orders (see starpo_jax.run.distributed).
    rollout = jax.block_until_ready(jax.jit(fns.rollout)(state, rollout_key))
    batch = jax.block_until_ready(jax.jit(fns.prepare)(state, rollout))
    new, metrics = jax.block_until_ready(jax.jit(fns.update)(state, batch, update_key))
    out = {"tokens": host(rollout.tokens), "behaviour_logp": host(rollout.behaviour_logp),
           "loss_mask": host(rollout.loss_mask), "kept_mask": host(batch.rollout.loss_mask),
           "advantages": host(batch.advantages)}
    for name in ("returns", "old_values", "old_logp"):
        if getattr(batch, name) is not None:
            out[name] = host(getattr(batch, name))
    for name, value in metrics.items():
        out["metric/" + name] = host(value)
    for part in ("actor", "critic", "actor_opt", "critic_opt"):
        tree = getattr(new, part)
        if tree is None:
            continue
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
            out[f"{part}{jax.tree_util.keystr(path)}"] = host(leaf)
    return {f"{case}:{k}": v for k, v in out.items()}


def main() -> None:
    path, cases = sys.argv[1], sys.argv[2].split(",")
    tp = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    unknown = set(cases) - set(CASES)
    if unknown:
        sys.exit(f"unknown cases {sorted(unknown)}; valid: {CASES}")
    out = {}
    for case in cases:
        out.update(run_case(case, tp))
    if jax.process_index() == 0:
        np.savez(path, layout=np.array(f"{jax.process_count()} processes, "
                                       f"{jax.device_count()} devices, tp {tp}"), **out)


if __name__ == "__main__":
    main()
