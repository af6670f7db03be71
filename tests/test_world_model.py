"""World-model replies (SPA): demonstrations checked against a host replay of the env and the
port of RAGEN's coordinate renderer (tests/helpers/ragen_coords.py), the probe of sampled
replies against SPA's regex rule on hand-made replies, the prediction reward, the SFT checks."""

from __future__ import annotations

import dataclasses
import functools
import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import envs_jax  # noqa: E402
from envs_jax.frozen_lake.env import FrozenLake  # noqa: E402
from helpers import ragen_coords as ref  # noqa: E402
from starpo_jax.config import RolloutConfig  # noqa: E402
from starpo_jax.rollout import world_model as wm  # noqa: E402
from starpo_jax.rollout.demonstrations import demonstrate  # noqa: E402
from starpo_jax.rollout.jax_env import group_states  # noqa: E402
from starpo_jax.rollout.policies import make_policy  # noqa: E402
from starpo_jax.run import sft  # noqa: E402
from starpo_jax.run.evaluation import eval_metrics  # noqa: E402
from starpo_jax.text import build_codec  # noqa: E402

REWARD = 0.5  # rollout.prediction_reward in the demonstrations below
SPA = re.compile(r"<think> <observation>(.*?)</observation> I will move (.*?)\. "
                 r"<prediction>(.*?)</prediction></think><answer>(.*?)</answer>", re.DOTALL)


def reference_lines(env, state) -> str:
    """RAGEN's coordinate lines without the header, from the port, for one host state."""
    s = jax.device_get(state)
    if isinstance(env, FrozenLake):
        desc = ref.frozen_lake_desc(s.tiles, s.start)
        return ref.without_header(ref.frozen_lake_lines(desc, tuple(int(x) for x in s.player)))
    fixed, room = ref.sokoban_arrays(s.walls, s.targets, s.boxes, s.player)
    return ref.without_header(ref.sokoban_lines(room, fixed))


@functools.cache
def _setup(name: str):
    from helpers.text_testing import smollm2_tokenizer

    tok = smollm2_tokenizer()
    env = envs_jax.make(name)
    codec = build_codec(tok, env, mode="think", verify=20)
    encoder = wm.build_world_model_encoder(tok, env, codec, max_actions_per_turn=2, verify=50)
    return env, tok, codec, encoder


@functools.cache
def _demos(name: str, budget: int):
    env, tok, codec, encoder = _setup(name)
    config = RolloutConfig(groups=4, group_size=2, max_turns=3, mode="think",
                           reply_tokens=wm.longest_reply(env, encoder, 2), max_actions_per_turn=2,
                           max_actions_per_traj=budget, world_model=True,
                           prediction_reward=REWARD)
    policy = make_policy("random", env, max_actions_per_turn=2, max_turns=3,
                         max_actions_per_traj=budget)
    run = jax.jit(lambda k: demonstrate(env, codec, config, policy, encoder, k,
                                        eos_id=tok.eos_token_id, pad_id=tok.pad_token_id))
    return jax.device_get(run(jax.random.PRNGKey(0))), config


@pytest.mark.parametrize("name", ["coord_sokoban",
                                  pytest.param("coord_frozen_lake", marks=pytest.mark.slow)])
def test_demonstrations_match_a_host_replay_of_the_env(name):
    """Each reply's <observation> is RAGEN's coordinate render of the turn's state, its
    <prediction> that of the state after the answer's actions replayed on the host env (in
    order, up to the episode's end and the action budget: 5 actions, so turn 3 is cut to one),
    the plan equals the answer, the tokens are the tokenizer's own, the probe says right on
    every taken turn, and each taken turn's reward holds the prediction reward."""
    env, tok, codec, _ = _setup(name)
    out, config = _demos(name, 5)
    reset_keys = jax.random.split(jax.random.split(jax.random.PRNGKey(0))[0], config.groups)
    states = group_states(jax.vmap(env.reset)(reset_keys)[0], config.group_size)
    step = jax.jit(env.step)
    cut_turns = 0
    for b in range(config.groups * config.group_size):
        state = jax.tree.map(lambda x: x[b], states)
        taken, ended = 0, False
        for k in range(config.max_turns):
            if not out.turn_taken[b, k]:
                assert ended or taken >= config.max_actions_per_traj
                continue
            ids = out.tokens[b][(out.turn_ids[b] == k) & out.loss_mask[b]].tolist()
            assert ids[-1] == tok.eos_token_id
            text = "<think>" + tok.decode(ids[:-1])
            assert list(codec.forced_prefix_ids) + ids[:-1] == tok.encode(
                text, add_special_tokens=False)
            match = SPA.fullmatch(text)
            assert match, text
            seen, plan, foreseen, answer = match.groups()
            assert plan == answer
            assert seen == reference_lines(env, state)
            rewards = 0.0
            names = answer.split(" || ")
            for word in names:
                if ended or taken >= config.max_actions_per_traj:
                    cut_turns += 1
                    break
                state, ts = step(state, jnp.int32(env.action_names.index(word)))
                taken, ended, rewards = taken + 1, bool(ts.last()), rewards + float(ts.reward)
            assert foreseen == reference_lines(env, state), (b, k)
            np.testing.assert_allclose(out.turn_rewards[b, k], rewards + REWARD, atol=1e-5)
        assert int(out.num_actions[b]) == taken
    if name == "coord_sokoban":  # (lake episodes end in holes before the budget binds)
        assert cut_turns > 0  # the budget cut some turn short: its prediction is the cut one's
    taken = out.turn_taken
    assert (out.observation_ok == taken).all() and (out.prediction_ok == taken).all()
    metrics = jax.device_get(eval_metrics(out, 1))
    assert metrics["observation_acc"] == metrics["prediction_acc"] == 1.0


def _spa_reference(text: str, now: str, after: str) -> tuple[bool, bool]:
    """SPA's reading (ctx_manager): the first observation block, the first prediction block
    after it (anywhere without one), each .strip()-ed and compared with the truth."""
    seen = re.search(r"<observation>(.*?)</observation>", text, re.DOTALL)
    rest = text[seen.end():] if seen else text
    foreseen = re.search(r"<prediction>(.*?)</prediction>", rest, re.DOTALL)
    return (bool(seen) and seen.group(1).strip() == now,
            bool(foreseen) and foreseen.group(1).strip() == after)


def test_probe_reads_replies_as_spa_does():
    """Hand-made replies (right, padded with whitespace, one digit off, blocks missing, out of
    order, unclosed, repeated) scored by the probe in JAX and by SPA's regex rule."""
    env, tok, codec, _ = _setup("coord_sokoban")
    level = "######\n#_P__#\n#_X__#\n#_O__#\n#____#\n######"
    s0 = env.reset_from_text(level, jax.random.PRNGKey(0))[0]
    s1 = env.step(s0, jnp.int32(env.action_names.index("Down")))[0]
    now, after = wm.coordinate_text(env, s0), wm.coordinate_text(env, s1)
    assert after == "Targets: (3, 2)\nBoxes on target: (3, 2)\nPlayer: (2, 2)"
    off = after.replace("(2, 2)", "(2, 3)")
    right = wm.reply_text(now, after, ["Down"], "||")
    replies = [
        right,
        right.replace(f"<observation>{now}", f"<observation>\n  {now} \n"),
        wm.reply_text(now, off, ["Down"], "||"),
        wm.reply_text(off, after, ["Down"], "||"),
        f"<think> <observation>{now}</observation></think><answer>Down</answer>",
        f"<think> <prediction>{after}</prediction></think><answer>Down</answer>",
        f"<think> <prediction>{after}</prediction> <observation>{now}</observation></think>",
        f"<think> <observation>{now}</observation> <prediction>{after}",
        f"<think> <observation>{off}</observation><observation>{now}</observation>"
        f"<prediction>{after}</prediction></think>",
        f"<think> <observation>{now}Player: (2, 2)</observation><prediction> {after}\t"
        f"</prediction></think>",
    ]
    tables = wm.coordinate_bytes(env)
    width = 160
    rows = [tok.encode(r, add_special_tokens=False) for r in replies]
    ids = np.full((len(rows), width), tok.pad_token_id, np.int32)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    lengths = jnp.asarray([len(r) for r in rows], jnp.int32)
    before = jax.tree.map(lambda x: jnp.stack([x] * len(rows)), env.render_coordinates(s0))
    later = jax.tree.map(lambda x: jnp.stack([x] * len(rows)), env.render_coordinates(s1))
    got = jax.jit(jax.vmap(wm.probe, in_axes=(None, None, 0, 0, 0, 0)))(
        codec.parser, tables, jnp.asarray(ids), lengths, before, later)
    want = [_spa_reference(r, now, after) for r in replies]
    assert [tuple(map(bool, x)) for x in zip(*jax.device_get(got))] == want
    assert want[0] == want[1] == (True, True) and want[2] == (True, False)
    assert want[4] == (True, False) and want[5] == (False, True) and want[7] == (True, False)


def test_bytes_of_the_coordinates_equal_their_text():
    """coordinate_bytes(env).text(ids) is the UTF-8 of slot_text(...) on random states."""
    for name in ("coord_sokoban", "coord_frozen_lake", "sokoban"):
        env = envs_jax.make(name)
        tables = wm.coordinate_bytes(env)
        states = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(2), 16))[0]
        ids = jax.vmap(env.render_coordinates)(states)
        data, n = jax.device_get(jax.jit(jax.vmap(tables.text))(ids))
        for b in range(16):
            text = wm.coordinate_text(env, jax.tree.map(lambda x: x[b], states))
            assert bytes(data[b, : n[b]].astype(np.uint8)) == text.encode()


def test_sft_section_and_bad_settings_are_named():
    c = sft.sft_config("coord_sokoban", "random", reply_tokens=96)
    c.sft.reply_format = "world_model"
    run, section = sft.split_config(c)
    assert run.rollout.world_model and section.reply_format == "world_model"
    c.sft.reply_format = "grid"
    with pytest.raises(ValueError, match=r"sft.reply_format.*'grid'.*answer.*world_model"):
        sft.split_config(c)
    c.sft.reply_format = "world_model"
    c.nothink = True
    with pytest.raises(ValueError, match="think"):
        sft.split_config(c)
    with pytest.raises(ValueError, match="coordinate"):
        wm.require_world_model_env(envs_jax.make("bandit"), True)
    with pytest.raises(ValueError, match="prediction_reward"):
        RolloutConfig(prediction_reward=1.0)
    env, tok, codec, encoder = _setup("coord_sokoban")
    assert wm.longest_reply(env, encoder, 2) <= 96
    with pytest.raises(ValueError, match="rollout.world_model"):
        dataclasses.replace(RolloutConfig(), world_model="yes")
