"""Sudoku, registered as `sudoku` (9x9, easy: the original's SimpleSudoku), `sudoku_medium`
(9x9, medium: MediumSudoku), `sudoku_4x4` and `sudoku_4x4_medium` (4x4 grids, small enough for
a tiny model and quick tests)."""

from envs_jax.base import EnvSettings
from envs_jax.registry import register
from envs_jax.sudoku.env import Sudoku, State
from envs_jax.sudoku.parse import Move, parse_move

# The original's SimpleSudoku / MediumSudoku (envs.yaml: 20 / 30 moves, 150 tokens announced;
# base.yaml: 5 turns, 2 actions per turn).
_EASY = EnvSettings(max_turns=5, max_actions_per_turn=2, max_actions_per_traj=20,
                    announced_tokens=150)
_MEDIUM = EnvSettings(max_turns=5, max_actions_per_turn=2, max_actions_per_traj=30,
                      announced_tokens=150)
register("sudoku", Sudoku, settings=_EASY, box=3, difficulty="easy")
register("sudoku_medium", Sudoku, settings=_MEDIUM, box=3, difficulty="medium")
register("sudoku_4x4", Sudoku, settings=_EASY, box=2, difficulty="easy", max_steps=16)
register("sudoku_4x4_medium", Sudoku, settings=_MEDIUM, box=2, difficulty="medium",
         max_steps=16)

__all__ = ["Move", "State", "Sudoku", "parse_move"]
