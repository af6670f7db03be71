"""RAGEN's coordinate observations (envs_jax.coords) of Sokoban and FrozenLake: every format's
text equals a plain-Python port of RAGEN's renderer (helpers/ragen_coords.py) on generated
levels and random walks, the tokens computed in JAX equal the tokenizer's, the coordinate
parts (the world model's) read as RAGEN's lines, FrozenLake's success_rate slips as
gymnasium's, and the coord_* names and configs are RAGEN's CoordSokoban / CoordFrozenLake."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import envs_jax  # noqa: E402
from envs_jax.base import TextSlot, slot_text, symbol_text  # noqa: E402
from envs_jax.frozen_lake import FrozenLake  # noqa: E402
from envs_jax.sokoban import Sokoban  # noqa: E402
from helpers import ragen_coords as ref  # noqa: E402
from starpo_jax.text import blocks as bk  # noqa: E402

FORMATS = ("grid", "coord", "grid_coord")
# Two boxes in a 12x12 room: the player on a target, a box on a target, coordinates >= 10.
TWO_BOXES = "\n".join(["############", "#__________#", "#__________#", "#_√________#",
                       "#_________X#", *["#__________#"] * 5, "#__S_______#", "############"])
# name -> (class, constructor arguments, levels generated, steps walked, hand-made levels)
BOARDS = {
    "sokoban_6x6": (Sokoban, {"dim_room": (6, 6), "num_boxes": 1}, 16, 15, ()),
    "sokoban_12x12": (Sokoban, {"dim_room": (12, 12), "num_boxes": 2}, 6, 15, (TWO_BOXES,)),
    "frozen_lake_4x4": (FrozenLake, {"size": 4}, 32, 7, ()),
    "frozen_lake_11x11": (FrozenLake, {"size": 11, "p": 0.7}, 8, 15, ()),
}
KEY = jax.random.PRNGKey(0)


def lane(tree, i: int):
    return jax.tree.map(lambda x: x[i], tree)


@functools.cache
def board_states(name: str):
    """(grid env, states [M]): generated levels and the hand-made ones, each followed by a
    random walk (every state along it)."""
    cls, kwargs, count, steps, levels = BOARDS[name]
    env = cls(**kwargs)
    starts, _ = jax.jit(jax.vmap(env.reset))(jax.random.split(KEY, count))
    for text in levels:
        made = env.reset_from_text(text, KEY)[0]
        starts = jax.tree.map(lambda a, b: jnp.concatenate([a, b[None]]), starts, made)
    n = jax.tree.leaves(starts)[0].shape[0]
    actions = jax.random.randint(jax.random.PRNGKey(1), (steps, n), 0, 4)

    def walk(state, action):
        state = jax.vmap(env.step)(state, action)[0]
        return state, state

    _, path = jax.jit(lambda s, a: jax.lax.scan(walk, s, a))(starts, actions)
    states = jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]).reshape(-1, *a.shape[1:]),
                          starts, path)
    return env, jax.device_get(states)


def reference(env, state, fmt: str) -> str:
    """RAGEN's text of one state, from arrays built off the state's fields."""
    if isinstance(env, Sokoban):
        fixed, room = ref.sokoban_arrays(state.walls, state.targets, state.boxes, state.player)
        return ref.sokoban_text(room, fixed, fmt)
    desc = ref.frozen_lake_desc(state.tiles, state.start)
    return ref.frozen_lake_text(desc, tuple(state.player), fmt)


def texts_of(env, symbols, parts=None) -> list[str]:
    """Host texts of a batch of render_symbols (or render_coordinates with `parts`)."""
    parts = env.observation_parts if parts is None else parts
    count = jax.tree.leaves(symbols)[0].shape[0]
    if parts is None:
        return [symbol_text(env.symbol_strings, symbols[i]) for i in range(count)]
    return [slot_text(parts, lane(symbols, i)) for i in range(count)]


def formatted(name: str, fmt: str):
    cls, kwargs, *_ = BOARDS[name]
    return cls(**kwargs, observation_format=fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_format_is_ragens_text(name, fmt):
    base, states = board_states(name)
    env = formatted(name, fmt)
    count = jax.tree.leaves(states)[0].shape[0]
    assert count >= 100
    texts = texts_of(env, jax.jit(jax.vmap(env.render_symbols))(states))
    for i, text in enumerate(texts):
        assert text == reference(env, lane(states, i), fmt), i
    for i in (0, count // 2, count - 1):  # render_text itself, one state at a time
        assert env.render_text(lane(states, i)) == texts[i]
    joined = "\n".join(reference(env, lane(states, i), "coord") for i in range(count))
    if name.startswith("sokoban"):  # the walks reach what the lines tell apart
        assert "Boxes on target: " in joined and "Player on target: " in joined
    else:
        assert "Player in hole: " in joined and "Player on goal: " in joined
    if name.endswith(("12x12", "11x11")):
        assert ", 10)" in joined and "(10, " in joined


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_coordinate_parts_are_ragens_lines_without_the_header(name):
    env, states = board_states(name)
    parts = env.coordinate_parts
    assert all(isinstance(p, (str, TextSlot)) for p in parts)
    assert not any(isinstance(a, TextSlot) and isinstance(b, TextSlot)
                   for a, b in zip(parts, parts[1:]))
    symbols = jax.jit(jax.vmap(env.render_coordinates))(states)
    got = texts_of(env, symbols, parts)
    for i, text in enumerate(got):
        assert text == ref.without_header(reference(env, lane(states, i), "coord")), i
    for fmt in ("coord", "grid_coord"):  # the same parts whatever the observation format
        assert slot_text(formatted(name, fmt).coordinate_parts, lane(symbols, 0)) == got[0]
    print(f"{name}: {got[0]!r}")


@pytest.fixture(scope="module", params=["smollm2", "qwen_style"])
def tok(request):
    return request.getfixturevalue(f"{request.param}_tok")


def _block_parts(parts) -> list:
    return [p if isinstance(p, str) else bk.Slot(p.name, p.symbols, p.sample,
                                                  max_bytes=p.max_bytes) for p in parts]


_encode = jax.jit(jax.vmap(bk.Block.encode, in_axes=(None, 0)))


# grid_coord holds coord's slot; the big room's grid is a grid as before (test_text_render).
@pytest.mark.parametrize("name, fmt", [("sokoban_6x6", "grid_coord"), ("sokoban_12x12", "coord"),
                                       ("frozen_lake_4x4", "grid_coord")])
def test_observation_tokens_are_the_tokenizers(tok, name, fmt):
    """The codec's observation block (build_codec's: the env's slots, verified on samples)
    renders the walks' states as tokenizer.encode(env.render_text(state)); the coordinate
    parts (the world model's) too."""
    _, states = board_states(name)
    env = formatted(name, fmt)
    for parts, render in ((env.observation_parts, env.render_symbols),
                          (env.coordinate_parts, env.render_coordinates)):
        block = bk.build_block(tok, _block_parts(parts), verify=bk.VERIFY_ROWS)
        symbols = jax.vmap(render)(states)
        ids, lengths = jax.device_get(_encode(block, symbols))
        want = tok(texts_of(env, symbols, parts), add_special_tokens=False)["input_ids"]
        for row, n, expected in zip(ids, lengths, want):
            assert row[:n].tolist() == expected
            assert np.all(row[n:] == -1)


def test_the_slot_reserves_its_byte_bound_not_width_times_the_longest_label():
    lines = Sokoban(dim_room=(6, 6)).coordinate_lines
    longest = max(len(s.encode()) for s in lines.symbols)
    # "4, 3), (3, 2)\nBoxes on target: (2, 2)\nPlayer on target: (2, 2": each label once
    assert lines.width == 11 and lines.max_bytes == 3 * 4 + 2 * 4 + 6 + 16 + 17
    assert lines.max_bytes < lines.width * longest
    big = Sokoban(dim_room=(12, 12), num_boxes=2).coordinate_lines
    assert big.digits == 2 and big.width == 5 * 6 - 1


def test_coord_sokoban_codec_matches_the_host_prompt(smollm2_tok):
    """The registered name through build_codec: observation and first prompt are the host
    rendering's tokens, replies parse as action words."""
    from starpo_jax.text import build_codec, default_template, env_intro
    from starpo_jax.text import render_conversation_text

    env = envs_jax.make("coord_sokoban")
    codec = build_codec(smollm2_tok, env, verify=1)
    _, states = board_states("sokoban_6x6")
    state = lane(states, 5)
    s = env.settings
    ids, n = jax.jit(lambda c, x: c.first_prompt(x, s.max_actions_per_traj))(
        codec, env.render_symbols(state))
    template = default_template("think")
    intro = env_intro(template, env, max_actions_per_turn=s.max_actions_per_turn,
                      max_actions_per_traj=s.max_actions_per_traj)
    messages = render_conversation_text(template, intro, [env.render_text(state)], [], [],
                                        [s.max_actions_per_traj], max_tokens=s.announced_tokens)
    text = smollm2_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert np.asarray(ids)[: int(n)].tolist() == smollm2_tok.encode(text, add_special_tokens=False)
    reply = smollm2_tok.encode("<think>x</think><answer>Up || Left || Down</answer>",
                               add_special_tokens=False)
    parsed = jax.jit(lambda c, r: c.parse_reply(r, jnp.int32(len(reply))))(
        codec, jnp.asarray(reply))
    assert np.asarray(parsed.actions).tolist() == [0, 2]  # max_actions_per_turn = 2


SLIP_N = 20_000


@pytest.mark.parametrize("rate", [0.8, 0.5, 0.0, 1.0])
def test_success_rate_slips_as_gymnasium(rate):
    """From the centre of an open map, the next cell's frequencies are gymnasium's transition
    probabilities for that success_rate (within 5 sigma); 1.0 never slips."""
    from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

    env = FrozenLake(success_rate=rate)
    start, _ = env.reset_from_text("____\n_P__\n____\n___G", KEY)
    table = FrozenLakeEnv(desc=["FFFF", "FSFF", "FFFF", "FFFG"], is_slippery=True,
                          success_rate=rate).unwrapped.P
    states = jax.vmap(lambda k: start.replace(key=k))(jax.random.split(KEY, SLIP_N))
    step = jax.jit(jax.vmap(env.step, (0, None)))
    for action in range(4):
        players = np.asarray(step(states, jnp.int32(action))[0].player)
        counts = np.bincount(players[:, 0] * 4 + players[:, 1], minlength=16)
        expected = np.zeros(16)
        for p, cell, *_ in table[5][action]:
            expected[cell] += p
        sigma = np.sqrt(SLIP_N * expected * (1 - expected))
        # exact where gymnasium's probability is 0 or 1 (sigma 0): 1.0 never slips
        assert np.all(np.abs(counts - SLIP_N * expected) <= 5 * sigma + 1e-9), (action, counts)


def test_default_and_not_slippery_are_unchanged():
    assert FrozenLake().success_rate == pytest.approx(1 / 3) and "success_rate" not in repr(
        FrozenLake())
    assert envs_jax.make("frozen_lake").success_rate == FrozenLake().success_rate
    flat = FrozenLake(slippery=False, success_rate=0.0)  # is_slippery=False ignores the rate
    start, _ = flat.reset_from_text("____\n_P__\n____\n___G", KEY)
    assert np.asarray(flat.step(start, jnp.int32(2))[0].player).tolist() == [1, 2]


@pytest.mark.parametrize("make, match", [
    (lambda: Sokoban(observation_format="grids"),
     r"observation_format='grids' is invalid; valid: 'grid', 'coord', 'grid_coord'"),
    (lambda: FrozenLake(observation_format=None), r"observation_format=None is invalid"),
    (lambda: FrozenLake(success_rate=1.5), r"success_rate .* in \[0, 1\]; got 1.5"),
    (lambda: FrozenLake(success_rate="0.8"), r"success_rate .*; got '0.8'"),
    (lambda: FrozenLake(success_rate=True), r"success_rate .*; got True"),
    (lambda: envs_jax.make("coord_sokoban", instructions=3), r"instructions must be a str"),
])
def test_bad_values_are_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_coordinate_format_refuses_more_boxes_than_it_lists():
    env = Sokoban(dim_room=(12, 12), num_boxes=1, observation_format="coord")
    with pytest.raises(ValueError, match="level has 2 boxes; .* num_boxes=1"):
        env.reset_from_text(TWO_BOXES, KEY)
    grid_coord = Sokoban(dim_room=(12, 12), num_boxes=2, observation_format="grid_coord")
    state, _ = grid_coord.reset_from_text(TWO_BOXES, KEY)
    again, _ = grid_coord.reset_from_text(grid_coord.render_text(state), KEY)  # its own text
    assert grid_coord.render_text(again) == grid_coord.render_text(state)
    coord = Sokoban(dim_room=(12, 12), num_boxes=2, observation_format="coord")
    with pytest.raises(ValueError, match="a coord observation does not list every cell"):
        coord.reset_from_text(coord.render_text(state), KEY)


# The original's first user message head of each (config/envs.yaml's text, then the legend and
# the actions, as its ctx_manager builds them: observation_format is under env_config there,
# so the prompt takes the config class's default "grid" and keeps the symbol legend).
INTROS = {
    "coord_sokoban": (
        "You are solving the Sokoban puzzle. You are the player and you need to push all boxes "
        "to targets.\nYou are provided with a symbol grid and the zero-indexed coordinates of "
        "the player, each box, and each target. \nCoordinates range from the top-left corner "
        "(0, 0) to the bottom-right corner (5, 5). \nWhen you are exactly next to a box, you can "
        "push it by moving in the same direction. \nYou cannot push a box through a wall, and "
        "you cannot pull a box.\nThe answer should be a sequence of actions, like "
        "<answer>Right || Right || Up</answer>.\n\nThe meaning of each symbol in the state is:\n"
        "#: wall, _: empty, O: target, √: box on target, X: box, P: player, S: player on target"
        "\nYour available actions are:\nUp, Down, Left, Right\nYou can make up to 10 actions, "
        "separated by the action separator \" || \"\n"),
    "coord_frozen_lake": (
        "You are solving the FrozenLake puzzle. The observation includes both a symbol grid and "
        "zero-indexed coordinates for the start, goal, player, and any holes.\nCoordinates "
        "range from the top-left corner (0, 0) to the bottom-right corner (5, 5).\nBeware that "
        "the ice is slippery, so the agent might slide and end up in an unintended tile.\n"
        "Respond with a sequence of actions such as <answer>Left || Up || Up</answer>.\n\n"
        "The meaning of each symbol in the state is:\nP: player, _: empty, O: hole, G: goal, X: "
        "player in hole, √: player on goal\nYour available actions are:\nLeft, Down, Right, Up\n"
        "You can make up to 10 actions, separated by the action separator \" || \"\n"),
}


@pytest.mark.parametrize("name", sorted(INTROS))
def test_the_names_are_ragens_coord_envs(name):
    from starpo_jax import api
    from starpo_jax.config import default_eval_envs
    from starpo_jax.text import default_template, env_intro

    env = envs_jax.make(name)
    s = envs_jax.settings(name)
    assert (s.max_turns, s.max_actions_per_turn, s.max_actions_per_traj,
            s.announced_tokens) == (5, 2, 10, 120)
    assert env.observation_format == "grid_coord" and env.max_steps == 100
    if name == "coord_sokoban":
        assert isinstance(env, Sokoban) and (env.dim_room, env.num_boxes) == ((6, 6), 1)
        assert env.generator_config.search_depth == 300
    else:
        assert isinstance(env, FrozenLake) and (env.size, env.p, env.success_rate) == (4, 0.9, 0.8)
    assert env_intro(default_template("think"), env, max_actions_per_turn=2,
                     max_actions_per_traj=10) == INTROS[name]
    assert default_eval_envs(name) == (name,)
    rollout = api.train_config(api.config_for(name, "grpo")).rollout
    assert (rollout.max_actions_per_turn, rollout.announced_tokens) == (2, 120)


CONFIG_DIR = Path(__file__).resolve().parents[1] / "experiments" / "configs"


@pytest.mark.parametrize("game", ["coord_sokoban", "coord_frozen_lake"])
def test_the_configs_are_the_grid_games_with_the_coord_env(game):
    """coord_<game>_{ppo,grpo}.py are <game>_{ppo,grpo}.py with env.name changed; the CPU
    configs are issue 60's RL after the world-model warm start: PPO in think mode with the
    probe, from coord_<game>_sft.py (a world-model SFT), with RAGEN's turns and budgets."""
    from starpo_jax import api

    def load(stem):
        spec = importlib.util.spec_from_file_location("cfg", CONFIG_DIR / f"{stem}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.get_config()

    grid = game.removeprefix("coord_")
    for kind in ("ppo", "grpo", "cpu"):
        config = load(f"{game}_{kind}")
        if kind == "cpu":
            assert config.model.require_init_from == f"{game}_sft.py"
            assert load(f"{game}_sft").sft.reply_format == "world_model"
            assert (config.algo, config.nothink, config.rollout.world_model) == ("ppo", False,
                                                                                True)
            config.model.require_init_from = ""
        else:
            theirs = load(f"{grid}_{kind}")
            theirs.env.name = game
            assert config.to_dict() == theirs.to_dict()
        rollout = api.train_config(config).rollout
        assert (rollout.max_turns, rollout.max_actions_per_turn, rollout.max_actions_per_traj,
                rollout.announced_tokens) == (5, 2, 10, 120)
