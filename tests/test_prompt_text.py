"""Each env's first prompt, word for word: the original's (RAGEN v1 ctx_manager.py with
config/envs.yaml and the env configs), so any wording change fails here.

The texts are the chat template's rendering of the system message and turn 1's user message,
then the forced prefix, for the state of env.reset(PRNGKey(0)) with the env's own settings.
Pinned through the host rendering (templates + env text + chat template) for every env and
mode, and through the codec (what the rollout feeds the model) for the bandit.
"""

from __future__ import annotations

import functools
import os

import jax
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import envs_jax  # noqa: E402
from starpo_jax.text import build_codec, default_template, env_intro  # noqa: E402
from starpo_jax.text import render_conversation_text  # noqa: E402

# fmt: off
FIRST_PROMPTS = {
    ("bandit", "think"): (
        "<|im_start|>system\n"
        "You're a helpful assistant. <|im_end|>\n"
        "<|im_start|>user\n"
        "\n"
        "Turn 1:\n"
        "State:\n"
        "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to "
        "pull. \n"
        "Game Rules: \n"
        "1. There are 2 arms, named Phoenix and Dragon\n"
        "2. Each arm has its own reward distribution, related to their names. \n"
        "3. Analyze the symbolic meaning of each arm's name to guess how their reward "
        "distribution might behave.\n"
        "4. Based on the symbolic meaning of their names, which arm do you think is more likely "
        "to give higher rewards on average? Choose between Phoenix and Dragon, and output like "
        "<answer> Phoenix </answer> or <answer> Dragon </answer>.\n"
        "\n"
        "You have 1 actions left. Always output: <think> [Your thoughts] </think> <answer> [your "
        "answer] </answer> with no extra text. Strictly follow this format. Max response length: "
        "100 words (tokens).\n"
        "<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>"
    ),
    ("bandit", "nothink"): (
        "<|im_start|>system\n"
        "You're a helpful assistant. <|im_end|>\n"
        "<|im_start|>user\n"
        "\n"
        "Turn 1:\n"
        "State:\n"
        "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to "
        "pull. \n"
        "Game Rules: \n"
        "1. There are 2 arms, named Phoenix and Dragon\n"
        "2. Each arm has its own reward distribution, related to their names. \n"
        "3. Analyze the symbolic meaning of each arm's name to guess how their reward "
        "distribution might behave.\n"
        "4. Based on the symbolic meaning of their names, which arm do you think is more likely "
        "to give higher rewards on average? Choose between Phoenix and Dragon, and output like "
        "<answer> Phoenix </answer> or <answer> Dragon </answer>.\n"
        "\n"
        "You have 1 actions left. Always output: <answer> [your answer] </answer> with no extra "
        "text. Strictly follow this format. Max response length: 100 words (tokens).\n"
        "<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<answer>"
    ),
    ("bandit_rev", "think"): (
        "<|im_start|>system\n"
        "You're a helpful assistant. <|im_end|>\n"
        "<|im_start|>user\n"
        "\n"
        "Turn 1:\n"
        "State:\n"
        "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to "
        "pull. \n"
        "Game Rules: \n"
        "1. There are 2 arms, named Dragon and Phoenix\n"
        "2. Each arm has its own reward distribution, related to their names. \n"
        "3. Analyze the symbolic meaning of each arm's name to guess how their reward "
        "distribution might behave.\n"
        "4. Based on the symbolic meaning of their names, which arm do you think is more likely "
        "to give higher rewards on average? Choose between Dragon and Phoenix, and output like "
        "<answer> Dragon </answer> or <answer> Phoenix </answer>.\n"
        "\n"
        "You have 1 actions left. Always output: <think> [Your thoughts] </think> <answer> [your "
        "answer] </answer> with no extra text. Strictly follow this format. Max response length: "
        "100 words (tokens).\n"
        "<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>"
    ),
    ("bandit_rev", "nothink"): (
        "<|im_start|>system\n"
        "You're a helpful assistant. <|im_end|>\n"
        "<|im_start|>user\n"
        "\n"
        "Turn 1:\n"
        "State:\n"
        "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to "
        "pull. \n"
        "Game Rules: \n"
        "1. There are 2 arms, named Dragon and Phoenix\n"
        "2. Each arm has its own reward distribution, related to their names. \n"
        "3. Analyze the symbolic meaning of each arm's name to guess how their reward "
        "distribution might behave.\n"
        "4. Based on the symbolic meaning of their names, which arm do you think is more likely "
        "to give higher rewards on average? Choose between Dragon and Phoenix, and output like "
        "<answer> Dragon </answer> or <answer> Phoenix </answer>.\n"
        "\n"
        "You have 1 actions left. Always output: <answer> [your answer] </answer> with no extra "
        "text. Strictly follow this format. Max response length: 100 words (tokens).\n"
        "<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<answer>"
    ),
    ("bandit_test", "think"): (
        "<|im_start|>system\n"
        "You're a helpful assistant. <|im_end|>\n"
        "<|im_start|>user\n"
        "\n"
        "Turn 1:\n"
        "State:\n"
        "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to "
        "pull. \n"
        "Game Rules: \n"
        "1. There are 2 arms, named Trader and Librarian\n"
        "2. Each arm has its own reward distribution, related to their names. \n"
        "3. Analyze the symbolic meaning of each arm's name to guess how their reward "
        "distribution might behave.\n"
        "4. Based on the symbolic meaning of their names, which arm do you think is more likely "
        "to give higher rewards on average? Choose between Trader and Librarian, and output like "
        "<answer> Trader </answer> or <answer> Librarian </answer>.\n"
        "\n"
        "You have 1 actions left. Always output: <think> [Your thoughts] </think> <answer> [your "
        "answer] </answer> with no extra text. Strictly follow this format. Max response length: "
        "100 words (tokens).\n"
        "<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>"
    ),
    ("bandit_test", "nothink"): (
        "<|im_start|>system\n"
        "You're a helpful assistant. <|im_end|>\n"
        "<|im_start|>user\n"
        "\n"
        "Turn 1:\n"
        "State:\n"
        "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to "
        "pull. \n"
        "Game Rules: \n"
        "1. There are 2 arms, named Trader and Librarian\n"
        "2. Each arm has its own reward distribution, related to their names. \n"
        "3. Analyze the symbolic meaning of each arm's name to guess how their reward "
        "distribution might behave.\n"
        "4. Based on the symbolic meaning of their names, which arm do you think is more likely "
        "to give higher rewards on average? Choose between Trader and Librarian, and output like "
        "<answer> Trader </answer> or <answer> Librarian </answer>.\n"
        "\n"
        "You have 1 actions left. Always output: <answer> [your answer] </answer> with no extra "
        "text. Strictly follow this format. Max response length: 100 words (tokens).\n"
        "<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<answer>"
    ),
    ("sokoban", "think"): (
        "<|im_start|>system\n"
        "You're a helpful assistant. <|im_end|>\n"
        "<|im_start|>user\n"
        "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to "
        "targets. When you are right next to a box, you can push it by moving in the same "
        "direction. You cannot push a box through a wall, and you cannot pull a box. The answer "
        "should be a sequence of actions, like <answer>Right || Right || Up</answer>\n"
        "The meaning of each symbol in the state is:\n"
        "#: wall, _: empty, O: target, √: box on target, X: box, P: player, S: player on target\n"
        "Your available actions are:\n"
        "Up, Down, Left, Right\n"
        'You can make up to 10 actions, separated by the action separator " || "\n'
        "\n"
        "Turn 1:\n"
        "State:\n"
        "######\n"
        "#____#\n"
        "#PX__#\n"
        "###__#\n"
        "##__O#\n"
        "######\n"
        "You have 10 actions left. Always output: <think> [Your thoughts] </think> <answer> [your "
        "answer] </answer> with no extra text. Strictly follow this format. Max response length: "
        "100 words (tokens).\n"
        "<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>"
    ),
    ("sokoban", "nothink"): (
        "<|im_start|>system\n"
        "You're a helpful assistant. <|im_end|>\n"
        "<|im_start|>user\n"
        "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to "
        "targets. When you are right next to a box, you can push it by moving in the same "
        "direction. You cannot push a box through a wall, and you cannot pull a box. The answer "
        "should be a sequence of actions, like <answer>Right || Right || Up</answer>\n"
        "The meaning of each symbol in the state is:\n"
        "#: wall, _: empty, O: target, √: box on target, X: box, P: player, S: player on target\n"
        "Your available actions are:\n"
        "Up, Down, Left, Right\n"
        'You can make up to 10 actions, separated by the action separator " || "\n'
        "\n"
        "Turn 1:\n"
        "State:\n"
        "######\n"
        "#____#\n"
        "#PX__#\n"
        "###__#\n"
        "##__O#\n"
        "######\n"
        "You have 10 actions left. Always output: <answer> [your answer] </answer> with no extra "
        "text. Strictly follow this format. Max response length: 100 words (tokens).\n"
        "<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<answer>"
    ),
    ("sokoban_new_vocab", "think"): (
        "<|im_start|>system\n"
        "You're a helpful assistant. <|im_end|>\n"
        "<|im_start|>user\n"
        "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to "
        "targets. When you are right next to a box, you can push it by moving in the same "
        "direction. You cannot push a box through a wall, and you cannot pull a box. The answer "
        "should be a sequence of actions, like <answer>Right || Right || Up</answer>\n"
        "The meaning of each symbol in the state is:\n"
        "W: wall, .: empty, G: target, C: box on target, B: box, A: player, @: player on target\n"
        "Your available actions are:\n"
        "Up, Down, Left, Right\n"
        'You can make up to 10 actions, separated by the action separator " || "\n'
        "\n"
        "Turn 1:\n"
        "State:\n"
        "WWWWWW\n"
        "W....W\n"
        "WAB..W\n"
        "WWW..W\n"
        "WW..GW\n"
        "WWWWWW\n"
        "You have 10 actions left. Always output: <think> [Your thoughts] </think> <answer> [your "
        "answer] </answer> with no extra text. Strictly follow this format. Max response length: "
        "100 words (tokens).\n"
        "<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>"
    ),
    ("sokoban_new_vocab", "nothink"): (
        "<|im_start|>system\n"
        "You're a helpful assistant. <|im_end|>\n"
        "<|im_start|>user\n"
        "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to "
        "targets. When you are right next to a box, you can push it by moving in the same "
        "direction. You cannot push a box through a wall, and you cannot pull a box. The answer "
        "should be a sequence of actions, like <answer>Right || Right || Up</answer>\n"
        "The meaning of each symbol in the state is:\n"
        "W: wall, .: empty, G: target, C: box on target, B: box, A: player, @: player on target\n"
        "Your available actions are:\n"
        "Up, Down, Left, Right\n"
        'You can make up to 10 actions, separated by the action separator " || "\n'
        "\n"
        "Turn 1:\n"
        "State:\n"
        "WWWWWW\n"
        "W....W\n"
        "WAB..W\n"
        "WWW..W\n"
        "WW..GW\n"
        "WWWWWW\n"
        "You have 10 actions left. Always output: <answer> [your answer] </answer> with no extra "
        "text. Strictly follow this format. Max response length: 100 words (tokens).\n"
        "<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<answer>"
    ),
    ("frozen_lake", "think"): (
        "<|im_start|>system\n"
        "You're a helpful assistant. <|im_end|>\n"
        "<|im_start|>user\n"
        "You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You may "
        "move to the unintended direction due to the slippery ice. Example answer format: "
        "<think>To forbid the hole and go to the target, I should go left then go "
        "up.</think><answer>Left || Up</answer>\n"
        "The meaning of each symbol in the state is:\n"
        "P: player, _: empty, O: hole, G: goal, X: player in hole, √: player on goal\n"
        "Your available actions are:\n"
        "Left, Down, Right, Up\n"
        'You can make up to 10 actions, separated by the action separator " || "\n'
        "\n"
        "Turn 1:\n"
        "State:\n"
        "___O\n"
        "___P\n"
        "____\n"
        "_OGO\n"
        "You have 10 actions left. Always output: <think> [Your thoughts] </think> <answer> [your "
        "answer] </answer> with no extra text. Strictly follow this format. Max response length: "
        "100 words (tokens).\n"
        "<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>"
    ),
    ("frozen_lake", "nothink"): (
        "<|im_start|>system\n"
        "You're a helpful assistant. <|im_end|>\n"
        "<|im_start|>user\n"
        "You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You may "
        "move to the unintended direction due to the slippery ice. Example answer format: "
        "<think>To forbid the hole and go to the target, I should go left then go "
        "up.</think><answer>Left || Up</answer>\n"
        "The meaning of each symbol in the state is:\n"
        "P: player, _: empty, O: hole, G: goal, X: player in hole, √: player on goal\n"
        "Your available actions are:\n"
        "Left, Down, Right, Up\n"
        'You can make up to 10 actions, separated by the action separator " || "\n'
        "\n"
        "Turn 1:\n"
        "State:\n"
        "___O\n"
        "___P\n"
        "____\n"
        "_OGO\n"
        "You have 10 actions left. Always output: <answer> [your answer] </answer> with no extra "
        "text. Strictly follow this format. Max response length: 100 words (tokens).\n"
        "<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<answer>"
    ),
    # RAGEN's CoordSokoban / CoordFrozenLake (config/envs.yaml: `|` texts with their trailing
    # spaces and newline; the legend stays, as its ctx_manager reads observation_format at the
    # env entry's top level, where it is not); the observation is grid_coord (envs_jax.coords).
    ("coord_sokoban", "think"): (
        "<|im_start|>system\n"
        "You're a helpful assistant. <|im_end|>\n"
        "<|im_start|>user\n"
        "You are solving the Sokoban puzzle. You are the player and you need to push all boxes "
        "to targets.\n"
        "You are provided with a symbol grid and the zero-indexed coordinates of the player, "
        "each box, and each target. \n"
        "Coordinates range from the top-left corner (0, 0) to the bottom-right corner (5, 5). \n"
        "When you are exactly next to a box, you can push it by moving in the same direction. \n"
        "You cannot push a box through a wall, and you cannot pull a box.\n"
        "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>."
        "\n"
        "\n"
        "The meaning of each symbol in the state is:\n"
        "#: wall, _: empty, O: target, √: box on target, X: box, P: player, S: player on target\n"
        "Your available actions are:\n"
        "Up, Down, Left, Right\n"
        "You can make up to 10 actions, separated by the action separator \" || \"\n"
        "\n"
        "Turn 1:\n"
        "State:\n"
        "Coordinates: \n"
        "Board size: 6 rows x 6 cols (zero-indexed).\n"
        "Targets: (4, 4)\n"
        "Boxes: (2, 2)\n"
        "Player: (2, 1)\n"
        "Grid Map: \n"
        "######\n"
        "#____#\n"
        "#PX__#\n"
        "###__#\n"
        "##__O#\n"
        "######\n"
        "You have 10 actions left. Always output: <think> [Your thoughts] </think> <answer> [your "
        "answer] </answer> with no extra text. Strictly follow this format. Max response length: "
        "120 words (tokens).\n"
        "<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>"
    ),
    ("coord_frozen_lake", "think"): (
        "<|im_start|>system\n"
        "You're a helpful assistant. <|im_end|>\n"
        "<|im_start|>user\n"
        "You are solving the FrozenLake puzzle. The observation includes both a symbol grid and "
        "zero-indexed coordinates for the start, goal, player, and any holes.\n"
        "Coordinates range from the top-left corner (0, 0) to the bottom-right corner (5, 5).\n"
        "Beware that the ice is slippery, so the agent might slide and end up in an unintended "
        "tile.\n"
        "Respond with a sequence of actions such as <answer>Left || Up || Up</answer>.\n"
        "\n"
        "The meaning of each symbol in the state is:\n"
        "P: player, _: empty, O: hole, G: goal, X: player in hole, √: player on goal\n"
        "Your available actions are:\n"
        "Left, Down, Right, Up\n"
        "You can make up to 10 actions, separated by the action separator \" || \"\n"
        "\n"
        "Turn 1:\n"
        "State:\n"
        "Coordinates: \n"
        "Board size: 4 rows x 4 cols (zero-indexed).\n"
        "Start: (1, 3)\n"
        "Goal: (3, 2)\n"
        "Player: (1, 3)\n"
        "Holes: (0, 3), (3, 1), (3, 3)\n"
        "Grid Map: \n"
        "___O\n"
        "___P\n"
        "____\n"
        "_OGO\n"
        "You have 10 actions left. Always output: <think> [Your thoughts] </think> <answer> [your "
        "answer] </answer> with no extra text. Strictly follow this format. Max response length: "
        "120 words (tokens).\n"
        "<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>"
    ),
}
# fmt: on


@functools.cache
def _env_and_first_state(name: str):
    """(env, the text of its state at reset(PRNGKey(0))), once per env for both modes."""
    env = envs_jax.make(name)
    return env, env.render_text(jax.jit(env.reset)(jax.random.PRNGKey(0))[0])


def _host_first_prompt(tok, name: str, mode: str) -> str:
    env, state = _env_and_first_state(name)
    template = default_template(mode)
    s = env.settings
    intro = env_intro(template, env, max_actions_per_turn=s.max_actions_per_turn,
                      max_actions_per_traj=s.max_actions_per_traj)
    messages = render_conversation_text(template, intro, [state], [], [],
                                        [s.max_actions_per_traj], max_tokens=s.announced_tokens)
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + (
        template.forced_prefix)


@pytest.mark.parametrize("name, mode", sorted(FIRST_PROMPTS))
def test_first_prompt_text_is_the_originals(smollm2_tok, name, mode):
    assert _host_first_prompt(smollm2_tok, name, mode) == FIRST_PROMPTS[name, mode]


@pytest.mark.parametrize("mode", ["think", "nothink"])
def test_codec_first_prompt_decodes_to_the_pinned_text(smollm2_tok, mode):
    """The rollout's tokens of turn 1 (bandit: its game text is a looked-up region)."""
    env = envs_jax.make("bandit")
    codec = build_codec(smollm2_tok, env, mode=mode, verify=1)
    state, _ = env.reset(jax.random.PRNGKey(0))
    ids, n = codec.first_prompt(env.render_symbols(state), env.settings.max_actions_per_traj)
    ids = np.asarray(ids)[: int(n)].tolist() + list(codec.forced_prefix_ids)
    assert smollm2_tok.decode(ids) == FIRST_PROMPTS["bandit", mode]
    assert ids == smollm2_tok.encode(FIRST_PROMPTS["bandit", mode], add_special_tokens=False)
