"""The functional API: configs are checked (keys and values named) before anything loads, the
switches map onto TrainConfig, every shipped config file is valid, and a built experiment steps
deterministically with the metric names users rely on."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import envs_jax  # noqa: E402
from starpo_jax import api  # noqa: E402
from starpo_jax.config import FilterConfig, LossConfig, RolloutConfig, TrainConfig  # noqa: E402
from helpers.tiny import ISSUE_METRICS, tiny_config, tiny_experiment  # noqa: E402

CONFIG_DIR = Path(__file__).resolve().parents[1] / "experiments" / "configs"
def _with(path: str, value):
    config = tiny_config().to_dict()
    *sections, key = path.split(".")
    target = config
    for name in sections:
        target = target[name]
    target[key] = value
    return config


@pytest.mark.parametrize("path, value, expected", [
    ("loss.clip_hgh", 0.3, "unknown config key 'loss.clip_hgh' (did you mean 'loss.clip_high'?)"),
    ("rolout", {}, "unknown config key 'rolout' (did you mean 'rollout'?)"),
    ("rollout.groups", 0, "rollout.groups = 0 is invalid; valid: an int >= 1"),
    ("filter.keep_ratio", 1.5, "filter.keep_ratio = 1.5 is invalid; valid: a number in (0.0, 1.0]"),
    ("algo", "dpo", "config.algo = 'dpo' is invalid; valid: one of ('ppo', 'grpo')"),
    ("env.name", "sokobam", "config.env.name = 'sokobam' is invalid; valid: one of ("),
    ("model.dtype", "float16", "config.model.dtype = 'float16' is invalid"),
    ("steps", 0, "config.steps = 0 is invalid; valid: an int >= 1"),
    ("eval_every", -1, "config.eval_every = -1 is invalid; valid: an int >= 0"),
    ("progress_after", -5, "config.progress_after = -5 is invalid; valid: an int >= 0"),
    ("loss.clip_low", "big", "config.loss.clip_low = 'big' is invalid; valid: a number"),
    ("filter.strategy", "top_q", "filter.strategy = 'top_q' is invalid; valid: one of ('top_k',"),
    ("filter.max_groups", 0, "filter.max_groups = 0 is invalid; valid: an int >= 1"),
    ("loss.agg", "sum", "loss.agg = 'sum' is invalid; valid: one of ('token_mean', "),
])
def test_bad_config_is_rejected_naming_the_key(path, value, expected):
    with pytest.raises(ValueError) as error:
        api.train_config(_with(path, value))
    assert expected in str(error.value)


def test_filter_and_aggregation_options_reach_the_train_config():
    config = tiny_config()
    config.filter.update(strategy="top_p", top_p=0.8, top_p_weights="softmax",
                         include_zero=False, max_groups=1)
    config.loss.agg = "seq_mean_token_sum_norm"
    train = api.train_config(config)
    assert train.filter == FilterConfig(strategy="top_p", top_p=0.8, top_p_weights="softmax",
                                        include_zero=False, max_groups=1)
    assert train.kept_groups == 1 and train.loss.agg == "seq_mean_token_sum_norm"
    assert api.train_config(_with("filter.max_groups", None)).filter.max_groups is None


@pytest.mark.parametrize("vanilla, nothink, keep, kl, clip, mode", [
    (False, False, 0.25, 0.0, (0.2, 0.28), "think"),
    (True, False, 1.0, 0.001, (0.2, 0.2), "think"),
    (False, True, 0.25, 0.0, (0.2, 0.28), "nothink"),
    (True, True, 1.0, 0.001, (0.2, 0.2), "nothink"),
])
def test_switches(vanilla, nothink, keep, kl, clip, mode):
    c = api.config_for("sokoban", "ppo")
    c.vanilla, c.nothink = vanilla, nothink
    t = api.train_config(c)
    clips = (t.loss.clip_low, t.loss.clip_high)
    assert (t.filter.keep_ratio, t.loss.kl_coef, clips) == (keep, kl, clip)
    assert t.rollout.mode == mode


def test_the_schema_defaults_are_the_dataclasses_but_the_keys_resolved_later():
    from starpo_jax.run.schema import RESOLVED_LATER, SECTIONS

    schema, differ = api.default_config(), {}
    for section, kind in SECTIONS.items():
        for field in dataclasses.fields(kind):
            if field.name in schema[section]:
                default = field.default_factory() if field.default is dataclasses.MISSING \
                    else field.default
                if schema[section][field.name] != default:
                    differ[f"{section}.{field.name}"] = schema[section][field.name]
    assert set(differ) == set(RESOLVED_LATER) and set(differ.values()) == {None}
    assert len(RESOLVED_LATER) == 8  # 4 env settings, 4 memory knobs
    grid = envs_jax.EnvSettings()  # what RolloutConfig's defaults stand for: the grid games'
    assert all(getattr(RolloutConfig(), key) == getattr(grid, key) for key in api.ENV_SETTINGS)


@pytest.mark.parametrize("key, value", [("loss.kl_coef", 0.01), ("loss.clip_low", 0.1),
                                        ("loss.clip_high", 0.28 + 0.02),
                                        ("filter.keep_ratio", 0.5), ("filter.strategy", "top_p"),
                                        ("filter.max_groups", 2),
                                        ("filter.loss_scaling", "linear")])
def test_vanilla_refuses_an_explicit_key_it_would_override(key, value):
    config = _with(key, value)
    config["vanilla"] = True
    with pytest.raises(ValueError) as error:
        api.check_config(config)
    text = str(error.value)
    assert "\n" not in text and f"{key} = {value!r}" in text
    assert "vanilla sets loss.kl_coef = 0.001, loss.clip_low = 0.2, loss.clip_high = 0.2" in text
    config["vanilla"] = False  # the key is fine without the switch
    api.check_config(config)


def test_vanilla_accepts_keys_at_their_default_or_at_vanillas_value():
    config = _with("loss.kl_coef", 0.0)  # the schema's default, written out
    config["vanilla"] = True
    config["loss"].update(clip_high=0.2, clip_low=0.2)  # what vanilla sets anyway
    config["filter"].update(keep_ratio=1.0, strategy="top_k")
    train = api.train_config(config)
    assert (train.loss.kl_coef, train.loss.clip_high, train.filter) == (
        0.001, 0.2, FilterConfig(keep_ratio=1.0))
    from starpo_jax.run.schema import vanilla_values
    assert vanilla_values()["filter.keep_ratio"] == 1.0


def test_a_vanilla_runs_config_json_reads_back_and_resumes(tmp_path):
    from starpo_jax.run.workdir import check_config

    config = tiny_config()
    config.vanilla = True
    saved = api.merged_config(config)  # what run/loop.py writes as config.json
    (tmp_path / "config.json").write_text(saved.to_json())
    again, _ = api.read_run_config(tmp_path)
    assert again.vanilla and again.loss.kl_coef == 0.0  # the switch is stored, not its values
    assert api.train_config(again).loss.kl_coef == 0.001
    check_config(tmp_path / "config.json", saved.to_dict(), True, (), has_checkpoints=True,
                 defaults=api.default_config().to_dict())


@pytest.mark.parametrize("env", ["bandit", "sokoban", "frozen_lake"])
@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_shipped_config_files_are_the_papers_setting(env, algo):
    spec = importlib.util.spec_from_file_location("cfg", CONFIG_DIR / f"{env}_{algo}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    train = api.train_config(config)
    assert (config.env.name, train.algo) == (env, algo)
    assert config.model.source == "smollm2-135m-instruct"
    # The paper's setting (RAGEN_FACTS "Training defaults"), StarPO-S, nothing scaled down.
    r, o, loss = train.rollout, train.optim, train.loss
    assert (r.groups, r.group_size, r.mode, r.reply_tokens, r.temperature) == (
        8, 16, "think", 400, 1.0)
    assert (r.max_turns, r.max_actions_per_traj) == ((1, 1) if env == "bandit" else (5, 10))
    assert (train.filter.keep_ratio, loss.kl_coef, loss.clip_low, loss.clip_high) == (
        0.25, 0.0, 0.2, 0.28)
    assert (loss.dual_clip, loss.entropy_coef, loss.agg) == (3.0, 0.001, "token_mean")
    assert (o.actor_lr, o.critic_lr, o.minibatch_rows, o.ppo_epochs, o.rollout_reuse,
            o.max_grad_norm) == (1e-6, 1e-5, 32, 1, 1, 1.0)
    assert train.estimator == ("gae" if algo == "ppo" else "grpo")
    assert (train.advantage.gamma, train.advantage.lam) == (1.0, 1.0)
    # RAGEN's validation protocol (base.yaml): 512 states of seed.val 123, sampled at 0.5, one
    # rollout each, before training and every 10 steps; greedy second.
    assert (config.steps, config.eval_every, config.val_before_train, config.eval.episodes,
            config.eval.seed, config.eval.modes, config.eval.pass_k, config.eval.temperature) == (
        200, 10, True, 512, 123, "sampled,greedy", 1, 0.5)


def test_readme_main_command_names_a_valid_config():
    """The quickstart's first command (README) points at a config file that validates:
    StarPO-S with the embedded model, sized for a CPU."""
    readme = (CONFIG_DIR.parents[1] / "README.md").read_text()
    name = readme.split("python experiments/run.py --config ", 1)[1].split()[0]
    spec = importlib.util.spec_from_file_location("cfg", CONFIG_DIR / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    train = api.train_config(config)
    assert config.model.source == "smollm2-135m-instruct"
    assert train.filter.keep_ratio < 1 and train.loss.kl_coef == 0, "StarPO-S"
    assert train.rollout.groups * train.rollout.group_size <= 32 and config.steps <= 20


# The original's per-env settings (config/envs.yaml, base.yaml, _1_bandit.yaml): turns,
# actions per turn, actions per trajectory, the announced "Max response length".
ENV_DEFAULTS = {"bandit": (1, 1, 1, 100), "bandit_test": (1, 1, 1, 100),
                "sokoban": (5, 5, 10, 100), "sokoban_new_vocab": (5, 5, 10, 100),
                "sokoban_large": (5, 5, 10, 100), "frozen_lake": (5, 5, 10, 100)}
ENV_KEYS = ("max_turns", "max_actions_per_turn", "max_actions_per_traj", "announced_tokens")


@pytest.mark.parametrize("env", sorted(ENV_DEFAULTS))
def test_env_settings_reach_the_train_config(env):
    c = api.config_for(env, "grpo")
    assert all(c.rollout[key] is None for key in ENV_KEYS), "unset: the env's"
    r = api.train_config(c).rollout
    assert tuple(getattr(r, key) for key in ENV_KEYS) == ENV_DEFAULTS[env]
    assert r.reply_tokens == c.rollout.reply_tokens, "the budget is not the announced count"


@pytest.mark.parametrize("key", ENV_KEYS)
def test_explicit_env_setting_wins(key):
    bandit = api.train_config(api.config_for("bandit", "grpo", **{key: 7})).rollout
    sokoban = api.train_config(_with(f"rollout.{key}", 3) | {"env": {"name": "sokoban"}}).rollout
    assert getattr(bandit, key) == 7 and getattr(sokoban, key) == 3
    others = [k for k in ENV_KEYS if k != key]
    assert [getattr(bandit, k) for k in others] == [1 if k != "announced_tokens" else 100
                                                     for k in others]


@pytest.mark.parametrize("key, value, expected", [
    ("max_turns", 0, "rollout.max_turns = 0 is invalid; valid: an int >= 1"),
    ("max_actions_per_traj", -2, "rollout.max_actions_per_traj = -2 is invalid"),
    ("announced_tokens", "many", "rollout.announced_tokens = 'many' is invalid; valid: an int"),
    ("max_actions_per_turn", 1.5, "max_actions_per_turn"),
])
def test_bad_env_setting_names_the_key(key, value, expected):
    with pytest.raises(ValueError) as error:
        api.train_config(_with(f"rollout.{key}", value))
    assert expected in str(error.value)


def test_codec_announces_the_env_setting_not_the_budget():
    """api's codec states announced_tokens as the "Max response length" and the trajectory's
    action budget in "You can make up to N actions"; reply_tokens stays the budget."""
    import envs_jax
    from helpers.text_testing import smollm2_tokenizer
    from starpo_jax.run import experiment

    c = api.config_for("frozen_lake", "grpo", reply_tokens=9, max_actions_per_traj=8)
    c.prompt.verify = 1
    train = api.train_config(c)
    env = envs_jax.make("frozen_lake")
    codec = experiment._codec(api.merged_config(c), train, smollm2_tokenizer(), env)
    assert "Max response length: {max_tokens} words" in codec.template.turn
    ids, n = codec.first_prompt(env.render_symbols(env.reset(jax.random.PRNGKey(0))[0]), 8)
    text = smollm2_tokenizer().decode(np.asarray(ids)[: int(n)].tolist())
    assert "Max response length: 100 words (tokens)." in text
    assert "You can make up to 8 actions" in text and "You have 8 actions left" in text


def test_train_config_round_trip():
    train = TrainConfig(algo="ppo", rollout=RolloutConfig(groups=3, group_size=2, mode="nothink"),
                        loss=LossConfig(dual_clip=None, kl_coef=0.05))
    config = api.config_from_train_config(train, steps=7, model={"source": "tiny-random"})
    assert api.train_config(config) == train
    assert (config.steps, config.model.source) == (7, "tiny-random")


def _has_host_callbacks(exp) -> bool:
    """Whether exp's compiled step calls back into Python (what JAX's persistent compilation
    cache never keeps)."""
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (exp.state, exp.key))
    return "callback" in exp.train_step.lower(*shapes).as_text()  # shapes: a donated state too


def test_phase_marks_only_where_a_step_may_run_long():
    """Marks (host callbacks) go into a step only when autofit's time model puts it at a
    quarter of progress_after or more, or cannot say; never with progress_after = 0."""
    from starpo_jax.run.experiment import PROGRESS_MARGIN, _phase_clock

    train = api.train_config(tiny_config())
    edge = PROGRESS_MARGIN * 60
    assert _phase_clock(60, 5, train, None, estimate=edge * 0.99) is None
    assert _phase_clock(60, 5, train, None, estimate=edge).after == 60
    assert _phase_clock(60, 5, train, None, estimate=None).after == 60  # no model: marks
    assert _phase_clock(0, 5, train, None, estimate=1e9) is None
    exp = tiny_experiment()  # a tiny step: milliseconds by the model
    assert exp.estimated_step_seconds() < edge
    assert exp.progress is None and not _has_host_callbacks(exp)


def test_long_step_prints_its_phases(capsys, monkeypatch):
    """A step past progress_after seconds says where it is at each phase's end; a shorter one
    prints nothing."""
    from starpo_jax.run import announce, experiment

    monkeypatch.setattr(experiment, "PROGRESS_MARGIN", 0.0)  # marks even in a tiny step
    monkeypatch.setattr(announce.LOGGER, "disabled", True)  # no "loading model ..." lines
    exp = api.build(tiny_config())
    assert exp.progress is not None and _has_host_callbacks(exp)
    exp.progress.after = 1e9  # no step is that long
    exp.step()
    assert capsys.readouterr().out == ""
    exp.progress.after = 0.0  # every step is long enough
    exp.step()
    lines = capsys.readouterr().out.splitlines()
    total = tiny_config().steps
    assert [line.split(" done at ")[0] for line in lines] == [
        f"  step 2/{total}: rollout", f"  step 2/{total}: old_logprobs",
        f"  step 2/{total}: update"]
    assert all(re.fullmatch(r".* done at \d+m\d\ds", line) for line in lines), lines


def test_step_metrics_and_determinism():
    exp = tiny_experiment()
    runs = []
    for _ in range(2):
        exp.state = exp.fresh_state()
        runs.append([exp.step() for _ in range(2)])
    assert runs[0] == runs[1], "same config and seed must give the same numbers"
    first, second = runs[0]
    assert exp.steps_done == 2
    assert set(ISSUE_METRICS) <= set(first)
    assert all(isinstance(v, float) and np.isfinite(v) for v in first.values())
    assert first != second, "step 2 must use its own key (fold_in of the step counter)"
    other_key = exp.step(jax.random.PRNGKey(123))
    assert exp.steps_done == 3 and set(other_key) == set(first)
    assert exp.train == api.train_config(tiny_config())
