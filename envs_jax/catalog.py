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
# Built-in name -> its settings; the game packages register exactly these names.
BUILTIN = {
    "bandit": ONE_SHOT, "bandit_rev": ONE_SHOT, "bandit_test": ONE_SHOT,
    "countdown": ONE_SHOT, "countdown_5": ONE_SHOT,
    "frozen_lake": _GRID,
    "sokoban": _GRID, "sokoban_large": _GRID, "sokoban_new_vocab": _GRID,
    "sudoku": _SUDOKU_EASY, "sudoku_medium": _SUDOKU_MEDIUM,
    "sudoku_4x4": _SUDOKU_EASY, "sudoku_4x4_medium": _SUDOKU_MEDIUM,
}
