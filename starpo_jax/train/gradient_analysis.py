"""RAGEN-2's gradient analysis: the policy-gradient norms of a step's kept rows, bucketed by
their group's reward std (the original's trainer.gradient_analysis_mode: rollout_filter.py's
split_into_buckets and gradient_reporter.py, the components of dp_actor.py's
grad_component_analysis).

    analysis = GradientAnalysis.of(exp)          # a run-level setting: config.gradient_analysis
    if analysis.due(exp.steps_done):
        metrics = analysis(exp.state, exp.key)   # before the step, with the state it updates

A program of its own, compiled on its first use, never part of the train step (which is the same
program with the analysis on or off): it repeats the step's rollout (the state's own step
counter and the run's key, `step.step_keys`: the trajectories the step rolls out, up to float
rounding between two programs) and its `prepare` (filter, old log-probs, advantages), then,
without an optimiser step:
- buckets: the kept groups by their reward std (the filter's in-group std of the summed
  rewards): "quantile" sorts them by ascending std into min(num_buckets, kept groups) buckets
  of equal size, the remainder in the last (bucket_1 the lowest); "fixed_rv" puts std in
  [0, 1), [1, 2), ..., [4, 5), [5, inf) into bucket_1..bucket_6; and "all", every kept row;
- per bucket, the gradient of each loss component over the bucket's rows, the loss aggregated
  over them as the update aggregates a mini-batch (loss.agg): "task" the clipped policy loss,
  "entropy" -entropy_coef x the entropy (when entropy_coef != 0), "kl" kl_coef x the KL term
  (when kl_coef > 0); its global norm (the trained parameters: LoRA's adapters), before any
  clipping. The rows run in the update's row slices (mini-batches x micro-batches), one
  component after the other (a forward and a backward each, one gradient held at a time).
Metrics (the original's names): grad_norm/<bucket>/{task,entropy,kl}, .../per_sample/<c> (over
the bucket's rows), .../per_token/<c> (over its reply tokens), .../loss/{policy,entropy,kl,
total}, .../sample_count, .../sample_pct, .../reward_std_{mean,min,max}, .../group_rv_count;
the "all" bucket's also as actor/grad_norm/<c> and actor/loss/<...>; a bucket with no row logs
nothing. Differences from the original: it cuts each bucket into ppo_mini_batch_size rows and
averages the mini-batches' norms (at its micro-batch size 1, each row's token mean over the
mini-batch size: a bucket smaller than a mini-batch has its norm scaled down by that share);
here a bucket is one batch. Its std is that of the scores it trains on (normalised, penalties
in); here the filter's (env rewards, as the filter ranks them).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from starpo_jax.algo.losses import aggregate, aggregate_normaliser, kl_penalty, policy_loss
from starpo_jax.config import BUCKET_MODES, GradientAnalysisConfig, TrainConfig
from starpo_jax.models.lora import joined, policy_structure, trainable_split
from starpo_jax.models.sharding import gather_for_compute, split_rows
from starpo_jax.train.batch import Batch
from starpo_jax.train.learner import Forwards
from starpo_jax.train.shared_prefix import aligned_slots, plan_for
from starpo_jax.train.step import make_train_fns, shared_width, step_keys
from starpo_jax.train.state import TrainState

FIXED_RV_BUCKETS = 6  # [0, 1), ..., [4, 5), [5, inf)
ALL = "all"


def bucket_count(config: GradientAnalysisConfig) -> int:
    """The static number of std buckets (besides "all")."""
    return FIXED_RV_BUCKETS if config.bucket_mode == "fixed_rv" else config.num_buckets


def group_buckets(std: jax.Array, kept: jax.Array, num_buckets: int, mode: str) -> jax.Array:
    """The 0-based bucket of each group: std, kept [K] -> [K] int32, -1 for a group not kept
    (the module docstring's rules; ties in std in group order)."""
    if mode not in BUCKET_MODES:
        raise ValueError(f"unknown bucket mode {mode!r}; valid: {BUCKET_MODES}")
    std = jnp.asarray(std, jnp.float32)
    if mode == "fixed_rv":
        bucket = jnp.clip(jnp.floor(std), 0, FIXED_RV_BUCKETS - 1).astype(jnp.int32)
    else:
        count = kept.sum().astype(jnp.int32)
        buckets = jnp.maximum(jnp.minimum(num_buckets, count), 1)
        order = jnp.argsort(jnp.where(kept, std, jnp.inf), stable=True)
        rank = jnp.zeros(std.shape, jnp.int32).at[order].set(jnp.arange(std.shape[0],
                                                                        dtype=jnp.int32))
        bucket = jnp.minimum(rank // jnp.maximum(count // buckets, 1), buckets - 1)
    return jnp.where(kept, bucket, -1)


def components(config: TrainConfig) -> tuple[str, ...]:
    """The loss components analysed: the original's (entropy when its coefficient is not 0, kl
    when the KL term is on)."""
    return (("task",) + (("entropy",) if config.loss.entropy_coef != 0 else ())
            + (("kl",) if config.loss.kl_coef > 0 else ()))


def component_loss(name: str, logp: jax.Array, entropy: jax.Array, piece: dict[str, Any],
                   config: TrainConfig, normaliser: jax.Array) -> jax.Array:
    """One component's loss over a slice's masked tokens (its share of the bucket's)."""
    loss, mask = config.loss, piece["mask"]
    if name == "task":
        old = piece["old_logp"] if "old_logp" in piece else jax.lax.stop_gradient(logp)
        return policy_loss(logp, old, piece["advantages"], mask, loss.clip_low, loss.clip_high,
                           loss.dual_clip, loss.agg, normaliser)[0]
    if name == "entropy":
        return -loss.entropy_coef * aggregate(entropy, mask, loss.agg, normaliser)
    return loss.kl_coef * aggregate(kl_penalty(logp, piece["ref_logp"], loss.kl_kind), mask,
                                    loss.agg, normaliser)


def bucket_gradients(config: TrainConfig, analysis: GradientAnalysisConfig, forwards: Forwards,
                     plan: Any, trainable: Any, frozen: Any, batch: Batch,
                     mesh: jax.sharding.Mesh | None = None) -> dict[str, jax.Array]:
    """The per-bucket arrays [1 + buckets] ("all" first) of a prepared Batch: "norm/<c>" and
    "loss/<c>" of each component, "rows", "tokens", "groups", "std_mean", "std_min",
    "std_max"."""
    group, selection = config.rollout.group_size, batch.selection
    rows = batch.advantages.shape[0]
    trajectories = selection.indices.shape[0] * group
    std = selection.group_std[selection.indices]
    bucket = group_buckets(std, selection.kept, analysis.num_buckets, analysis.bucket_mode)
    row_bucket = bucket[(jnp.arange(rows) % trajectories) // group]  # turn samples: turn-major
    pieces = config.minibatches * config.optim.micro_batches
    names = components(config)
    tree = {"rollout": batch.rollout, "advantages": batch.advantages,
            "groups": jnp.arange(rows, dtype=jnp.int32) // group}
    tree.update({k: v for k, v in (("old_logp", batch.old_logp), ("ref_logp", batch.ref_logp))
                 if v is not None})

    def gradients(mask: jax.Array) -> tuple[jax.Array, jax.Array]:
        normaliser = aggregate_normaliser(mask, config.loss.agg, forwards.slots)
        pieces_of = split_rows({**tree, "mask": mask}, pieces, mesh)
        norms, losses = [], []
        # One component at a time (as the original's backward passes): one gradient held.
        for name in names:
            def add_slice(total, piece, name=name):
                def loss(params):
                    logp, entropy = forwards.logprobs(joined(params, frozen), piece["rollout"],
                                                      piece["groups"], plan)
                    return component_loss(name, logp, entropy, piece, config, normaliser)
                value, grads = jax.value_and_grad(loss)(trainable)
                return (jax.tree.map(jnp.add, total[0], grads), total[1] + value), None

            start = (jax.tree.map(jnp.zeros_like, trainable), jnp.float32(0.0))
            (grads, value), _ = jax.lax.scan(add_slice, start, pieces_of)
            norms.append(optax.tree.norm(grads))
            losses.append(value)
        return jnp.stack(norms), jnp.stack(losses)

    def one(index: jax.Array) -> dict[str, jax.Array]:
        in_bucket = (index < 0) | (row_bucket == index)
        mask = batch.rollout.loss_mask & in_bucket[:, None]
        groups = selection.kept & ((index < 0) | (bucket == index))
        norms, losses = jax.lax.cond(mask.any(), gradients, lambda _: (
            jnp.zeros(len(names), jnp.float32),) * 2, mask)
        count = jnp.maximum(groups.sum(), 1)
        out = {"rows": mask.any(1).sum(), "tokens": mask.sum(), "groups": groups.sum(),
               "std_mean": jnp.sum(jnp.where(groups, std, 0.0)) / count,
               "std_min": jnp.min(jnp.where(groups, std, jnp.inf)),
               "std_max": jnp.max(jnp.where(groups, std, -jnp.inf))}
        out.update({f"norm/{n}": norms[i] for i, n in enumerate(names)})
        out.update({f"loss/{n}": losses[i] for i, n in enumerate(names)})
        return out

    indices = jnp.arange(-1, bucket_count(analysis), dtype=jnp.int32)
    return jax.lax.map(one, indices)


def host_metrics(raw: dict[str, Any], names: tuple[str, ...]) -> dict[str, float]:
    """bucket_gradients' arrays (on the host) -> the original's metric names (module
    docstring); buckets without a row log nothing."""
    raw = {k: np.asarray(v, np.float64) for k, v in raw.items()}
    total = raw["rows"][0]
    out = {"grad_analysis/uses_training_batch": 1.0}
    loss_names = {"task": "policy", "entropy": "entropy", "kl": "kl"}
    for i in range(raw["rows"].shape[0]):
        rows, tokens = raw["rows"][i], raw["tokens"][i]
        if rows == 0:
            continue
        prefix = f"grad_norm/{ALL if i == 0 else f'bucket_{i}'}"
        out.update({f"{prefix}/sample_count": rows, f"{prefix}/sample_pct": rows / total,
                    f"{prefix}/reward_std_mean": raw["std_mean"][i],
                    f"{prefix}/reward_std_min": raw["std_min"][i],
                    f"{prefix}/reward_std_max": raw["std_max"][i],
                    f"{prefix}/group_rv_count": raw["groups"][i]})
        losses = {loss_names[n]: raw[f"loss/{n}"][i] for n in names}
        losses["total"] = sum(losses.values())
        for name in names:
            norm = raw[f"norm/{name}"][i]
            out.update({f"{prefix}/{name}": norm, f"{prefix}/per_sample/{name}": norm / rows,
                        f"{prefix}/per_token/{name}": norm / max(tokens, 1.0)})
            if i == 0:
                out[f"actor/grad_norm/{name}"] = norm
        for name, value in losses.items():
            out[f"{prefix}/loss/{name}"] = value
            if i == 0:
                out[f"actor/loss/{name}"] = value
    return {k: float(v) for k, v in out.items()}


def make_gradient_analysis(config: TrainConfig, analysis: GradientAnalysisConfig, env: Any,
                           codec: Any, *, model: Any, eos_id: int, pad_id: int,
                           mesh: jax.sharding.Mesh | None = None,
                           ) -> Callable[[TrainState, jax.Array], dict[str, jax.Array]]:
    """The jitted analyse(state, key) -> bucket_gradients' arrays of the step `state` is about
    to take with the run's `key`."""
    fns = make_train_fns(config, env, codec, model=model, eos_id=eos_id, pad_id=pad_id,
                         mesh=mesh)
    policy = policy_structure(model, config.lora)
    forwards = Forwards.of(config, policy, lambda p: gather_for_compute(p, policy, mesh), mesh)
    rows = config.kept_rows
    per = rows // (config.minibatches * config.optim.micro_batches)
    plan = plan_for(shared_width(config, codec, mesh), per,
                    aligned_slots(rows, per, config.rollout.group_size))

    def analyse(state: TrainState, key: jax.Array) -> dict[str, jax.Array]:
        rollout_key, _ = step_keys(key, state.step)
        batch = fns.prepare(state, fns.rollout(state, rollout_key))
        trainable, frozen = trainable_split(state.actor, config.lora.rank > 0)
        return bucket_gradients(config, analysis, forwards, plan, trainable, frozen, batch,
                                mesh)

    return jax.jit(analyse)


@dataclasses.dataclass
class GradientAnalysis:
    """The analysis of one run: `due(steps_done)` (the original's (global_steps - 1) % every
    == 0, its global_steps being the step about to run) and `__call__(state, key)` -> metrics."""

    config: GradientAnalysisConfig
    train: TrainConfig
    analyse: Callable[[TrainState, jax.Array], dict[str, jax.Array]]

    @classmethod
    def of(cls, exp: Any) -> GradientAnalysis:
        """The analysis of an api.Experiment (a JAX env's) with its current TrainConfig."""
        config = GradientAnalysisConfig(**exp.config.gradient_analysis.to_dict())
        analyse = make_gradient_analysis(exp.train, config, exp.env, exp.codec, model=exp.model,
                                         eos_id=exp.tokenizer.eos_token_id,
                                         pad_id=exp.tokenizer.pad_token_id, mesh=exp.mesh)
        return cls(config, exp.train, analyse)

    def due(self, steps_done: int) -> bool:
        return self.config.every > 0 and steps_done % self.config.every == 0

    def __call__(self, state: TrainState, key: jax.Array) -> dict[str, float]:
        raw = jax.device_get(self.analyse(state, key))
        return host_metrics(raw, components(self.train))
