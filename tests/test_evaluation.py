"""Evaluation: held-out initial states, greedy determinism, metrics against a numpy reference,
the OOD envs, readable conversations, the eval config section, experiments/evaluate.py on a
run's workdir, and runner.train's periodic evaluation and sample files."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import envs_jax  # noqa: E402
from starpo_jax import api  # noqa: E402
from starpo_jax.run import loop as runner, schema as run_config  # noqa: E402
from starpo_jax.run.evaluation import (REPLY_CLOSE, REPLY_OPEN, EvalConfig,  # noqa: E402
                                       EvalResult, Evaluator, eval_metrics, format_conversation,
                                       pass_at_k)
from starpo_jax.algo.failures import FAILURE_KINDS  # noqa: E402
from starpo_jax.rollout.jax_env import Rollout  # noqa: E402
from helpers.tiny import tiny_config, tiny_experiment  # noqa: E402
from test_failures import reference_failure  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

EPISODES, K = 3, 2
NAMES = ("success", "reward", "num_turns", "num_actions", "action_is_valid", "response_length",
         "states", *(f"failure/{kind}" for kind in FAILURE_KINDS))


def _with_eval(exp: api.Experiment, **eval_keys) -> api.Experiment:
    """`exp` (sharing its model and compiled step) with another eval section and a fresh state
    of its own (stepping donates the state)."""
    config = exp.config.copy_and_resolve_references()
    config.eval.update(eval_keys)
    return dataclasses.replace(exp, config=config, state=exp.fresh_state())


@functools.cache
def evaluated(modes: str) -> tuple[api.Experiment, Evaluator, EvalResult]:
    """The initial tiny policy evaluated greedily on bandit, or sampled (pass@K) on its OOD
    variant: two compiled programs (each costs a rollout compile), reused by the tests below."""
    envs = "bandit" if modes == "greedy" else "bandit_test"
    exp = _with_eval(tiny_experiment(), envs=envs, modes=modes, episodes=EPISODES, pass_k=K)
    evaluator = api.build_evaluator(exp)
    return exp, evaluator, evaluator.evaluate(exp.state.actor)


def test_metric_names():
    greedy, sampled = evaluated("greedy")[2].metrics, evaluated("sampled")[2].metrics
    assert set(greedy) == {f"val/bandit/greedy/{name}" for name in NAMES}
    assert set(sampled) == {f"val/bandit_test/sampled/{name}" for name in NAMES + (f"pass@{K}",)}
    assert all(np.isfinite(v) for v in [*greedy.values(), *sampled.values()])


def test_greedy_is_deterministic_and_independent_of_the_key():
    exp, evaluator, first = evaluated("greedy")
    again = evaluator.evaluate(exp.state.actor, envs=("bandit",))
    other = evaluator.evaluate(exp.state.actor, sample_key=jax.random.PRNGKey(123),
                               envs=("bandit",))
    for result in (again, other):
        np.testing.assert_array_equal(result.rollouts["bandit", "greedy"].tokens,
                                      first.rollouts["bandit", "greedy"].tokens)
        assert all(result.metrics[k] == first.metrics[k] for k in result.metrics)


def test_sampling_depends_on_the_sample_key_only():
    exp, evaluator, first = evaluated("sampled")
    again = evaluator.evaluate(exp.state.actor)
    other = evaluator.evaluate(exp.state.actor, sample_key=jax.random.PRNGKey(123))
    tokens = lambda r: np.asarray(r.rollouts["bandit_test", "sampled"].tokens)  # noqa: E731
    np.testing.assert_array_equal(tokens(again), tokens(first))
    assert not np.array_equal(tokens(other), tokens(first))


def test_the_first_states_alone_are_the_whole_evaluations_first_rows():
    """evaluate(states=n) (a samples-only step) rolls out the first n held-out states only, and
    each row as the whole evaluation does (per-row keys): its tokens are the first n * K rows."""
    exp, evaluator, first = evaluated("sampled")
    part = evaluator.evaluate(exp.state.actor, states=2)
    tokens = lambda r: np.asarray(r.rollouts["bandit_test", "sampled"].tokens)  # noqa: E731
    assert tokens(part).shape[0] == 2 * K
    np.testing.assert_array_equal(tokens(part), tokens(first)[: 2 * K])


def _training_reset_keys(run_key, steps: int, groups: int) -> set[tuple[int, ...]]:
    """The env.reset keys of training iterations 0..steps-1 (train/step.py, then jax_env.py)."""
    keys = set()
    for t in range(steps):
        rollout_key = jax.random.split(jax.random.fold_in(run_key, t))[0]
        reset_key = jax.random.split(rollout_key)[0]
        keys |= {tuple(k) for k in np.asarray(jax.random.split(reset_key, groups)).tolist()}
    return keys


def test_heldout_initial_states_are_not_training_ones_and_shared_by_modes_and_envs():
    exp, evaluator, _ = evaluated("greedy")
    heldout = {tuple(k) for k in np.asarray(evaluator.reset_keys).tolist()}
    assert len(heldout) == EPISODES
    assert not heldout & _training_reset_keys(exp.key, 20, exp.train.rollout.groups)
    # The conversations start from env.reset(reset_keys[g]) in every env and mode.
    for modes in ("greedy", "sampled"):
        _, evaluator, result = evaluated(modes)
        assert heldout == {tuple(k) for k in np.asarray(evaluator.reset_keys).tolist()}
        for (env_name, mode), out in result.rollouts.items():
            env = envs_jax.make(env_name)
            k = evaluator.group_sizes[mode]
            for g, key in enumerate(evaluator.reset_keys):
                text = format_conversation(exp.tokenizer, out, g * k)
                assert env.render_text(env.reset(key)[0]) in text, (env_name, mode, g)


def _random_rollout(rng: np.random.Generator, b: int, turns: int) -> Rollout:
    taken = np.cumsum(rng.random((b, turns)) < 0.7, axis=1) == np.arange(1, turns + 1)
    f32 = lambda shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    ints = lambda shape, high: rng.integers(0, high, shape).astype(np.int32)  # noqa: E731
    return Rollout(tokens=ints((b, 8), 50), lengths=ints(b, 8), prompt_lengths=ints(b, 4),
                   loss_mask=rng.random((b, 8)) < .5,
                   turn_ids=ints((b, 8), turns), behaviour_logp=f32((b, 8)),
                   behaviour_entropy=f32((b, 8)),
                   turn_rewards=f32((b, turns)) * taken, format_penalties=-0.1 * taken,
                   turn_taken=taken, format_ok=taken & (rng.random((b, turns)) < 0.6),
                   think_tokens=ints((b, turns), 9), reply_lengths=ints((b, turns), 20) * taken,
                   success=rng.random(b) < 0.3, num_actions=ints(b, 6),
                   effective_actions=ints(b, 6), dead_end=rng.random(b) < 0.2,
                   looped=rng.random(b) < 0.2)


def _reference_metrics(out: Rollout, k: int) -> dict[str, float]:
    o = jax.tree.map(np.asarray, out)
    taken = [(i, t) for i in range(o.success.size) for t in range(o.turn_taken.shape[1])
             if o.turn_taken[i, t]]
    per_turn = lambda field: sum(field[i, t] for i, t in taken) / max(len(taken), 1)  # noqa: E731
    groups = [o.success[g * k:(g + 1) * k] for g in range(o.success.size // k)]
    ref = {"success": sum(o.success) / o.success.size,
           "reward": sum(o.turn_rewards.sum(1)) / o.success.size,
           "num_turns": sum(o.turn_taken.sum(1)) / o.success.size,
           "num_actions": sum(o.num_actions) / o.success.size,
           "action_is_valid": per_turn(o.format_ok), "response_length": per_turn(o.reply_lengths),
           "states": o.success.size // k}
    if k > 1:
        ref[f"pass@{k}"] = sum(any(g) for g in groups) / len(groups)
    kinds = reference_failure(o.success, o.dead_end, o.looped, o.format_ok, o.turn_taken,
                              o.effective_actions)
    ref.update({f"failure/{kind}": kinds.count(kind) / len(kinds) for kind in FAILURE_KINDS})
    return ref


@pytest.mark.parametrize("groups, k, seed", [(5, 1, 0), (4, 3, 1), (6, 4, 2), (1, 8, 3)])
def test_eval_metrics_match_a_plain_python_count(groups, k, seed):
    out = _random_rollout(np.random.default_rng(seed), groups * k, turns=3)
    got = jax.device_get(eval_metrics(out, k))
    ref = _reference_metrics(out, k)
    assert set(got) == set(ref)
    for name, value in ref.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, err_msg=name)
    np.testing.assert_allclose(pass_at_k(out.success, 1), ref["success"], rtol=1e-6)


def test_pass_at_k_of_the_eval_rollouts():
    result = evaluated("sampled")[2]
    success = np.asarray(result.rollouts["bandit_test", "sampled"].success).tolist()
    assert len(success) == EPISODES * K
    groups = [success[g * K:(g + 1) * K] for g in range(EPISODES)]
    assert result.metrics[f"val/bandit_test/sampled/pass@{K}"] == pytest.approx(
        sum(any(g) for g in groups) / EPISODES)
    assert result.metrics["val/bandit_test/sampled/success"] == pytest.approx(
        sum(success) / len(success))


@pytest.mark.parametrize("modes, env, arm", [("greedy", "bandit", "Dragon"),
                                             ("sampled", "bandit_test", "Librarian")])
def test_format_conversation_shows_prompt_replies_and_outcome(modes, env, arm):
    exp, evaluator, result = evaluated(modes)
    out = result.rollouts[env, modes]
    host = jax.device_get(out)
    rows = host.tokens.shape[0]
    for row in range(rows):
        text = format_conversation(exp.tokenizer, out, row)
        mask = host.loss_mask[row]
        reply = exp.tokenizer.decode(host.tokens[row][mask].tolist(), skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)
        assert f"{REPLY_OPEN}{reply}{REPLY_CLOSE}" in text, "the sampled tokens, marked"
        assert "Choose between" in text and arm in text, "the env's observation"
        assert f"success {bool(host.success[row])}" in text.splitlines()[0]
        assert "[turn 1: reward " in text and ("format ok" in text or "format bad" in text)
    with pytest.raises(ValueError, match=rf"row {rows} is out of range; .* rows 0..{rows - 1}"):
        format_conversation(exp.tokenizer, out, rows)
    samples = evaluator.samples_text(result)
    shown = min(EPISODES, evaluator.config.samples)
    assert samples.count("=== row ") == len(result.rollouts) * shown
    assert f"##### {env} / {modes}: {shown} of {EPISODES} held-out initial states" in samples


@pytest.mark.parametrize("key, value, expected", [
    ("eval.envs", "bandit,sokobam", "config.eval.envs = 'bandit,sokobam' is invalid; valid: "
                                    "comma-separated names from"),
    ("eval.modes", "greedy,beam", "eval.modes = ('greedy', 'beam') is invalid"),
    ("eval.modes", "", "eval.modes = () is invalid"),
    ("eval.episodes", 0, "eval.episodes = 0 is invalid; valid: an int >= 1"),
    ("eval.pass_k", -1, "eval.pass_k = -1 is invalid; valid: an int >= 1"),
    ("eval.temperature", 0.0, "eval.temperature = 0.0 is invalid"),
    ("eval.seed", -1, "eval.seed = -1 is invalid; valid: None (the run's seed) or an int >= 0"),
    ("eval.batch", 0, "eval.batch = 0 is invalid; valid: None (the training rollout's rows per "
                      "chunk) or an int >= 1"),
    ("eval_every", -1, "config.eval_every = -1 is invalid; valid: an int >= 0 (0 = never)"),
    ("sample_every", -2, "config.sample_every = -2 is invalid; valid: an int >= 0"),
])
def test_bad_eval_config_is_rejected_naming_the_key(key, value, expected):
    config = tiny_config()
    config.update_from_flattened_dict({key: value})
    with pytest.raises(ValueError) as error:
        api.train_config(config)
    assert expected in str(error.value)


def test_eval_seed_gives_every_seed_that_seeds_heldout_states():
    """eval.seed = None: the run's own held-out states; a seed: that seed's run's (the default,
    the fixed val seed, is tests/test_validation_protocol.py's)."""
    exp = tiny_experiment()
    own = api.build_evaluator(_with_eval(exp, episodes=EPISODES, seed=None))
    other = reproduce_for_seed(exp, 1)
    other.config.eval.seed = None
    assert not np.array_equal(api.build_evaluator(other).reset_keys, own.reset_keys)
    fixed = api.build_evaluator(_with_eval(other, episodes=EPISODES, seed=exp.config.seed))
    np.testing.assert_array_equal(fixed.reset_keys, own.reset_keys)
    np.testing.assert_array_equal(fixed.sample_key, own.sample_key)


def reproduce_for_seed(exp: api.Experiment, seed: int) -> api.Experiment:
    """`exp` as api.build gives it for `seed` (keys from api.run_keys), eval.episodes EPISODES."""
    config = exp.config.copy_and_resolve_references()
    config.seed = seed
    config.eval.episodes = EPISODES
    init_key, key = api.run_keys(seed)
    return dataclasses.replace(exp, config=config, key=key, init_key=init_key)


@pytest.mark.parametrize("env, envs, expected", [
    ("bandit", "", ("bandit", "bandit_test")),
    ("sokoban", "", ("sokoban", "sokoban_large", "sokoban_new_vocab")),
    ("frozen_lake", "", ("frozen_lake",)),
    ("bandit", " bandit_test , bandit", ("bandit_test", "bandit")),
])
def test_eval_envs(env, envs, expected):
    config = api.config_for(env, "grpo")
    config.eval.envs = envs
    assert api.eval_config(config) == EvalConfig(envs=expected)


def _nudge(state, key):
    """Stands in for the compiled train step (runner.train's evaluation schedule is under test, not
    training): scales the float weights so that each checkpoint holds other parameters."""
    nudged = jax.tree.map(lambda x: (x * 1.01).astype(x.dtype)
                          if jnp.issubdtype(x.dtype, jnp.floating) else x, state.actor)
    return state.replace(actor=nudged, step=state.step + 1), {"train/success": jnp.float32(0)}


def _trained_workdir(tmp: Path, steps: int, **top) -> api.Experiment:
    # The training env object and eval shapes of evaluated("greedy"): its program is reused.
    exp = _with_eval(tiny_experiment(), envs="bandit", modes="greedy", episodes=EPISODES,
                     samples=1)
    exp = dataclasses.replace(exp, train_step=_nudge)
    exp.config.update(dict(steps=steps, **top))
    assert runner.train(exp, tmp) == steps
    return exp


def _jsonl(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_run_evaluates_every_k_steps_and_at_the_end_and_writes_samples(tmp_path):
    _trained_workdir(tmp_path, 3, eval_every=2, sample_every=1)
    rows = _jsonl(tmp_path)
    evaluated = [r["step"] for r in rows if "val/bandit/greedy/success" in r]
    assert evaluated == [0, 2, 3], "before training, every eval_every steps and after the last"
    assert all("timing/eval_seconds" in r for r in rows if r["step"] in evaluated)
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == [
        f"step_{s:06d}.txt" for s in (0, 1, 2, 3)]
    text = (tmp_path / "samples" / "step_000001.txt").read_text()
    assert text.startswith("##### bandit / greedy") and text.count("=== row ") == 1
    assert "val/bandit/greedy/success" not in rows[1], "a samples-only step logs no evaluation"


def test_evaluate_command_restores_a_checkpoint_prints_and_writes(tmp_path, capsys):
    exp = _trained_workdir(tmp_path, 2)
    config = run_config.evaluated_config(tmp_path, {"eval.samples": 2})
    assert api.train_config(config) == exp.train and api.eval_config(config) == dataclasses.replace(
        api.eval_config(exp.config), samples=2)
    # evaluate_workdir = run_config + api.build + evaluate_experiment; the experiment built here
    # already (same env object) reuses the compiled eval program.
    step, metrics = runner.evaluate_experiment(_with_eval(exp, samples=2), tmp_path)
    assert step == 2
    written = json.loads((tmp_path / "eval_step_2.json").read_text())
    assert written["step"] == 2 and written["eval"]["samples"] == 2
    assert written["eval"]["envs"] == ["bandit"] and written["eval"]["episodes"] == EPISODES
    assert written["metrics"] == metrics
    assert set(metrics) == {f"val/bandit/greedy/{name}" for name in NAMES}
    printed = capsys.readouterr().out
    assert "step 2" in printed and "bandit  greedy" in printed and "success" in printed
    assert (tmp_path / "samples" / "eval_step_000002.txt").read_text().count("=== row ") == 2
    assert metrics == api.build_evaluator(exp).evaluate(exp.state.actor).metrics, "step 2's"
    with pytest.raises(ValueError, match=r"no checkpoint of step 7; saved steps: \[1, 2\]"):
        runner.evaluate_experiment(exp, tmp_path, step=7)
    with pytest.raises(ValueError, match=r"only eval.\* keys .*\['seed'\]"):
        run_config.evaluated_config(tmp_path, {"seed": 3})
    with pytest.raises(FileNotFoundError, match="expected the --workdir of a run"):
        runner.evaluate_workdir(tmp_path / "nothing")


def test_evaluate_command_line_names_mistakes(tmp_path):
    for args, message in [
        (["--config.eval.episods=3"], "error: unknown --config override key: 'eval.episods'"),
        ([], f"error: {tmp_path / 'config.json'} does not exist"),
    ]:
        done = subprocess.run([sys.executable, str(ROOT / "experiments" / "evaluate.py"),
                               "--workdir", str(tmp_path), *args],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and message in done.stderr, done.stderr[-2000:]


@pytest.mark.slow  # ~2-5 min: two scripted policies compiled on FrozenLake
def test_evaluate_a_scripted_policy_on_a_runs_held_out_states(tmp_path):
    """evaluate.py --policy: the solver wins every non-slippery lake the random policy mostly
    loses, on the run's own held-out states, without a checkpoint; bad input names itself."""
    from starpo_jax.run import loop as runner
    from helpers.tiny import tiny_config

    config = tiny_config()
    config.env.name = "frozen_lake"
    config.env.kwargs = {"success_rate": 1.0}  # not slippery: the solver's path always works
    config.rollout.update(max_turns=None, max_actions_per_turn=None, max_actions_per_traj=None,
                          reply_tokens=24)  # room for the scripted replies
    config.eval.update(episodes=32, modes="greedy,sampled")
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    solver = runner.evaluate_policy_workdir(tmp_path, "solver")
    random = runner.evaluate_policy_workdir(tmp_path, "random")
    assert solver["val/frozen_lake/greedy/success"] == 1.0
    assert solver["val/frozen_lake/sampled/success"] == 1.0  # a script has no temperature
    assert random["val/frozen_lake/greedy/success"] < 0.5
    written = json.loads((tmp_path / "eval_policy_random.json").read_text())
    assert written["policy"] == "random" and written["metrics"] == random
    assert written["eval"]["episodes"] == 32
    assert not (tmp_path / "checkpoints").exists()
    with pytest.raises(ValueError, match=r"--policy 'oracle' is invalid; valid: one of"):
        runner.evaluate_policy_workdir(tmp_path, "oracle")


def test_metric_keys_spell_a_url_env_without_slashes():
    """val/<env>/<mode>/<metric> splits on "/": a server's URL is spelt without its scheme and
    with "_" for its other slashes; other names are kept as they are."""
    from starpo_jax.run.evaluation import metric_env, summary_table

    assert metric_env("openenv:http://127.0.0.1:8000") == "openenv:127.0.0.1:8000"
    assert metric_env("openenv:https://host/a/b") == "openenv:host_a_b"
    assert metric_env("textarena:Wordle-v0") == "textarena:Wordle-v0"
    key = f"val/{metric_env('openenv:http://h:1/x')}/greedy/success"
    assert key.split("/") == ["val", "openenv:h:1_x", "greedy", "success"]
    assert summary_table({key: 0.5}).splitlines()[1].split()[:3] == ["openenv:h:1_x", "greedy",
                                                                    "0.500"]
