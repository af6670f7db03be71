"""The built-in envs' names and agent-side settings (EnvSettings), without JAX or jumanji: a
run config is checked against them before the games load (starpo_jax.run.schema). Each game's
package registers its names with the settings held here (envs_jax.register)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvSettings:
    """An env's agent-side defaults, as the original's per-env configs hold them
    (config/envs.yaml: max_actions_per_traj, max_tokens; the run configs: max_turn,
    max_actions_per_turn). A run config may override each (starpo_jax.api).

    max_turns: replies per trajectory. max_actions_per_turn: actions kept from one reply.
    max_actions_per_traj: env steps per trajectory (the prompt's "You can make up to N actions"
    and "You have N actions left"). announced_tokens: the "Max response length: N words
    (tokens)" the prompt states; not the generation budget (the original announces 100 and
    generates up to 400 tokens).
    """

    max_turns: int = 5
    max_actions_per_turn: int = 5
    max_actions_per_traj: int = 10
    announced_tokens: int = 100

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EnvSettings.{field.name} must be an int >= 1; got {value!r}")


_GRID = EnvSettings()  # the grid games' (the original's base.yaml: 5 turns, 5 and 10 actions)
# The original's bandit and Countdown runs: one turn, one action (config/_1_bandit.yaml,
# _4_countdown.yaml, envs.yaml).
ONE_SHOT = EnvSettings(max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
# The original's SimpleSudoku / MediumSudoku (envs.yaml: 20 / 30 moves, 150 tokens announced;
# base.yaml: 5 turns, 2 actions per turn).
_SUDOKU_EASY = EnvSettings(max_turns=5, max_actions_per_turn=2, max_actions_per_traj=20,
                           announced_tokens=150)
_SUDOKU_MEDIUM = EnvSettings(max_turns=5, max_actions_per_turn=2, max_actions_per_traj=30,
                             announced_tokens=150)
# The original's 2048 (envs.yaml game_2048: 700 actions, 8192 tokens announced; _9_2048.yaml:
# 800 turns, 1 action per turn) and Rubik's cube (envs.yaml rubikscube: 20 actions, 96 tokens;
# _10_rubikscube.yaml: 25 turns, 4 actions per turn).
_GAME_2048 = EnvSettings(max_turns=800, max_actions_per_turn=1, max_actions_per_traj=700,
                         announced_tokens=8192)
_RUBIKS_CUBE = EnvSettings(max_turns=25, max_actions_per_turn=4, max_actions_per_traj=20,
                           announced_tokens=96)
# The original's CoordSokoban / CoordFrozenLake (envs.yaml: 10 actions, 120 tokens announced;
# base.yaml: 5 turns, 2 actions per turn).
_COORD = EnvSettings(max_turns=5, max_actions_per_turn=2, max_actions_per_traj=10,
                     announced_tokens=120)
# Built-in name -> its settings; the game packages register exactly these names.
BUILTIN = {
    "bandit": ONE_SHOT, "bandit_rev": ONE_SHOT, "bandit_test": ONE_SHOT,
    "countdown": ONE_SHOT, "countdown_5": ONE_SHOT,
    "coord_frozen_lake": _COORD, "coord_sokoban": _COORD,
    "frozen_lake": _GRID,
    "sokoban": _GRID, "sokoban_large": _GRID, "sokoban_new_vocab": _GRID,
    "sudoku": _SUDOKU_EASY, "sudoku_medium": _SUDOKU_MEDIUM,
    "sudoku_4x4": _SUDOKU_EASY, "sudoku_4x4_medium": _SUDOKU_MEDIUM,
    "game_2048": _GAME_2048, "rubiks_cube_2x2": _RUBIKS_CUBE,
    "maze": _GRID,  # not in the original: jumanji's Maze, 5x5 (envs_jax.maze)
}
