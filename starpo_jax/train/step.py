"""One StarPO / StarPO-S iteration on a JAX env: the rollout, then the learner, under one key
schedule; and their composition compiled as one program.

    fns = make_train_fns(config, env, codec, model=model, eos_id=tok.eos_token_id,
                         pad_id=tok.pad_token_id)
    out = fns.rollout(state, key)                 # P x N trajectories (rollout.Rollout)
    batch = fns.prepare(state, out)               # filter, old log-probs, values, advantages
    state, metrics = fns.update(state, batch, key)  # the PPO / GRPO mini-batch updates
    state, metrics = fns.learn(state, out, key)   # Online-k rounds of both, metrics, step + 1
    state, metrics = fns.sft(state, rows)         # one supervised step (starpo_jax.run.sft)
    step = make_train_step(config, env, codec, ...)  # jit of the whole iteration, one program
    state, metrics = step(state, key)             # the state is donated: use the returned one

In execution order: `rollout` (rollout/jax_env.py), then the learner's `prepare` and `update`
(train/learner.py), `learn` (their Online-k rounds and the metrics, train/metrics.py), and
`step` (`rollout_and_learn`: the key split by `step_keys`, then the rollout, then `learn`; the
host-env step, run/host_train.py, is the same function of its own rollout, so a resumed run
repeats a run never stopped either way). `prepare` and `update`
take any `Rollout`, however it was produced. The state and its initialisation are
train/state.py's.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax

from starpo_jax.config import TrainConfig
from starpo_jax.models.decoder import Decoder
from starpo_jax.models.lora import policy_structure
from starpo_jax.models.sampler_weights import sampler_graphdef, sampler_params
from starpo_jax.models.sharding import constrain_batch, gather_for_compute
from starpo_jax.phases import PhaseClock, mark
from starpo_jax.rollout.jax_env import Rollout, chunked_rollout, prompt_widths
from starpo_jax.text.codec import Codec
from starpo_jax.train.batch import Batch
from starpo_jax.train.collapse import first_turn
# filter_selection, filter_values, apply_if, init_train_state, SKIPPED_UPDATES: importable from
# here as before the split (tests and benches do).
from starpo_jax.train.learner import filter_selection, filter_values, make_learner
from starpo_jax.train.metrics import SKIPPED_UPDATES, Metrics, rollout_metrics
from starpo_jax.train.state import TrainState, apply_if, init_train_state

__all__ = ["SKIPPED_UPDATES", "Batch", "Metrics", "TrainFns", "TrainState", "apply_if",
           "filter_selection", "filter_values", "init_train_state", "make_train_fns",
           "make_train_step", "rollout_and_learn", "rollout_metrics", "shared_width", "step_keys"]


class TrainFns(NamedTuple):
    """The pure pieces of one iteration (not jitted: compose them, or `jax.jit` each)."""

    rollout: Callable[[TrainState, jax.Array], Rollout]
    prepare: Callable[..., Batch]  # (state, rollout, ref_logp=None) -> Batch
    update: Callable[[TrainState, Batch, jax.Array], tuple[TrainState, Metrics]]
    learn: Callable[[TrainState, Rollout, jax.Array], tuple[TrainState, Metrics]]
    step: Callable[[TrainState, jax.Array], tuple[TrainState, Metrics]]
    # Supervised steps on reply tokens (starpo_jax.run.sft): (state, rows, shared) -> ...
    sft: Callable[..., tuple[TrainState, Metrics]]
    sft_loss: Callable[..., Metrics]


def make_train_fns(config: TrainConfig, env: Any, codec: Codec | None, *, model: Decoder,
                   eos_id: int, pad_id: int, mesh: jax.sharding.Mesh | None = None,
                   phase_clock: PhaseClock | None = None) -> TrainFns:
    """rollout / prepare / update / learn and their composition `step` (see the module
    docstring).

    codec must be built for this env and tokenizer with config.rollout's mode,
    max_actions_per_turn, max_actions_per_traj and announced_tokens (as max_tokens); env and
    codec may be None where no rollout is made (the learner alone, e.g. for SFT). With `mesh`,
    batch axes are constrained to "fsdp". With `phase_clock`, the host is told as each phase
    ends (phases.py): "rollout_chunk" (index c, when rollout.chunks > 1), "rollout", then the
    learner's phases (make_learner).
    """
    policy = policy_structure(model, config.lora)
    # The rollout samples with the policy as one plain model (adapters merged), in
    # rollout.sampler_dtype (models/sampler_weights.py).
    sampler_dtype = config.rollout.sampler_dtype
    sampler_def = sampler_graphdef(policy, sampler_dtype)

    def rollout(state: TrainState, key: jax.Array) -> Rollout:
        params = sampler_params(gather_for_compute(state.actor, policy, mesh), policy.config,
                                sampler_dtype)
        out = chunked_rollout(sampler_def, params, env, codec, config.rollout, key,
                              eos_id=eos_id, pad_id=pad_id, clock=phase_clock, mesh=mesh)
        return mark(phase_clock, "rollout", constrain_batch(out, mesh, 0))

    learner = make_learner(
        config, model=policy, prompt_width=shared_width(config, codec, mesh),
        first_turn=None if codec is None else lambda out: first_turn(out, codec, config.rollout),
        mesh=mesh, phase_clock=phase_clock)

    return TrainFns(rollout=rollout, prepare=learner.prepare, update=learner.update,
                    learn=learner.learn, step=rollout_and_learn(rollout, learner.learn),
                    sft=learner.sft, sft_loss=learner.sft_loss)


def rollout_and_learn(rollout: Callable[[TrainState, jax.Array], Rollout],
                      learn: Callable[[TrainState, Rollout, jax.Array],
                                      tuple[TrainState, Metrics]],
                      ) -> Callable[[TrainState, jax.Array], tuple[TrainState, Metrics]]:
    """step(state, key) -> (state, metrics) of any rollout behind the interface
    (state, key) -> Rollout (a JAX env's compiled one, a host env's): the key split by
    `step_keys`, the rollout, then `learn` on it."""
    def step(state: TrainState, key: jax.Array) -> tuple[TrainState, Metrics]:
        rollout_key, update_key = step_keys(key, state.step)
        return learn(state, rollout(state, rollout_key), update_key)

    return step


def step_keys(key: jax.Array, step: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The key schedule of a training step, the compiled one's and the host-env one's: the run
    key folded with the step counter, split into (rollout key, update key). A resumed run
    repeats a run never stopped only while both steps split their keys by this function."""
    rollout_key, update_key = jax.random.split(jax.random.fold_in(key, step))
    return rollout_key, update_key


def shared_width(config: TrainConfig, codec: Codec | None,
                 mesh: jax.sharding.Mesh | None) -> int | None:
    """The width of the first prompt the update's forwards compute once per group, or None
    (every row whole): a host rollout (no codec) has no static first-prompt width, over a
    mesh the rows run whole (the packed shared-prefix forward is one row: it would not split),
    and turn samples (the limited context modes) share no first prompt."""
    if (config.optim.shared_prefix and codec is not None and mesh is None
            and not config.rollout.turn_samples):  # a turn sample's window is its own
        return prompt_widths(codec)[0]
    return None


def make_train_step(config: TrainConfig, env: Any, codec: Codec, *, model: Decoder, eos_id: int,
                    pad_id: int, mesh: jax.sharding.Mesh | None = None,
                    phase_clock: PhaseClock | None = None,
                    ) -> Callable[[TrainState, jax.Array], tuple[TrainState, Metrics]]:
    """The compiled step(train_state, key) -> (train_state, metrics): `make_train_fns(...).step`
    under one jax.jit (with `mesh`: the partition rules of `models/sharding.py`, batch over "fsdp",
    weights by logical axes). The state is donated."""
    step = make_train_fns(config, env, codec, model=model, eos_id=eos_id, pad_id=pad_id,
                          mesh=mesh, phase_clock=phase_clock).step
    if mesh is None:
        return jax.jit(step, donate_argnums=0)
    from starpo_jax.models.sharding import jit_sharded_step
    abstract = jax.eval_shape(lambda: init_train_state(config, jax.random.PRNGKey(0), model=model))
    return jit_sharded_step(step, abstract, policy_structure(model, config.lora), mesh)
