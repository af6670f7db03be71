"""Evaluation on held-out initial states: greedy and sampled rollouts, success and pass@k.

    evaluator = Evaluator(graphdef, tokenizer, {"bandit": (env, codec), ...}, train.rollout,
                          EvalConfig(envs=("bandit", "bandit_test")), run_key,
                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    result = evaluator.evaluate(train_state.actor)     # {"val/bandit/greedy/success": ..., ...}
    print(evaluator.samples_text(result))               # readable conversations

Held-out states: training draws the initial states of iteration t from fold_in(run_key, t)
(train/step.py); evaluation draws from fold_in(run_key, EVAL_STREAM), a value no step counter
reaches, split into one key for the initial states and one for sampling. Both are fixed for a run,
so
every evaluation of a run meets the same `episodes` initial states with the same sampling noise
(an evaluation is a deterministic function of the parameters; pass another `sample_key` to
resample). Every env and both modes share the initial-state keys: the comparisons are paired.

Modes: "greedy" (argmax, one rollout per initial state) and "sampled" (the eval temperature,
`pass_k` rollouts per initial state: pass@k is the fraction of initial states where any of the
k succeeds). Each (env, mode) is its own compiled program (the env and the batch shape are
static), compiled at its first call and reused by every later evaluation with the same env
object: on CPU every distinct env costs a rollout compile. The rollout settings are the
training ones (turns, token budgets, mode) with the batch shape and temperature swapped. Host
envs: host_train.HostEvaluator, on the same EvaluatorBase.

Metric names: val/<env>/<mode>/{success, reward, num_turns, num_actions, action_is_valid,
response_length}, val/<env>/<mode>/failure/<kind> for the six failure classes of
starpo_jax.algo.failures (fractions summing to 1; host envs report no dead ends or loops) and, in
sampled mode with pass_k > 1, val/<env>/sampled/pass@<k> (greedy
rollouts of one state are identical, so their pass@k would equal success).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# EvalConfig and the eval env defaults live with the other configs (no JAX there).
from starpo_jax.config import EVAL_MODES as MODES  # noqa: F401
from starpo_jax.config import (OOD_VARIANTS, EvalConfig, RolloutConfig,  # noqa: F401
                               default_eval_envs)
from starpo_jax.algo.failures import failure_fractions
from starpo_jax.rollout.jax_env import Rollout, rollout
from starpo_jax.run import announce
from starpo_jax.run.writers import human_duration

# fold_in(run_key, t) is training iteration t's key; no run takes 2**31 - 1 steps.
EVAL_STREAM = 2**31 - 1
REPLY_OPEN, REPLY_CLOSE = "«", "»"  # around the model's sampled tokens in a conversation


def eval_rollout_config(train: RolloutConfig, config: EvalConfig, mode: str) -> RolloutConfig:
    """The training rollout settings with the eval batch shape and temperature."""
    if mode == "greedy":
        return dataclasses.replace(train, groups=config.episodes, group_size=1)
    return dataclasses.replace(train, groups=config.episodes, group_size=config.pass_k,
                               temperature=config.temperature)


def heldout_keys(run_key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(initial-state key, sampling key) of a run's evaluations (see the module docstring)."""
    reset_key, sample_key = jax.random.split(jax.random.fold_in(run_key, EVAL_STREAM))
    return reset_key, sample_key


def pass_at_k(success: jax.Array, k: int) -> jax.Array:
    """Fraction of groups (k consecutive rows, one initial state) with any success.

    success [G * k] bool -> [] float32. k = 1 is the success rate.
    """
    return jnp.mean(jnp.any(success.reshape(-1, k), axis=1).astype(jnp.float32))


def eval_metrics(out: Rollout, k: int) -> dict[str, jax.Array]:
    """Per-mode metrics of a batch of G * k rollouts (names without the val/<env>/<mode>/ part).

    action_is_valid and response_length average over the turns taken; failure/<kind> is the
    fraction of rows in each failure class (starpo_jax.algo.failures; the six sum to 1).
    """
    taken = out.turn_taken
    turns = jnp.maximum(jnp.sum(taken), 1)
    metrics = {
        "success": jnp.mean(out.success.astype(jnp.float32)),
        "reward": jnp.mean(out.scores_without_penalty),
        "num_turns": jnp.mean(jnp.sum(taken, axis=1).astype(jnp.float32)),
        "num_actions": jnp.mean(out.num_actions.astype(jnp.float32)),
        "action_is_valid": jnp.sum(out.format_ok & taken) / turns,
        "response_length": jnp.sum(jnp.where(taken, out.reply_lengths, 0)) / turns,
    }
    if k > 1:
        metrics[f"pass@{k}"] = pass_at_k(out.success, k)
    metrics.update({f"failure/{kind}": value
                    for kind, value in failure_fractions(out.failure).items()})
    return {name: value.astype(jnp.float32) for name, value in metrics.items()}


@dataclasses.dataclass
class EvalResult:
    """metrics: {"val/<env>/<mode>/<name>": float}; rollouts: {(env, mode): Rollout}."""

    metrics: dict[str, float]
    rollouts: dict[tuple[str, str], Rollout]


class EvaluatorBase:
    """What every evaluator shares: `evaluate` runs each (env, mode) through `_run` and names
    the metrics; `samples_text` shows conversations. A subclass sets config (EvalConfig),
    tokenizer, sample_key and group_sizes ({mode: rollouts per initial state})."""

    config: EvalConfig
    tokenizer: Any
    sample_key: jax.Array
    group_sizes: dict[str, int]

    def _run(self, name: str, mode: str, params: nnx.State,
             sample_key: jax.Array) -> tuple[dict[str, jax.Array], Rollout]:
        """(eval_metrics of the rollouts, the rollouts) of env `name` in `mode`."""
        raise NotImplementedError

    def evaluate(self, params: nnx.State, sample_key: jax.Array | None = None,
                 envs: tuple[str, ...] | None = None) -> EvalResult:
        """Runs every mode on `envs` (default: all of config.envs) with the policy `params`."""
        sample_key = self.sample_key if sample_key is None else sample_key
        envs = self.config.envs if envs is None else envs
        unknown = [name for name in envs if name not in self.config.envs]
        if unknown:
            raise ValueError(f"envs {unknown} are not evaluated here; valid: {self.config.envs}")
        metrics, rollouts = {}, {}
        pairs = [(name, mode) for name in envs for mode in self.config.modes]
        start = time.perf_counter()
        with announce.phase(f"evaluating {self.config.episodes} held-out episodes", f" on "
                            f"{', '.join(envs)} ({', '.join(self.config.modes)})"):
            for k, (name, mode) in enumerate(pairs, 1):
                values, out = self._run(name, mode, params, sample_key)
                rollouts[name, mode] = out
                for metric, value in jax.device_get(values).items():
                    metrics[f"val/{name}/{mode}/{metric}"] = float(value)
                elapsed = time.perf_counter() - start
                if elapsed >= announce.SLOW_SECONDS and k < len(pairs):  # a long one: progress
                    announce.say(f"  evaluating: {name} {mode} done ({k}/{len(pairs)}) at "
                                 f"{human_duration(elapsed)}")
        return EvalResult(metrics=metrics, rollouts=rollouts)

    def samples_text(self, result: EvalResult) -> str:
        """The first config.samples initial states' conversations of every (env, mode) in
        `result` (one rollout per initial state)."""
        parts = []
        for (name, mode), out in result.rollouts.items():
            k = self.group_sizes[mode]
            shown = min(self.config.samples, out.success.shape[0] // k)
            parts.append(f"##### {name} / {mode}: {shown} of {out.success.shape[0] // k} "
                         "held-out initial states\n")
            parts += [format_conversation(self.tokenizer, out, g * k) for g in range(shown)]
        return "\n".join(parts)


class Evaluator(EvaluatorBase):
    """The compiled eval programs of one run, one per (env, mode); see the module docstring.

    envs maps each name of config.envs to (env, codec), the codec built for that env with the
    policy's tokenizer, the training mode, template and max_actions_per_turn.
    """

    def __init__(self, graphdef: nnx.GraphDef, tokenizer: Any, envs: Mapping[str, tuple[Any, Any]],
                 rollout_config: RolloutConfig, config: EvalConfig, run_key: jax.Array, *,
                 eos_id: int, pad_id: int):
        missing = [name for name in config.envs if name not in envs]
        if missing:
            raise ValueError(f"no (env, codec) given for eval envs {missing}; given: "
                             f"{sorted(envs)}")
        self.config = config
        self.tokenizer = tokenizer
        self.reset_key, self.sample_key = heldout_keys(run_key)
        self.group_sizes = {m: eval_rollout_config(rollout_config, config, m).group_size
                            for m in config.modes}
        self._programs: dict[tuple[str, str], Callable] = {}
        for name in config.envs:
            env, codec = envs[name]
            for mode in config.modes:
                settings = eval_rollout_config(rollout_config, config, mode)
                self._programs[name, mode] = functools.partial(
                    _program, graphdef, env, settings, mode == "greedy", eos_id, pad_id, codec)

    @property
    def reset_keys(self) -> jax.Array:
        """[episodes, 2] uint32: the keys env.reset draws the held-out initial states from."""
        return jax.random.split(self.reset_key, self.config.episodes)

    def _run(self, name, mode, params, sample_key):
        return self._programs[name, mode](params, self.reset_key, sample_key)


# Module-level with the env static and the codec an argument: an Evaluator built again for the
# same env object (e.g. by experiments/evaluate.py's tests, or a notebook) reuses the compiled
# program.
@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5))
def _program(graphdef, env, config: RolloutConfig, greedy: bool, eos_id: int, pad_id: int,
             codec, params, reset_key, sample_key) -> tuple[dict[str, jax.Array], Rollout]:
    out = rollout(graphdef, params, env, codec, config, sample_key, eos_id=eos_id, pad_id=pad_id,
                  greedy=greedy, reset_key=reset_key)
    return eval_metrics(out, config.group_size), out


def format_conversation(tokenizer: Any, out: Rollout, row: int) -> str:
    """Row `row` of a Rollout as readable text: its whole token buffer decoded (a limited
    context mode's row: each turn's sample, its context then its reply), the model's
    sampled tokens between « and », each reply followed by its turn's reward and format flag,
    under a header with the trajectory's outcome."""
    host = jax.device_get(out)
    rows = host.tokens.shape[0]
    if not 0 <= row < rows:
        raise ValueError(f"row {row} is out of range; the rollout has rows 0..{rows - 1}")
    cols = np.arange(int(host.lengths[row]))
    if host.turn_lengths is not None:
        width = host.tokens.shape[1] // host.turn_lengths.shape[1]
        cols = np.concatenate([t * width + np.arange(n)
                               for t, n in enumerate(host.turn_lengths[row])])
    tokens, mask, turn_ids = host.tokens[row, cols], host.loss_mask[row, cols], \
        host.turn_ids[row, cols]
    rewards, penalties = host.turn_rewards[row], host.format_penalties[row]
    turns = int(host.turn_taken[row].sum())
    lines = [f"=== row {row}: success {bool(host.success[row])}, "
             f"reward {float(rewards.sum()):g} (format penalties {float(penalties.sum()):g}), "
             f"{turns} turn{'s' * (turns != 1)}, {int(host.num_actions[row])} actions ==="]
    text = []
    # Runs of equal mask values: prompt / environment text, then a reply, and so on.
    edges = np.flatnonzero(np.diff(mask.astype(np.int8))) + 1
    for segment, is_reply, turn in zip(np.split(tokens, edges), np.split(mask, edges),
                                       np.split(turn_ids, edges)):
        decoded = tokenizer.decode(segment.tolist(), skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False)
        if not is_reply[0]:
            text.append(decoded)
            continue
        k = int(turn[0])
        ok = "ok" if host.format_ok[row, k] else "bad"
        text.append(f"{REPLY_OPEN}{decoded}{REPLY_CLOSE}\n"
                    f"  [turn {k + 1}: reward {float(rewards[k]):g}, format {ok}"
                    f"{f', penalty {float(penalties[k]):g}' if penalties[k] else ''}]\n")
    return "\n".join(lines) + "\n" + "".join(text) + "\n"


def summary_table(metrics: Mapping[str, float]) -> str:
    """val/<env>/<mode>/<name> metrics as a table, one row per (env, mode)."""
    rows: dict[tuple[str, str], dict[str, float]] = {}
    for key, value in metrics.items():
        if key.startswith("val/"):
            _, env, mode, name = key.split("/", 3)
            rows.setdefault((env, mode), {})[name] = value
    columns = ["success"] + sorted({n for r in rows.values() for n in r if n.startswith("pass@")}) \
        + ["reward", "num_turns", "num_actions", "action_is_valid", "response_length"] \
        + (["loss"] if any("loss" in r for r in rows.values()) else [])  # SFT's held-out loss
    width = max([len("env")] + [len(env) for env, _ in rows])
    head = f"{'env':<{width}}  {'mode':<7}  " + "  ".join(columns)
    body = [f"{env:<{width}}  {mode:<7}  " + "  ".join(
        f"{r[c]:>{len(c)}.3f}" if c in r else f"{'-':>{len(c)}}" for c in columns)
        for (env, mode), r in rows.items()]
    return "\n".join([head, *body])
