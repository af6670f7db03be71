"""RAGEN's validation protocol as the default (starpo_jax.run.evaluation): the defaults for every
env, held-out states and sampling keys fixed by the val seed across training seeds and resumes
and never a training key, chunked evaluations equal to one batch, the evaluation before
training (the initial weights, logged at step 0, not repeated on resume), the report's "not a
figure of record", and the CPU-sized configs that say their evaluation is not the protocol."""

from __future__ import annotations

import dataclasses
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import envs_jax  # noqa: E402
from starpo_jax import api  # noqa: E402
from starpo_jax.analysis import report  # noqa: E402
from starpo_jax.config import RECORD_STATES, VAL_SEED, VAL_STATES  # noqa: E402
from starpo_jax.run import loop as runner  # noqa: E402
from starpo_jax.run.cli import CONFIG_DIR, load_config  # noqa: E402
from starpo_jax.run.evaluation import Evaluator, heldout_keys, row_sample_keys  # noqa: E402
from helpers.tiny import SHORT_TURN, tiny_experiment  # noqa: E402
from test_evaluation import _jsonl, _nudge, _training_reset_keys, _with_eval  # noqa: E402

EPISODES = 3


@pytest.mark.parametrize("env", ["sokoban", "frozen_lake", "coord_sokoban", "coord_frozen_lake",
                                 "bandit"])
def test_the_defaults_are_ragens_protocol_for_every_env(env):
    """512 states of the fixed val seed, sampled at 0.5 with one rollout each, then greedy,
    before training and every 10 steps: for the grid games and the bandit alike (RAGEN's
    es_manager.val is one for every env); paper_eval sets exactly that."""
    if env not in envs_jax.names():
        pytest.skip(f"{env} is not registered in this tree")
    config = api.config_for(env, "grpo")
    e = api.eval_config(config)
    assert (e.episodes, e.modes, e.pass_k, e.temperature, e.seed, e.batch) == (
        VAL_STATES, ("sampled", "greedy"), 1, 0.5, VAL_SEED, None) == (
        512, ("sampled", "greedy"), 1, 0.5, 123, None)
    assert (config.val_before_train, config.eval_every) == (True, 10)
    changed = api.config_for(env, "grpo")
    changed.eval.update(episodes=8, modes="greedy", seed=None)
    changed.val_before_train = False
    assert api.eval_config(api.paper_eval(changed)) == e and changed.val_before_train


def _for_seed(exp: api.Experiment, train_seed: int, **eval_keys) -> api.Experiment:
    """`exp` as api.build gives it for `train_seed` (its keys from api.run_keys)."""
    config = exp.config.copy_and_resolve_references()
    config.seed = train_seed
    config.eval.update(episodes=EPISODES, **eval_keys)
    init_key, key = api.run_keys(train_seed)
    return dataclasses.replace(exp, config=config, key=key, init_key=init_key)


def _keys(evaluator: Evaluator) -> tuple[np.ndarray, np.ndarray]:
    rows = EPISODES * evaluator.group_sizes["sampled"]
    return (np.asarray(evaluator.reset_keys),
            np.asarray(row_sample_keys(evaluator.sample_key, rows)))


def test_heldout_states_and_sampling_keys_are_the_val_seeds_for_every_seed_and_resume(tmp_path):
    exp = tiny_experiment()
    runs = [api.build_evaluator(_for_seed(exp, seed)) for seed in (0, 1, 7)]
    reset, sample = _keys(runs[0])
    for other in runs[1:]:
        np.testing.assert_array_equal(_keys(other)[0], reset)
        np.testing.assert_array_equal(_keys(other)[1], sample)
    # They are those of the val seed's run: heldout_keys(run_keys(123)[1]).
    reset_key, sample_key = heldout_keys(api.run_keys(VAL_SEED)[1])
    np.testing.assert_array_equal(reset, jax.random.split(reset_key, EPISODES))
    np.testing.assert_array_equal(runs[0].sample_key, sample_key)
    assert len({tuple(k) for k in sample.tolist()}) == len(sample), "a key per row"
    # A resumed run reads its config back from config.json: the same keys.
    path = tmp_path / "config.json"
    path.write_text(_for_seed(exp, 1).config.to_json())
    saved = dataclasses.replace(exp, config=api.read_run_config(tmp_path)[0])
    np.testing.assert_array_equal(_keys(api.build_evaluator(saved))[0], reset)
    # eval.seed = None: each run its own states.
    own = [_keys(api.build_evaluator(_for_seed(exp, s, seed=None)))[0] for s in (0, 1)]
    assert not np.array_equal(own[0], own[1])


def test_heldout_keys_are_no_training_keys():
    """The protocol's 512 reset keys against those of 30 training iterations of runs with seeds
    0, 1 and the val seed itself (train/step.py's keys, rollout.groups 8): disjoint."""
    heldout = {tuple(k) for k in np.asarray(jax.random.split(
        heldout_keys(api.run_keys(VAL_SEED)[1])[0], VAL_STATES)).tolist()}
    assert len(heldout) == VAL_STATES
    for seed in (0, 1, VAL_SEED):
        assert not heldout & _training_reset_keys(api.run_keys(seed)[1], 30, 8), seed


@pytest.fixture(scope="module")
def grid() -> api.Experiment:
    """Sokoban, 2 turns, the tiny model, 2 x 2 training rows (eval.batch's default: 4 rows)."""
    c = api.config_for("sokoban", "grpo", groups=2, group_size=2, max_turns=2, reply_tokens=6)
    c.model.source = "tiny-random"
    c.nothink, c.check_memory = True, False
    c.prompt.update(system="", intro="", turn=SHORT_TURN, verify=20)
    c.eval.update(envs="sokoban", modes="sampled", episodes=EPISODES, pass_k=2, samples=1)
    return api.build(c)


def test_chunked_evaluation_equals_one_batch(grid):
    """3 states x 2 sampled rollouts: in chunks of 2 states (eval.batch's default, the training
    rows: 4; the last chunk padded) and in one batch of 6 rows: the same rollouts and metrics."""
    chunked = api.build_evaluator(grid)
    assert chunked.chunk_states == {"sampled": 2}
    whole = api.build_evaluator(_with_eval(grid, batch=EPISODES * 2))
    assert whole.chunk_states == {"sampled": EPISODES}
    a, b = (e.evaluate(grid.state.actor) for e in (chunked, whole))
    assert a.metrics == b.metrics and a.metrics["val/sokoban/sampled/states"] == EPISODES
    out_a, out_b = a.rollouts["sokoban", "sampled"], b.rollouts["sokoban", "sampled"]
    assert out_a.success.shape == (EPISODES * 2,)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(out_a), jax.device_get(out_b))


def test_step_0_evaluates_the_initial_weights_once(tmp_path):
    """A fresh run evaluates before its first update (the parameters are the initial ones),
    logs it at step 0 (val/ and timing/ only), then every eval_every steps; resumed, it does
    not evaluate step 0 again."""
    exp = _with_eval(tiny_experiment(), envs="bandit", modes="greedy", episodes=EPISODES,
                     samples=1)
    exp = dataclasses.replace(exp, train_step=_nudge)
    exp.config.update(steps=2, eval_every=2)
    initial = jax.device_get(exp.state.actor)
    real, seen = api.build_evaluator(exp), []

    class Recording:
        config = real.config

        def evaluate(self, params, sample_key=None, envs=None):
            seen.append((int(exp.state.step), jax.device_get(params)))
            return real.evaluate(params, sample_key, envs)

        def samples_text(self, result):
            return real.samples_text(result)

    exp.evaluator = Recording
    assert runner.train(exp, tmp_path) == 2
    assert [step for step, _ in seen] == [0, 2]
    jax.tree.map(np.testing.assert_array_equal, seen[0][1], initial)
    rows = _jsonl(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert {k for k in rows[0] if not k.startswith(("val/", "timing/"))} == {"step"}
    expected = real.evaluate(exp.fresh_state().actor).metrics
    assert {k: v for k, v in rows[0].items() if k.startswith("val/")} == expected
    seen.clear()
    exp.config.steps = 3
    assert runner.train(exp, tmp_path, resume=True) == 3
    assert [step for step, _ in seen] == [3], "step 0 is not evaluated again"
    assert [r["step"] for r in _jsonl(tmp_path)] == [0, 1, 2, 3]


def test_when_step_0_is_evaluated(tmp_path):
    config = api.config_for("bandit", "grpo")
    assert runner.evaluates_step_0(config, 0, tmp_path, resume=False)
    assert runner.evaluates_step_0(config, 0, tmp_path, resume=True), "nothing logged yet"
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/bandit/x": 1.0}) + "\n")
    assert not runner.evaluates_step_0(config, 0, tmp_path, resume=True), "logged already"
    assert runner.evaluates_step_0(config, 0, tmp_path, resume=False), "a fresh run's own"
    assert not runner.evaluates_step_0(config, 4, tmp_path, resume=True), "past step 0"
    for key, value in (("val_before_train", False), ("eval_every", 0)):
        off = config.copy_and_resolve_references()
        off[key] = value
        assert not runner.evaluates_step_0(off, 0, tmp_path, resume=False), key


def _rows(states: int | None) -> list[dict]:
    val = {"val/sokoban/sampled/success": 0.25}
    if states is not None:
        val["val/sokoban/sampled/states"] = float(states)
    return [{"step": 0, **val}, {"step": 1, "train/success": 0.5, **val}]


@pytest.mark.parametrize("states, of_record", [(512, True), (256, True), (64, False),
                                               (None, False)])
def test_the_report_marks_fewer_states_not_a_figure_of_record(states, of_record):
    exp = report.ExperimentResult("multi", "Multi-turn", "table4", "", {"s": {0: _rows(states)}})
    assert report.heldout_states(exp, "sokoban", "sampled") == states
    for text in (report.table4(exp, "sampled"), report.heldout_steps_table(exp, "sokoban",
                                                                           "sampled")):
        assert ("Not a figure of record" in text) is not of_record, text
    title = report.curve_figure(exp, "val/sokoban/sampled/success").axes[0].get_title()
    assert ("not a figure of record" in title) is not of_record


def test_cpu_sized_configs_say_their_evaluation_is_not_the_protocol():
    """A shipped config evaluating fewer than RECORD_STATES states says so in its docstring;
    the paper-setting configs (paper_eval) run the protocol."""
    for path in sorted(CONFIG_DIR.glob("*.py")):
        config, text = load_config(path.name), path.read_text()
        if not config.eval_every:
            continue
        if config.eval.episodes < RECORD_STATES:
            said = " ".join(text.split())
            assert "not the validation protocol of record" in said or \
                "a CPU-sized greedy evaluation" in said, path.name
        elif "paper_eval(" in text:
            assert api.eval_config(config) == api.eval_config(api.paper_eval(
                config.copy_and_resolve_references())), path.name
