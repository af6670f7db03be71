"""Training on a host env: the host rollout, then the learner's compiled `learn` (prepare +
update; train/learner.py, built without an env or codec).

    config = experiment.config_for("rg_chain_sum", "grpo")  # the env's settings: its class's
    exp = experiment.build(config)          # for a name in envs_host: an Experiment whose step is
    exp.step()                       # host_rollout + jit(learn), same keys as the JAX step

The step is the compiled step's composition (`train.step.rollout_and_learn`) of the host
rollout, behind the same interface (state, key) -> Rollout: its key schedule (`step_keys`:
fold_in(key, state.step) split into the rollout's and the update's keys) is the JAX step's, so
a resumed run repeats a run never stopped. Host envs run on one device (no mesh), with one
rollout chunk and without the phase clock.

Evaluation (`HostEvaluator`, the interface of evaluation.Evaluator): `episodes` held-out seeds
drawn once from the run's evaluation stream (evaluation.heldout_keys), greedy and sampled modes
with the same rollout as training, each (env, mode) on its own env pool.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import envs_host
from envs_host.pool import EnvPool, PoolConfig
from starpo_jax.config import RolloutConfig, TrainConfig
from starpo_jax.run.evaluation import (EvalConfig, EvaluatorBase, eval_metrics, eval_rollout_config,
                                   heldout_keys)
from starpo_jax.rollout.host import host_rollout
from starpo_jax.run.schema import env_kwargs, make_env
from starpo_jax.rollout.jax_env import Rollout
from starpo_jax.rollout.host_text import HostText, build_host_text
from starpo_jax.models.decoder import Decoder
from starpo_jax.models.lora import policy_structure
from starpo_jax.train.learner import make_learner
from starpo_jax.train.metrics import Metrics
from starpo_jax.train.state import TrainState
from starpo_jax.train.step import rollout_and_learn


class HostTrainStep:
    """step(state, key) -> (state, metrics) for a host env (see the module docstring). Owns
    the env pool (instances from `factory`, default the registered name's): `close()` it."""

    def __init__(self, config: TrainConfig, name: str, pool_config: PoolConfig, text: HostText,
                 *, model: Decoder, eos_id: int, pad_id: int,
                 factory: Callable[[], Any] | None = None):
        if config.rollout.chunks != 1:
            raise ValueError(f"rollout.chunks = {config.rollout.chunks} is invalid for host env "
                             f"{name!r}; valid: 1 (host rollouts are not chunked)")
        self.config, self.text, self.eos_id, self.pad_id = config, text, eos_id, pad_id
        self.graphdef = nnx.graphdef(policy_structure(model, config.lora))
        self.pool = EnvPool(name, factory or envs_host.factory(name),
                            config.rollout.batch_size, pool_config)
        # Rows run whole (no static first-prompt width to share) and no collapse metrics.
        learn = jax.jit(make_learner(config, model=model).learn, donate_argnums=0)
        self._step = rollout_and_learn(self.rollout, learn)
        self._stats: dict[str, float] = {}

    def rollout(self, state: TrainState, key: jax.Array) -> Rollout:
        """The host rollout behind the JAX rollout's interface (state, key) -> Rollout; its
        host-side statistics and time are kept for this step's metrics."""
        start = time.perf_counter()
        out, stats = host_rollout(self.graphdef, state.actor, self.pool, self.text,
                                  self.config.rollout, key, eos_id=self.eos_id,
                                  pad_id=self.pad_id)
        stats["timing/host_rollout_seconds"] = time.perf_counter() - start
        self._stats = stats
        return out

    def __call__(self, state: TrainState, key: jax.Array) -> tuple[TrainState, Metrics]:
        state, metrics = self._step(state, key)
        return state, {**metrics, **{k: jnp.float32(v) for k, v in self._stats.items()}}

    def close(self) -> None:
        self.pool.close()


class HostEvaluator(EvaluatorBase):
    """evaluation.Evaluator for host envs (see the module docstring). envs maps each name of
    config.envs to (factory, HostText); pools are built at their first evaluation: `close()`."""

    def __init__(self, graphdef: nnx.GraphDef, tokenizer: Any,
                 envs: Mapping[str, tuple[Callable[[], Any], HostText]],
                 rollout_config: RolloutConfig, config: EvalConfig, run_key: jax.Array,
                 pool_config: PoolConfig, *, eos_id: int, pad_id: int):
        missing = [name for name in config.envs if name not in envs]
        if missing:
            raise ValueError(f"no (factory, text) given for eval envs {missing}; given: "
                             f"{sorted(envs)}")
        self.config, self.tokenizer, self.graphdef = config, tokenizer, graphdef
        self.eos_id, self.pad_id, self.pool_config = eos_id, pad_id, pool_config
        self.envs = dict(envs)
        reset_key, self.sample_key = heldout_keys(run_key)
        self.seeds = np.asarray(jax.random.randint(reset_key, (config.episodes,), 0,
                                                   np.iinfo(np.int32).max))
        self.settings = {m: eval_rollout_config(rollout_config, config, m) for m in config.modes}
        self.group_sizes = {m: s.group_size for m, s in self.settings.items()}
        self._pools: dict[tuple[str, str], EnvPool] = {}

    def _run(self, name, mode, params, sample_key, states=None):  # always every held-out state
        factory, text = self.envs[name]
        settings = self.settings[mode]
        pool = self._pools.get((name, mode))
        if pool is None:
            pool = self._pools[name, mode] = EnvPool(name, factory, settings.batch_size,
                                                     self.pool_config)
        out, _ = host_rollout(self.graphdef, params, pool, text, settings, sample_key,
                              eos_id=self.eos_id, pad_id=self.pad_id, seeds=self.seeds,
                              greedy=mode == "greedy")
        return eval_metrics(out, settings.group_size), out

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


def build_evaluator(exp: Any, config: EvalConfig, key: jax.Array) -> HostEvaluator:
    """The HostEvaluator of a host-env Experiment (experiment.build_evaluator's host branch), its
    held-out states drawn from run key `key`."""
    envs = {}
    for name in config.envs:
        text = exp.codec if name == exp.config.env.name else _text(
            exp.config, exp.train, exp.tokenizer, envs_host.make(name))
        own = env_kwargs(exp.config) if name == exp.config.env.name else {}
        envs[name] = (envs_host.factory(name, **own), text)
    return HostEvaluator(nnx.graphdef(exp.model), exp.tokenizer, envs, exp.train.rollout, config,
                         key, PoolConfig(**exp.config.host.to_dict()),
                         eos_id=exp.tokenizer.eos_token_id, pad_id=exp.tokenizer.pad_token_id)


def _text(full: Any, train: TrainConfig, tokenizer: Any, env: Any) -> HostText:
    template = {k: v for k, v in full.prompt.items() if k != "verify" and v is not None}
    return build_host_text(tokenizer, env, train.rollout, **template)


def build_step(full: Any, train: TrainConfig, model: Decoder, tokenizer: Any,
               ) -> tuple[Any, HostText, HostTrainStep]:
    """The host-env parts of experiment.build's Experiment: (env, its text layer, the
    HostTrainStep), for `full` the checked experiment config, `train` its TrainConfig and
    `model` the policy after experiment.build's prelude (weights, model.init_from, LoRA)."""
    env = make_env(full)
    text = _text(full, train, tokenizer, env)
    step = HostTrainStep(train, full.env.name, PoolConfig(**full.host.to_dict()), text,
                         model=model, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                         factory=envs_host.factory(full.env.name, **env_kwargs(full)))
    return env, text, step
