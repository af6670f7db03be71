"""Evaluation on held-out initial states: greedy and sampled rollouts, success and pass@k.

    evaluator = Evaluator(graphdef, tokenizer, {"bandit": (env, codec), ...}, train.rollout,
                          EvalConfig(envs=("bandit", "bandit_test")), run_key,
                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    result = evaluator.evaluate(train_state.actor)     # {"val/bandit/greedy/success": ..., ...}
    print(evaluator.samples_text(result))               # readable conversations

The protocol (the eval section's defaults, RAGEN's validation: config/base.yaml's es_manager.val,
val_kwargs, seed.val, trainer.val_before_train and test_freq): before the first step and every
10 steps, 512 held-out initial states x 1 rollout each, sampled at temperature 0.5, then greedy;
comparable with RAGEN's published validation numbers. Fewer than 256 states is not a figure of
record (starpo_jax.analysis.report says so).

Held-out states: training draws the initial states of iteration t from fold_in(run_key, t)
(train/step.py); evaluation draws from fold_in(eval_key, EVAL_STREAM), a value no step counter
reaches, split into one key for the initial states and one for sampling. eval_key is the run key
of eval.seed (experiment.eval_run_key: run_keys(eval.seed)), by default VAL_SEED = 123 (RAGEN's
seed.val) whatever the run's seed, so every run, every training seed and every resume meets the
same `episodes` initial states with the same sampling noise (eval.seed None: the run's own
key). The keys never coincide with a training key: fold_in(k, EVAL_STREAM) with k = the eval
seed's run key is no run's fold_in(k', t) for t < 2**31 - 1 (the same k: another counter; another
k': threefry outputs, a collision of 64-bit keys being ~2**-64). The states themselves come
from the same generator, so a small game can repeat a training layout, as RAGEN's disjoint val
and train seeds can: what is held out is the draw, as there (112 of the 512 held-out 6x6
Sokoban states, 13 of FrozenLake's, are among a 200-step, 8-group run's 1600 training ones).
An evaluation is a deterministic function of the parameters (pass another `sample_key` to
resample). Every env and both modes share the initial-state keys: the comparisons are paired.
Initial state g starts from env.reset(reset_keys[g]), reset_keys = split(reset key, episodes);
row r (state r // k, its (r % k)-th rollout) samples with fold_in(sample key, r) (one key per
row: sampling.row_keys). The rows are rolled out eval.batch at a time (default: the training
rollout's rows per chunk, which the memory check sized), one compiled program per (env, mode)
called once per chunk; as each row depends on its own keys alone, the results are those of one
batch of all the rows (tests/test_validation_protocol.py).

Modes: "sampled" (the eval temperature, `pass_k` rollouts per initial state: pass@k is the
fraction of initial states where any of the k succeeds) and "greedy" (argmax, one rollout per
initial state). Each (env, mode) is its own compiled program (the env and the chunk's shape
are static), compiled at its first call and reused by every chunk and every later evaluation
with the same env object: on CPU every distinct env costs a rollout compile. The rollout
settings are the training ones (turns, token budgets, mode) with the batch shape and temperature
swapped. Host envs: host_train.HostEvaluator, on the same EvaluatorBase (all rows at once).

Metric names: val/<env>/<mode>/{success, reward, num_turns, num_actions, action_is_valid,
response_length, states} (states: the held-out initial states averaged over, what says whether
a number is of record), val/<env>/<mode>/failure/<kind> for the six failure classes of
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
        "states": jnp.float32(out.success.shape[0] // k),  # held-out initial states
    }
    if k > 1:
        metrics[f"pass@{k}"] = pass_at_k(out.success, k)
    metrics.update({f"failure/{kind}": value
                    for kind, value in failure_fractions(out.failure).items()})
    if out.prediction_ok is not None:  # rollout.world_model (rollout/world_model.py)
        metrics["observation_acc"] = jnp.sum(out.observation_ok & taken) / turns
        metrics["prediction_acc"] = jnp.sum(out.prediction_ok & taken) / turns
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

    def _run(self, name: str, mode: str, params: nnx.State, sample_key: jax.Array,
             states: int | None = None) -> tuple[dict[str, jax.Array], Rollout]:
        """(eval_metrics of the rollouts, the rollouts) of env `name` in `mode`, on the first
        `states` held-out initial states (None: all config.episodes; an evaluator may roll out
        more than asked)."""
        raise NotImplementedError

    def evaluate(self, params: nnx.State, sample_key: jax.Array | None = None,
                 envs: tuple[str, ...] | None = None, states: int | None = None) -> EvalResult:
        """Runs every mode on `envs` (default: all of config.envs) with the policy `params`;
        `states`: only the first that many held-out initial states (for samples: its metrics
        are then not the evaluation's)."""
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
                values, out = self._run(name, mode, params, sample_key, states)
                rollouts[name, mode] = out
                for metric, value in jax.device_get(values).items():
                    metrics[f"val/{metric_env(name)}/{mode}/{metric}"] = float(value)
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
        rows = config.batch or chunk_rows(rollout_config)
        # Initial states per compiled chunk: as many as `rows` holds, at least one.
        self.chunk_states = {m: max(1, min(config.episodes, rows // k))
                             for m, k in self.group_sizes.items()}
        self._programs: dict[tuple[str, str], Callable] = {}
        for name in config.envs:
            env, codec = envs[name]
            for mode in config.modes:
                settings = dataclasses.replace(eval_rollout_config(rollout_config, config, mode),
                                               groups=self.chunk_states[mode])
                self._programs[name, mode] = functools.partial(
                    _program, graphdef, env, settings, mode == "greedy", eos_id, pad_id, codec)

    @property
    def reset_keys(self) -> jax.Array:
        """[episodes, 2] uint32: the keys env.reset draws the held-out initial states from."""
        return jax.random.split(self.reset_key, self.config.episodes)

    def _run(self, name, mode, params, sample_key, states=None):
        k = self.group_sizes[mode]
        n = self.config.episodes if states is None else max(1, min(states, self.config.episodes))
        out = chunked(self._programs[name, mode], params, self.reset_keys[:n],
                      row_sample_keys(sample_key, n * k), self.chunk_states[mode], k,
                      f"{name} {mode}")
        return _metrics(out, k), out


def chunk_rows(train: RolloutConfig) -> int:
    """eval.batch's default: the training rollout's rows per chunk (groups x group_size /
    chunks), which the memory check sized for this device."""
    return max(1, train.groups * train.group_size // max(train.chunks, 1))


def row_sample_keys(sample_key: jax.Array, rows: int) -> jax.Array:
    """[rows, 2]: row r's sampling key fold_in(sample_key, r) (row r = state r // k's
    (r % k)-th rollout), whichever chunk it is rolled out in."""
    return jax.vmap(jax.random.fold_in, (None, 0))(sample_key, jnp.arange(rows))


def chunked(program: Callable, params: nnx.State, reset_keys: jax.Array, sample_keys: jax.Array,
            states: int, k: int, what: str = "") -> Rollout:
    """The rollouts of every initial state (reset_keys [S, 2], sample_keys [S * k, 2]) by
    `program(params, reset_keys [states, 2], sample_keys [states * k, 2])`, `states` at a time
    (the last chunk padded with copies of its first state, dropped after), concatenated in
    order: each row depends on its own keys alone, so the result is the one-chunk result."""
    total = reset_keys.shape[0]
    pieces, began = [], time.perf_counter()
    for start in range(0, total, states):
        n = min(states, total - start)
        reset = reset_keys[start:start + n]
        sample = sample_keys[start * k:(start + n) * k]
        if n < states:
            reset = jnp.concatenate([reset, jnp.repeat(reset[:1], states - n, axis=0)])
            sample = jnp.concatenate([sample, jnp.tile(sample[:k], (states - n, 1))])
        out = program(params, reset, sample)
        pieces.append(out if n == states else jax.tree.map(lambda x, n=n: x[:n * k], out))
        jax.block_until_ready(pieces[-1])  # the progress line's time is the work's, not dispatch's
        elapsed = time.perf_counter() - began
        if elapsed >= announce.SLOW_SECONDS and start + n < total:
            announce.say(f"  evaluating {what}: {start + n}/{total} initial states at "
                         f"{human_duration(elapsed)}")
    if len(pieces) == 1:
        return pieces[0]
    return jax.tree.map(lambda *xs: jnp.concatenate(xs), *pieces)


_metrics = jax.jit(eval_metrics, static_argnums=1)


# Module-level with the env static and the codec an argument: an Evaluator built again for the
# same env object (e.g. by experiments/evaluate.py's tests, or a notebook) reuses the compiled
# program.
@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5))
def _program(graphdef, env, config: RolloutConfig, greedy: bool, eos_id: int, pad_id: int,
             codec, params, reset_keys, sample_keys) -> Rollout:
    """One chunk: config.groups initial states (reset_keys [groups, 2]) x group_size rows
    (sample_keys [rows, 2], one per row)."""
    if config.world_model and getattr(env, "coordinate_parts", None) is None:
        config = dataclasses.replace(config, world_model=False, prediction_reward=0.0)
    return rollout(graphdef, params, env, codec, config, sample_keys, eos_id=eos_id,
                   pad_id=pad_id, greedy=greedy, reset_key=reset_keys)


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


def metric_env(name: str) -> str:
    """An env's name as its metric keys spell it (val/<env>/<mode>/<metric>): without "/", which
    separates the key's parts. A URL's scheme is dropped and its other "/" become "_":
    "openenv:http://127.0.0.1:8000/x" -> "openenv:127.0.0.1:8000_x"."""
    prefix, sep, rest = name.rpartition("://")
    if sep:
        name = prefix.rpartition(":")[0] + ":" + rest if ":" in prefix else rest
    return name.replace("/", "_")


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
