"""RAGEN-2's advantage and filter switches (starpo_jax/algo/reweighting.py, the learner's
prepare, monitor.EmptyFilterStop) against NumPy ports of the original's code
(tests/helpers/ragen2_reference.py) on random inputs, several seeds and the edge cases; their
defaults and the errors of bad values; the empty-filter stop on a scripted and a tiny run."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import ragen2_reference as ref
from helpers.tiny import tiny_config, tiny_experiment
from starpo_jax import api
from starpo_jax.algo import reweighting
from starpo_jax.config import (AdvantageConfig, FilterConfig, OptimConfig, RolloutConfig,
                               TrainConfig)
from starpo_jax.run import loop as runner
from starpo_jax.run.checkpoint import Checkpoints
from starpo_jax.run.monitor import EMPTY, EMPTY_STEPS, EMPTY_STOPPED, EmptyFilterStop
from starpo_jax.run.schema import check_config, default_config, train_config
from starpo_jax.train.step import make_train_fns

GROUPINGS = ("state", "batch", "inductive")
METHODS = ("identity", "mean_std", "mean", "asym_clip")


def random_scores(seed: int, shape: tuple[int, int], kind: str) -> np.ndarray:
    """[P, N] scores: "normal", "binary" (ties, groups of zero std), "equal" (every group)."""
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.normal(size=shape).astype(np.float32)
    if kind == "binary":
        return (rng.random(shape) < 0.5).astype(np.float32) - 0.1 * (rng.random(shape) < 0.3)
    return np.full(shape, 0.7, np.float32)


def grpo_config(groups: int, group_size: int, **advantage) -> TrainConfig:
    return TrainConfig(algo="grpo", rollout=RolloutConfig(groups=groups, group_size=group_size),
                       filter=FilterConfig(keep_ratio=1.0), optim=OptimConfig(
                           minibatch_rows=groups * group_size),
                       advantage=AdvantageConfig(**advantage))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("grouping", GROUPINGS)
def test_reward_normalization_is_the_originals(grouping, method):
    for seed, shape, kind in [(0, (4, 3), "normal"), (1, (5, 4), "binary"), (2, (3, 2), "equal"),
                              (3, (1, 6), "normal"), (4, (6, 1), "normal"),
                              (5, (2, 8), "binary")]:
        scores = random_scores(seed, shape, kind)
        want = ref.normalize_score_tensor(scores.reshape(-1), ref.group_tags(
            scores.size, shape[1], grouping), method)
        got = reweighting.normalize_scores(scores.reshape(-1), shape[1], grouping, method)
        np.testing.assert_allclose(np.asarray(got), want, atol=2e-5,
                                   err_msg=f"{seed} {shape} {kind}")


def test_reward_normalization_edge_cases():
    one_each = jnp.array([1.0, 2.0, 3.0])  # groups of one: the original leaves them
    assert np.array_equal(reweighting.normalize_scores(one_each, 1, "state", "mean_std"), one_each)
    equal = jnp.full(6, 0.3)  # zero std: 0, not 0 / eps
    assert not np.asarray(reweighting.normalize_scores(equal, 3, "batch", "mean_std")).any()
    with pytest.raises(ValueError, match="unknown method 'z'"):
        reweighting.normalize_scores(equal, 3, "batch", "z")


def _rows(mask: np.ndarray, scores: np.ndarray):
    return types.SimpleNamespace(loss_mask=jnp.asarray(mask), scores=jnp.asarray(scores))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape,kind", [((4, 3), "normal"), ((3, 4), "binary"),
                                        ((2, 3), "equal"), ((1, 4), "normal"),
                                        ((3, 1), "normal")])
def test_soft_reweight_length_weight_and_zero_are_the_originals(seed, shape, kind):
    p, n = shape
    rng = np.random.default_rng(seed)
    scores = random_scores(seed, shape, kind).reshape(-1)
    kept = rng.random(p) < 0.7
    kept[rng.integers(p)] = True  # at least one group kept
    mask = rng.random((p * n, 9)) < 0.6
    mask[np.arange(p * n), rng.integers(9, size=p * n)] = True  # every row has a reply token
    index = np.repeat(np.arange(p), n)
    grpo, group_std = ref.grpo_outcome_advantage(scores, index)
    adv = np.where(mask, grpo[:, None], 0.0)
    rows = np.repeat(kept, n)  # the original's batch: the kept groups' rows only
    for switches in ({"soft_advantage_reweight": True}, {"grpo_advantage_length_weight": True},
                     {"soft_advantage_reweight": True, "grpo_advantage_length_weight": True},
                     {"soft_advantage_reweight": True, "zero_task_advantage": True}):
        want, _ = ref.soft_advantage_reweight(adv[rows], group_std[rows], index[rows]) \
            if switches.get("soft_advantage_reweight") else (adv[rows], None)
        want = ref.filter_loss_scaling(want, kept.mean(), "linear")
        if switches.get("grpo_advantage_length_weight"):
            want = ref.grpo_length_weight(want, mask[rows])
        if switches.get("zero_task_advantage"):
            want = ref.zero_task_advantage(want)
        config = grpo_config(p, n, **switches)
        scaled = jnp.asarray(adv * kept.mean(), jnp.float32)  # filter.loss_scaling "linear"
        masked = mask & rows[:, None]  # the batch's groups not kept are out of the loss
        got = reweighting.adjust_advantages(config, scaled, _rows(masked, scores), None,
                                            jnp.asarray(kept))
        np.testing.assert_allclose(np.asarray(got)[rows], want, rtol=2e-5, atol=2e-6,
                                   err_msg=str(switches))


def test_soft_weights_edge_cases():
    equal = jnp.full((3, 4), 1.0)  # every std 0: every weight 0 (0 / (0 + eps))
    assert not np.asarray(reweighting.soft_weights(equal, jnp.ones(3, bool))).any()
    ones = reweighting.soft_weights(jnp.array([[1.0], [5.0]]), jnp.ones(2, bool))
    np.testing.assert_allclose(ones, 1 / (1 + 1e-6))  # a group of one: GRPO's std 1
    # The largest std is the kept groups' only.
    w = reweighting.soft_weights(jnp.array([[0.0, 2.0], [0.0, 4.0]]), jnp.array([True, False]))
    np.testing.assert_allclose(w[0], 1 / (1 + 1e-6 / np.std([0, 2], ddof=1)), rtol=1e-6)


def test_the_switches_default_off_and_the_stop_on():
    a, f = AdvantageConfig(), FilterConfig()
    assert (a.reward_normalization_grouping, a.reward_normalization_method) == ("state",
                                                                                "identity")
    assert not (a.soft_advantage_reweight or a.grpo_advantage_length_weight
                or a.zero_task_advantage)
    assert f.empty_stop_steps == 5  # base.yaml's rollout_filter_empty_stop_steps
    c = default_config()
    assert c.filter.empty_stop_steps == 5 and c.advantage.zero_task_advantage is False


@pytest.mark.parametrize("key,value,message", [
    ("advantage.reward_normalization_method", "std",
     "advantage.reward_normalization_method = 'std' is invalid; valid: one of ('identity', "
     "'mean_std', 'mean', 'asym_clip')"),
    ("advantage.reward_normalization_grouping", "group",
     "advantage.reward_normalization_grouping = 'group' is invalid; valid: one of ('state', "
     "'batch', 'inductive')"),
    ("advantage.zero_task_advantage", "yes",
     "config.advantage.zero_task_advantage = 'yes' is invalid; valid: True or False"),
    ("filter.empty_stop_steps", -1, "filter.empty_stop_steps = -1 is invalid; valid: an int >= 0"),
])
def test_bad_values_name_the_key_and_what_is_valid(key, value, message):
    section, name = key.split(".")
    with pytest.raises(ValueError) as error:
        check_config({"algo": "grpo", section: {name: value}})
    assert message in str(error.value)


@pytest.mark.parametrize("algo,key", [("ppo", "soft_advantage_reweight"),
                                      ("ppo", "grpo_advantage_length_weight")])
def test_grpo_only_switches_refuse_other_estimators(algo, key):
    c = api.config_for("bandit", algo)
    c.advantage[key] = True
    with pytest.raises(ValueError, match=rf"advantage.{key} = True is invalid; valid: False with "
                                         r"estimator 'gae': the original applies it to GRPO"):
        check_config(c)
    c = api.config_for("bandit", "grpo")
    c.advantage.update(estimator="rloo", **{key: True})
    with pytest.raises(ValueError, match="estimator 'rloo'"):
        train_config(c)  # check_config leaves the estimator to it (a user's may come later)


def test_normalization_refuses_turn_rewards():
    c = api.config_for("bandit", "grpo")
    c.advantage.update(reward_normalization_method="mean_std", reward_placement="turn")
    with pytest.raises(ValueError, match="'identity' with advantage.reward_placement = 'turn'"):
        check_config(c)


@pytest.mark.parametrize("switches,kept_share", [
    ({"reward_normalization_method": "mean_std", "reward_normalization_grouping": "batch",
      "soft_advantage_reweight": True, "grpo_advantage_length_weight": True}, 1.0),
    ({"reward_normalization_method": "asym_clip", "zero_task_advantage": True}, 1.0),
])
def test_prepare_gives_the_originals_advantages(switches, kept_share):
    """The learner's prepare on a tiny rollout given random rewards, against the ports chained
    in the original's order: normalise, GRPO, soft reweight, (loss scaling), length weight,
    zero."""
    exp = tiny_experiment()
    p, n = exp.train.rollout.groups, exp.train.rollout.group_size
    config = dataclasses.replace(exp.train, advantage=AdvantageConfig(**switches),
                                 filter=FilterConfig(keep_ratio=1.0))
    fns = make_train_fns(config, exp.env, exp.codec, model=exp.model,
                             eos_id=exp.tokenizer.eos_token_id, pad_id=exp.tokenizer.pad_token_id)
    rewards = jnp.asarray(np.random.default_rng(7).normal(size=(p * n, 1)), jnp.float32)

    @jax.jit
    def prepare(state, key):
        out = fns.rollout(state, key).replace(turn_rewards=rewards)
        return out, fns.prepare(state, out)

    out, batch = prepare(exp.fresh_state(), jax.random.PRNGKey(3))
    scores = np.asarray(out.scores, np.float64)
    a = config.advantage
    normalized = ref.normalize_score_tensor(scores, ref.group_tags(
        p * n, n, a.reward_normalization_grouping), a.reward_normalization_method)
    index = np.repeat(np.arange(p), n)
    grpo, std = ref.grpo_outcome_advantage(normalized, index)
    mask = np.asarray(batch.rollout.loss_mask)
    want = np.where(mask, grpo[:, None], 0.0)
    if a.soft_advantage_reweight:
        want, _ = ref.soft_advantage_reweight(want, std, index)
    want = want * kept_share
    if a.grpo_advantage_length_weight:
        want = ref.grpo_length_weight(want, mask)
    if a.zero_task_advantage:
        want = ref.zero_task_advantage(want)
    assert np.asarray(batch.selection.kept).all()
    np.testing.assert_allclose(np.asarray(batch.advantages), want, rtol=1e-4, atol=1e-5)


class _State(flax.struct.PyTreeNode):
    step: jax.Array


class _Scripted:
    """What runner.train uses of an api.Experiment, stepping through scripted kept counts."""

    sizes_its_step = False

    def __init__(self, kept: list[int], limit: int):
        self.kept = kept
        self.config = api.default_config()
        self.config.steps, self.config.checkpoint_every = len(kept), 0
        self.config.eval_every = self.config.sample_every = 0
        self.config.monitor.enabled = False
        self.config.filter.empty_stop_steps = limit
        self.state = self.fresh_state()

    def fresh_state(self) -> _State:
        return _State(step=jnp.zeros((), jnp.int32))

    def estimated_step_seconds(self) -> None:
        return None

    def step(self) -> dict[str, float]:
        kept = self.kept[self.steps_done]
        self.state = self.state.replace(step=self.state.step + 1)
        return {"rollout/kept_groups": float(kept)}

    @property
    def steps_done(self) -> int:
        return int(self.state.step)


def _rows_of(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("limit", [0, 1, 3])
def test_empty_stop_counts_as_the_original(tmp_path, capsys, seed, limit):
    kept = list((np.random.default_rng(seed).random(14) < 0.6) * 2)
    counts, stop = ref.empty_stop_steps(kept, limit)
    done = runner.train(_Scripted(kept, limit), tmp_path)
    assert done == (stop or len(kept))
    rows = _rows_of(tmp_path)
    assert [r[EMPTY_STEPS] for r in rows] == counts
    assert [r[EMPTY] for r in rows] == [float(c > 0) for c in counts]
    assert [r["step"] for r in rows if EMPTY_STOPPED in r] == ([stop] if stop else [])
    if stop:
        assert f"early stop: filter.empty_stop_steps = {limit}: the filter kept no group" in \
            capsys.readouterr().out


def test_empty_stop_resumes_counting_on_and_after_a_stop_afresh(tmp_path):
    kept = [2, 0, 2, 0, 0, 0, 0, 0, 0, 2]
    assert runner.train(_Scripted(kept, 3), tmp_path) == 6
    assert Checkpoints(tmp_path / "checkpoints", 0, 3).latest_step == 6
    assert runner.train(_Scripted(kept, 3), tmp_path, resume=True) == 9, "3 more empty steps"
    assert [r[EMPTY_STEPS] for r in _rows_of(tmp_path)] == [0, 1, 0, 1, 2, 3, 1, 2, 3]
    # A run stopped otherwise (here: its steps) counts on from metrics.jsonl when resumed.
    other = tmp_path / "other"
    short = _Scripted(kept, 3)
    short.config.steps = 4
    assert runner.train(short, other) == 4
    watch = EmptyFilterStop(other, short.config, first_step=4)
    assert watch.count == 1


def test_empty_stop_on_a_tiny_run_saves_and_resumes(tmp_path, capsys):
    """A filter that keeps nothing (include_zero=False: the tiny random model's replies are all
    invalid, every group's std 0) stops the run after filter.empty_stop_steps steps, with a
    checkpoint a --resume goes on from (here with the stop off)."""
    c = tiny_config()
    c.filter.include_zero, c.filter.empty_stop_steps = False, 2
    c.steps, c.check_memory = 4, False
    exp = api.build(c)
    assert runner.train(exp, tmp_path) == 2
    assert "filter.empty_stop_steps = 2: the filter kept no group in 2 steps in a row (steps " \
        "1-2" in capsys.readouterr().out
    assert Checkpoints(tmp_path / "checkpoints", 0, 3).latest_step == 2
    assert _rows_of(tmp_path)[-1][EMPTY_STOPPED] == 1.0
    exp.config.filter.empty_stop_steps = 0  # a change --resume accepts
    assert runner.train(exp, tmp_path, resume=True) == 4
    assert [r[EMPTY_STEPS] for r in _rows_of(tmp_path)] == [1, 2, 1, 2]


def test_vanilla_keeps_the_runs_empty_stop():
    c = api.config_for("bandit", "grpo")
    c.vanilla, c.filter.empty_stop_steps = True, 0
    check_config(c)  # not refused: vanilla's filter keeps every group, the stop is the run's
    assert train_config(c).filter.empty_stop_steps == 0
