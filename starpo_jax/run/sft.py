"""The SFT warm start: supervised steps on demonstrations, before StarPO.

    config = sft.sft_config("sokoban", policy="random")   # default_config() + an `sft` section
    exp = sft.build(config)             # an experiment.Experiment whose step() is one SFT step
    metrics = exp.step()                # {"sft/loss": ..., ...}
    result = exp.evaluator().evaluate(exp.state.actor)   # held-out success, valid replies, loss

Each step trains on rollout.groups x rollout.group_size rows: demonstrations made inside the
step by the policy `sft.policy` (starpo_jax.rollout.demonstrations, starpo_jax.rollout.policies;
fresh initial states every step, from fold_in(key, step)), or, with `sft.data` = a JSONL file of
`{"messages": [...]}` chat transcripts, rows drawn from its training part. The loss is the
token-mean cross-entropy of the reply tokens (the loss mask), through the train step's forward
(train.learner.make_learner(...).sft: shared first prompt, optim.micro_batches, LoRA adapters or
every weight, optim.actor_lr with AdamW). Evaluations (eval_every) report the Evaluator's
held-out success and valid-reply rate (`action_is_valid`) and `val/sft/heldout/loss`: the loss
on held-out demonstrations (the evaluator's held-out initial states) or on the file's last
`sft.heldout` fraction. A host env (envs_host) trains on `sft.data` only, e.g. transcripts of
demonstrations.host_demonstrate (a policy of the observation text), and is evaluated on its
host rollouts. experiments/sft.py runs it with run.py's loop: metrics.jsonl,
TensorBoard, checkpoints, --resume, the same faults.

A StarPO run starts from the result with `model.init_from = <the SFT workdir>`
(`checkpoint.load_init_weights`): the newest checkpoint's policy, LoRA adapters merged into the
weights, for JAX and host envs alike.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx
from ml_collections import config_dict

import envs_host
import envs_jax
from starpo_jax.checks import is_int, is_number, require_valid
from starpo_jax.run import experiment
from starpo_jax.rollout.demonstrations import (TokenizedRows, build_reply_encoder, demonstrate,
                                               read_jsonl, tokenize_conversations, transcripts,
                                               write_jsonl)
from starpo_jax.rollout.world_model import build_world_model_encoder, longest_reply
from starpo_jax.run.evaluation import EvalResult, heldout_keys
from starpo_jax.rollout.host import host_buffer_length
from starpo_jax.rollout.host_text import HostText
from starpo_jax.rollout.policies import POLICY_NAMES, Policy, make_policy
from starpo_jax.rollout.jax_env import buffer_length
from starpo_jax.train.learner import Learner, make_learner
from starpo_jax.train.state import TrainState
from starpo_jax.train.step import shared_width

ConfigDict = config_dict.ConfigDict
# The key stream of sft.write_demos' demonstrations: neither a step's (fold_in(key, step)) nor
# the held-out evaluation's (evaluation.EVAL_STREAM = 2**31 - 1).
DEMO_STREAM = 2**31 - 2
#: What sft.py's config has beyond a StarPO run's (experiment.default_config).
SFT_DEFAULTS = {"policy": "random", "solver_share": 0.5, "data": "", "heldout": 0.1,
                "write_demos": 0, "reply_format": "answer"}
#: sft.reply_format: "answer" the answer alone (think mode: a fixed sentence before it);
#: "world_model" SPA's replies (rollout/world_model.py: the state's coordinates, the plan, the
#: state it leads to, then the answer).
REPLY_FORMATS = ("answer", "world_model")


def sft_default_config() -> ConfigDict:
    """api.default_config() plus the `sft` section:
    sft.policy: the demonstrations' policy (policies.POLICY_NAMES), when sft.data is "";
    sft.solver_share: the chance of a solver turn under policy "mix" (else a random turn);
    sft.data: a JSONL file of {"messages": [...]} transcripts to train on instead ("" = none);
    sft.heldout: the fraction of sft.data's conversations held out for val/sft/heldout/loss
    (its last ones); sft.write_demos: demonstrations written to <workdir>/demos.jsonl at the
    start; sft.reply_format: the demonstrations' replies (REPLY_FORMATS: "world_model" is
    SPA's world-model warm start, with the policy's actions as its behaviour; it turns on
    rollout.world_model, whose probe scores the evaluations' replies)."""
    c = experiment.default_config()
    c.sft = ConfigDict(dict(SFT_DEFAULTS))
    return c


#: Keys split_config sets itself whatever the config says (one update on every row): two
#: configs that differ only there train alike, and a workdir's config.json may hold either form
#: (the given one, before 99ceac1, or the effective one).
FORCED_KEYS = ("filter.strategy", "filter.keep_ratio", "optim.minibatch_rows",
               "rollout.world_model")


def resume_rules(config: ConfigDict | dict, resumable: tuple[str, ...]) -> dict[str, Any]:
    """workdir.check_config's `resumable` and `defaults` for a run of `config`: an SFT run (a
    config with an `sft` section) may also differ in FORCED_KEYS and is checked against
    sft_default_config() (a workdir written before a key of its section existed resumes while
    the key keeps its default); a StarPO run against experiment.default_config()."""
    if "sft" not in config:
        return {"resumable": resumable, "defaults": experiment.default_config().to_dict()}
    return {"resumable": resumable + FORCED_KEYS, "defaults": sft_default_config().to_dict()}


def sft_config(env: str, policy: str = "random", **rollout: Any) -> ConfigDict:
    """sft_default_config() for `env`, demonstrations by `policy`, rollout keys updated."""
    c = sft_default_config()
    c.algo = "grpo"  # no critic: SFT trains the policy alone
    c.env.name = env
    c.sft.policy = policy
    c.rollout.update(rollout)
    return c


def split_config(config: ConfigDict) -> tuple[ConfigDict, ConfigDict]:
    """(the run's config without `sft`, the checked sft section). Raises ValueError naming a
    bad key or value."""
    values = config.to_dict() if isinstance(config, ConfigDict) else dict(config)
    section = dict(SFT_DEFAULTS)
    given = values.pop("sft", {}) or {}
    unknown = sorted(set(given) - set(SFT_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown config key 'sft.{unknown[0]}'; valid keys in 'sft': "
                         f"{sorted(SFT_DEFAULTS)}")
    section.update(given)
    require_valid("sft.policy", section["policy"], section["policy"] in POLICY_NAMES,
                  f"one of {POLICY_NAMES}")
    share = section["solver_share"]
    require_valid("sft.solver_share", share, is_number(share) and 0 <= share <= 1,
                  "a number in [0, 1]")
    data = section["data"]
    require_valid("sft.data", data, isinstance(data, str) and (not data or Path(
        data).is_file()), "'' (demonstrations) or the path of a JSONL file")
    require_valid("sft.reply_format", section["reply_format"],
                  section["reply_format"] in REPLY_FORMATS, f"one of {REPLY_FORMATS}")
    h = section["heldout"]
    require_valid("sft.heldout", h, is_number(h) and 0 <= h < 1, "a number in [0, 1)")
    w = section["write_demos"]
    require_valid("sft.write_demos", w, is_int(w, 0), "an int >= 0")
    run = experiment.merged_config(values)
    # SFT trains on every row in one update (no filter, no mini-batches): what the checks of
    # optim.micro_batches count is all the rows, not a StarPO run's kept ones.
    run.filter.update(strategy="top_k", keep_ratio=1.0)
    run.optim.minibatch_rows = run.rollout.groups * run.rollout.group_size
    if section["reply_format"] == "world_model":
        if run.nothink:
            raise ValueError("sft.reply_format = 'world_model' writes its blocks in the think "
                             "block; config.nothink = True; valid: False")
        run.rollout.world_model = True  # evaluations score the replies' blocks
    experiment.train_config(run)
    if envs_host.known(run.env.name) and (not data or w):
        raise ValueError(f"config.env.name = {run.env.name!r} is a host env; valid for SFT: "
                         f"a JAX env, one of {envs_jax.names()}, or a host env with sft.data (a"
                         " JSONL file of its transcripts, demonstrations.host_demonstrate) and "
                         "sft.write_demos = 0")
    return run, ConfigDict(section)


@dataclasses.dataclass
class SftEvaluator:
    """The run's Evaluator plus the loss on held-out rows (val/sft/heldout/loss) at full
    evaluations; run.py's loop reads it as an Evaluator."""

    inner: Any
    loss: Callable[[nnx.State], jax.Array] | None  # None: no held-out rows

    @property
    def config(self):
        return self.inner.config

    def evaluate(self, params: nnx.State, sample_key: jax.Array | None = None,
                 envs: tuple[str, ...] | None = None, states: int | None = None) -> EvalResult:
        result = self.inner.evaluate(params, sample_key, envs, states)
        if envs is None and states is None and self.loss is not None:
            result.metrics["val/sft/heldout/loss"] = float(self.loss(params))
        return result

    def samples_text(self, result: EvalResult) -> str:
        return self.inner.samples_text(result)


@dataclasses.dataclass
class SftExperiment(experiment.Experiment):
    """An experiment.Experiment whose step is one SFT step (see the module docstring)."""

    sft: ConfigDict = None
    policy: Policy | None = None
    data: TokenizedRows | None = None  # sft.data's training rows
    heldout: TokenizedRows | None = None  # sft.data's held-out rows
    encoder: Any = None

    def use(self, train) -> None:
        """Steps with `train` (memory knobs), compiling its SFT step once."""
        if train not in self._steps:
            self._steps[train] = None, _sft_step(self, train)
        self.train = train
        self.progress, self.train_step = self._steps[train]

    def demos(self, key: jax.Array, rollout=None, reset_key: jax.Array | None = None):
        """Demonstrations of the policy: a Rollout of rollout.groups x group_size rows (the
        run's rollout settings unless `rollout`)."""
        return demonstrate(self.env, self.codec, rollout or self.train.rollout, self.policy,
                           self.encoder, key, eos_id=self.tokenizer.eos_token_id,
                           pad_id=self.tokenizer.pad_token_id, reset_key=reset_key)

    def heldout_rows(self):
        """The rows of val/sft/heldout/loss: sft.data's held-out part (None when sft.heldout is
        0), or demonstrations on the evaluator's held-out initial states (eval.episodes, one row
        each)."""
        if self.data is not None:
            return self.heldout
        # The evaluator's states: those of eval.seed's run (experiment.eval_run_key).
        reset_key, sample_key = heldout_keys(experiment.eval_run_key(self, self.config.eval))
        shape = dataclasses.replace(self.train.rollout, groups=self.config.eval.episodes,
                                    group_size=1, chunks=1)
        return jax.jit(lambda k, r: self.demos(k, shape, r))(sample_key, reset_key)

    def evaluator(self) -> SftEvaluator:
        rows = self.heldout_rows()
        run_config = experiment.merged_config(
            {k: v for k, v in self.config.to_dict().items() if k != "sft"})
        inner = experiment.build_evaluator(dataclasses.replace(self, config=run_config))
        if rows is None:
            return SftEvaluator(inner, None)
        fns = _fns(self, self.train)
        loss = jax.jit(lambda params, rows: fns.sft_loss(params, rows)["loss"])
        return SftEvaluator(inner, lambda params: loss(params, rows))

    def write_demos(self, path: Path, count: int) -> int:
        """Writes `count` demonstrations (fresh initial states) as JSONL; returns the count."""
        shape = dataclasses.replace(self.train.rollout, groups=count, group_size=1, chunks=1)
        out = jax.jit(lambda k: self.demos(k, shape))(jax.random.fold_in(self.key, DEMO_STREAM))
        return write_jsonl(path, transcripts(out, self.tokenizer, self.codec))


def _fns(exp: SftExperiment, train) -> Learner:
    """The learner of `exp` under `train` (its sft and sft_loss)."""
    host = isinstance(exp.codec, HostText)  # no compiled rollout, no static prompt width
    return make_learner(train, model=exp.model, mesh=exp.mesh,
                        prompt_width=None if host else shared_width(train, exp.codec, exp.mesh))


def _sft_step(exp: SftExperiment, train) -> Callable:
    """The jitted SFT step(state, key) -> (state, metrics) of `exp` under `train`."""
    fns = _fns(exp, train)
    rows_per_step = train.rollout.groups * train.rollout.group_size
    if exp.data is None:
        def step(state: TrainState, key: jax.Array):
            out = exp.demos(jax.random.fold_in(key, state.step), train.rollout)
            state, metrics = fns.sft(state, out, shared=True)
            metrics["sft/demo_success"] = out.success.mean().astype(jnp.float32)
            return state, metrics

        return jax.jit(step, donate_argnums=0)

    def from_data(state: TrainState, key: jax.Array, data: TokenizedRows):
        count = data.tokens.shape[0]
        pick = jax.random.choice(jax.random.fold_in(key, state.step), count, (rows_per_step,),
                                 replace=count < rows_per_step)
        return fns.sft(state, jax.tree.map(lambda x: x[pick], data))

    jitted = jax.jit(from_data, donate_argnums=0)
    return lambda state, key: jitted(state, key, exp.data)


def build(config: ConfigDict) -> SftExperiment:
    """Checks `config` (sft_default_config()'s keys), then loads the model and builds the SFT
    experiment: env, codec, policy or the tokenised sft.data, state, step (compiled at its
    first call). Raises ValueError naming a bad key, value, policy or file line."""
    run, section = split_config(config)
    base = experiment.build(run)
    if hasattr(base.train_step, "close"):  # a host env's RL step: its env pool is not used
        base.train_step.close()
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(experiment.Experiment)}
    fields.update(config=_joined(run, section), train_step=None, _steps={})
    exp = SftExperiment(**fields, sft=section)
    r = exp.train.rollout
    if section.data:
        conversations = read_jsonl(section.data)
        count = len(conversations)
        held = min(max(round(count * section.heldout), 1), count - 1) if section.heldout else 0
        length = (host_buffer_length(exp.codec, r) if isinstance(exp.codec, HostText)
                  else buffer_length(exp.codec, r))
        rows = tokenize_conversations(
            exp.tokenizer, conversations, length=length,
            pad_id=exp.tokenizer.pad_token_id, skip_prefix=exp.codec.template.forced_prefix,
            max_reply_tokens=r.max_turns * r.reply_tokens)
        exp.data = jax.tree.map(lambda x: x[: count - held], rows)
        exp.heldout = jax.tree.map(lambda x: x[count - held:], rows) if held else None
    else:
        exp.policy = make_policy(section.policy, exp.env,
                                 max_actions_per_turn=r.max_actions_per_turn,
                                 max_turns=r.max_turns, max_actions_per_traj=r.max_actions_per_traj,
                                 solver_share=float(section.solver_share))
        build = (build_world_model_encoder if section.reply_format == "world_model"
                 else build_reply_encoder)
        exp.encoder = build(exp.tokenizer, exp.env, exp.codec,
                            max_actions_per_turn=r.max_actions_per_turn)
        if section.reply_format == "world_model":
            longest = longest_reply(exp.env, exp.encoder, r.max_actions_per_turn)
            if longest > r.reply_tokens:
                raise ValueError(f"world-model replies of {exp.env!r} take up to {longest} "
                                 f"tokens; config.rollout.reply_tokens = {r.reply_tokens} is "
                                 f"too small: valid: >= {longest}")
    exp.use(exp.train)
    return exp


def _joined(run: ConfigDict, section: ConfigDict) -> ConfigDict:
    full = run.copy_and_resolve_references()
    full.sft = section
    return full
