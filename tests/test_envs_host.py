"""Host envs without a model: the pool (parallel, hung / crashing instances, bad values), the
WebShop adapter on a small catalogue, and the reasoning-gym adapter."""

from __future__ import annotations

import math
import os
import time

import pytest

import envs_host
from envs_host import EnvPool, HostEnv, HostEnvError, PoolConfig
from envs_host.webshop import WebShopEnv, parse_action
from webshop_catalogue import CatalogueTextEnv


class Scripted(HostEnv):
    """Seed s: observation "s=<s>"; a step's action decides what happens (for the pool)."""

    instructions = "test"

    def reset(self, seed: int) -> str:
        self.seed = seed
        return f"s={seed}"

    def step(self, action: str):
        if action == "hang":
            time.sleep(60)
        if action == "crash":
            raise RuntimeError("boom")
        if action == "die":
            os._exit(3)
        if action == "not-a-string":
            return 42, 0.0, False, {"success": False}
        if action == "nan":
            return "x", math.nan, False, {"success": False}
        if action == "no-success":
            return "x", 1.0, False, {}
        return f"{self.seed}:{action}", float(len(action)), action == "end", {"success": True}


@pytest.mark.parametrize("processes", [False, True])
def test_pool_fails_hung_and_crashing_rows_and_goes_on(processes):
    pool = EnvPool("scripted", Scripted, rows=3,
                   config=PoolConfig(workers=3, processes=processes, timeout=1.0))
    try:
        assert pool.reset([10, 11, 12]) == ["s=10", "s=11", "s=12"]
        start = time.monotonic()
        bad = "die" if processes else "crash"
        out = pool.step({0: "hang", 1: bad, 2: "go"})
        assert time.monotonic() - start < 20  # the hung call was abandoned, not waited for
        assert out[0] is None and out[1] is None
        assert out[2] == ("12:go", 2.0, False, {"success": True})
        reasons = {f.row: (f.seed, f.reason) for f in pool.failures}
        assert reasons[0][0] == 10 and "timed out after 1 s" in reasons[0][1]
        assert reasons[1][0] == 11 and ("boom" in reasons[1][1] or "exit code 3" in reasons[1][1])
        assert any(str(f).startswith("env 'scripted' row 0 (seed 10): step('hang') timed out")
                   for f in pool.failures)
        # Replaced instances work again after the next reset; failures start afresh.
        assert pool.reset([20, 21, 22]) == ["s=20", "s=21", "s=22"]
        assert pool.failures == []
        assert pool.step({0: "end", 1: "go"}) == {0: ("20:end", 3.0, True, {"success": True}),
                                                   1: ("21:go", 2.0, False, {"success": True})}
    finally:
        pool.close()


@pytest.mark.parametrize("action, message", [
    ("not-a-string", r"env 'scripted' \(seed 5\) returned an observation of type int: 42"),
    ("nan", r"env 'scripted' \(seed 5, action 'nan'\): reward nan is not a finite number"),
    ("no-success", r"info must be a dict with a 'success' key"),
])
def test_pool_rejects_values_that_break_the_protocol(action, message):
    pool = EnvPool("scripted", Scripted, rows=1, config=PoolConfig(workers=1))
    pool.reset([5])
    with pytest.raises(HostEnvError, match=message):
        pool.step({0: action})
    pool.close()


def test_pool_config_rejects_bad_values():
    with pytest.raises(ValueError, match="host.timeout = 0 is invalid"):
        PoolConfig(timeout=0)
    with pytest.raises(ValueError, match="host.workers = 0 is invalid"):
        PoolConfig(workers=0)


def test_registry_names_and_unknown_name():
    assert {"webshop", "rg_chain_sum", "rg_countdown"} <= set(envs_host.names())
    with pytest.raises(ValueError, match="unknown host environment 'nope'; registered: .*webshop"):
        envs_host.make("nope")


def _shop() -> WebShopEnv:
    return WebShopEnv(text_env_factory=CatalogueTextEnv)


def test_webshop_adapter_episode_buys_at_the_goal():
    env = _shop()
    seed = next(s for s in range(10) if env.goal_index(s) == 0)  # the cotton-shirt goal
    obs = env.reset(seed)
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] i need a cotton shirt")
    assert obs.endswith("You must choose from these actions:search[<content>].")
    obs, reward, done, info = env.step("search[cotton shirt]")
    assert (reward, done, info["action_is_valid"], info["action_is_effective"]) == \
        (0.0, False, True, True)
    assert "Page 1 (Total results: 3)" in obs and "click[b000shirt1]" in obs
    assert "search[<content>]" not in obs  # no search bar on a results page
    # An action the page does not offer: invalid, nothing changes.
    same, reward, done, info = env.step("click[b000mug001]")
    assert same == obs and not info["action_is_valid"] and not info["action_is_effective"]
    env.step("click[B000SHIRT1]")  # clickables are matched lower-cased
    _, _, _, info = env.step("click[large]")
    assert info["action_is_valid"]
    obs, reward, done, info = env.step("click[buy now]")
    assert (reward, done, info["success"], info["raw_reward"]) == (1.0, True, True, 1.0)


def test_webshop_adapter_partial_match_scores_zero_with_its_raw_score():
    env = _shop()
    env.reset(next(s for s in range(10) if env.goal_index(s) == 0))
    env.step("search[shirt]")
    env.step("click[b000shirt3]")  # cotton, but too expensive and no size large
    _, reward, done, info = env.step("click[buy now]")
    assert (reward, done, info["success"]) == (0.0, True, False)
    assert info["raw_reward"] == pytest.approx(1 / 3)


def test_webshop_seeds_cover_the_catalogue_and_the_last_page_hides_next():
    env = _shop()
    assert {env.goal_index(s) for s in range(10)} == {0, 1}
    assert env.goal_index(3) == env.goal_index(3)
    env.reset(0)
    env.step("search[shirt mug coffee cotton]")  # 4 results: pages of 3, 1, then none
    env.step("click[next >]")
    assert "click[next >]" in env.available_actions()
    env.step("click[next >]")  # past the results: the original hides "next >"
    assert env.available_actions() == ["click[back to search]", "click[< prev]"]
    assert parse_action(" Click[ Buy Now ] ") == ("click", "buy now")
    assert parse_action("buy") == ("buy", None)


def test_reasoning_gym_adapter_scores_with_the_dataset():
    pytest.importorskip("reasoning_gym")
    env = envs_host.make("rg_chain_sum")
    question = env.reset(3)
    assert question == envs_host.make("rg_chain_sum").reset(3)  # same seed, same question
    # The question is "... a - b + c =": Python's arithmetic is the reference answer.
    expression = question.rsplit(":", 1)[-1].strip().rstrip("=").strip()
    answer = str(eval(expression, {"__builtins__": {}}))  # noqa: S307  (digits and + - only)
    assert env.step(answer) == ("Correct.", 1.0, True, {"success": True, "action_is_valid": True,
                                                       "action_is_effective": True})
    env.reset(3)
    obs, reward, done, info = env.step("no idea")
    assert (obs, reward, done, info["success"]) == ("Incorrect.", 0.0, True, False)


class OneGuess(Scripted):
    settings = envs_host.EnvSettings(max_turns=1, max_actions_per_traj=3)


class OldStyle(Scripted):
    defaults = {"max_turns": 1}  # the dict host envs declared before EnvSettings


def test_a_host_env_s_settings_fill_the_rollout_keys_left_unset():
    from starpo_jax.run import schema

    envs_host.register("settings_one_guess", OneGuess)
    envs_host.register("settings_old_style", OldStyle)
    c = schema.config_for("settings_one_guess", "grpo", groups=2, group_size=2)
    c.model.source = "tiny-random"
    rollout = schema.train_config(c).rollout
    assert (rollout.max_turns, rollout.max_actions_per_turn, rollout.max_actions_per_traj,
            rollout.announced_tokens) == (1, 5, 3, 100)  # the rest: EnvSettings' defaults
    c.rollout.max_turns = 2  # a key the config sets wins
    assert schema.train_config(c).rollout.max_turns == 2
    assert schema.host_env_settings("settings_one_guess") is OneGuess.settings
    c.env.name = "settings_old_style"
    with pytest.raises(ValueError, match=r"^host env 'settings_old_style' \(.*OldStyle\) sets "
                                         r"`defaults`, which is no longer read; valid: "):
        schema.check_config(c)


class Tagged(HostEnv):
    """A namespaced env: its name's rest is `tag`."""

    def __init__(self, tag: str, suffix: str = ""):
        self.tag, self.suffix = tag, suffix

    def reset(self, seed: int) -> str:
        return f"{self.tag}{self.suffix}:{seed}"

    def step(self, action: str):
        return action, 0.0, True, {"success": False}


def test_a_namespace_names_a_family_of_envs_by_prefix():
    envs_host.register_namespace("tagged_test", Tagged, "tag", suffix="!")
    assert "tagged_test:<tag>" in envs_host.namespaces()
    assert not envs_host.known("tagged_test:") and not envs_host.known("other:x")
    assert envs_host.known("tagged_test:a:b")  # the rest is everything after the first colon
    assert "tagged_test:a:b" in envs_host.names()
    assert envs_host.make("tagged_test:a:b").reset(3) == "a:b!:3"
    assert envs_host.make("tagged_test:q", suffix="?").reset(1) == "q?:1"
    with pytest.raises(ValueError, match="namespace 'tagged_test' is invalid or already"):
        envs_host.register_namespace("tagged_test", Tagged, "tag")
    with pytest.raises(ValueError, match="'tagged_test:z' is in namespace 'tagged_test'"):
        envs_host.register("tagged_test:z", Tagged)
    with pytest.raises(ValueError, match=r"unknown host environment 'nope:x'.*tagged_test:<tag>"):
        envs_host.make("nope:x")


def test_env_kwargs_reach_the_constructor_and_bad_ones_name_themselves():
    from starpo_jax.run.schema import default_config, make_env, merged_config

    config = default_config()
    config.env.name = "frozen_lake"
    config.env.kwargs = {"success_rate": 1.0}
    full = merged_config(config)
    assert make_env(full).success_rate == 1.0
    config.env.kwargs = {"no_such_knob": 3}
    with pytest.raises(ValueError, match=r"config.env.kwargs = \{'no_such_knob': 3\} is invalid "
                                         r"for env 'frozen_lake'"):
        make_env(merged_config(config))
    with pytest.raises(ValueError, match=r"config.env.kwargs = \['a'\] is invalid; valid: a dict"):
        merged_config({"env": {"name": "frozen_lake", "kwargs": ["a"]}})
