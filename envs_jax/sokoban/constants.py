"""Sokoban's fixed tables: symbol ids, the two vocabularies, actions and rewards.

Symbol ids follow the original's `grid_lookup` (0 wall ... 6 player on target), so id i renders
as `symbols[i]` in either vocabulary.
"""

from __future__ import annotations

WALL, EMPTY, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)

#: The original's symbols, in id order.
SYMBOLS: tuple[str, ...] = ("#", "_", "O", "√", "X", "P", "S")
#: SokobanNewVocab's symbols, in the same id order (wall W ... player on target @).
NEW_VOCAB_SYMBOLS: tuple[str, ...] = ("W", ".", "G", "C", "B", "A", "@")
#: What each symbol id means, for the prompt's symbol legend (the original's grid_vocab).
SYMBOL_MEANINGS: tuple[str, ...] = (
    "wall",
    "empty",
    "target",
    "box on target",
    "box",
    "player",
    "player on target",
)

#: The original's env_instruction for its Sokoban variants (config/envs.yaml); the prompt adds
#: the symbol legend, the actions and the action budget after it.
INSTRUCTIONS = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to "
    "targets. When you are right next to a box, you can push it by moving in the same "
    "direction. You cannot push a box through a wall, and you cannot pull a box. The answer "
    "should be a sequence of actions, like <answer>Right || Right || Up</answer>"
)

#: CoordSokoban's env_instruction (RAGEN config/envs.yaml, a YAML `|` block: its trailing
#: spaces and final newline kept), for the coordinate formats (envs_jax.coords).
COORD_INSTRUCTIONS = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to "
    "targets.\n"
    "You are provided with a symbol grid and the zero-indexed coordinates of the player, each "
    "box, and each target. \n"
    "Coordinates range from the top-left corner (0, 0) to the bottom-right corner (5, 5). \n"
    "When you are exactly next to a box, you can push it by moving in the same direction. \n"
    "You cannot push a box through a wall, and you cannot pull a box.\n"
    "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>.\n"
)
#: The coordinate lines' labels, in RAGEN's order (format_coordinate_render; it never lists
#: walls).
COORDINATE_LABELS: tuple[str, ...] = (
    "Targets", "Boxes", "Boxes on target", "Player", "Player on target")

#: The original's action order; action i moves the player by MOVES[i] = (d_row, d_col).
ACTION_NAMES: tuple[str, ...] = ("Up", "Down", "Left", "Right")
MOVES: tuple[tuple[int, int], ...] = ((-1, 0), (1, 0), (0, -1), (0, 1))

# gym-sokoban's rewards; the step penalty is paid on every step, blocked moves included.
STEP_PENALTY = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_PENALTY = -1.0
SOLVED_REWARD = 10.0

# The original's generator: carve for int(1.7 * (h + w)) steps, turning with this probability.
CARVE_STEPS_PER_SIDE = 1.7
P_CHANGE_DIRECTION = 0.35
