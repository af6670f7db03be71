"""Sudoku, registered as `sudoku` (9x9, easy: the original's SimpleSudoku), `sudoku_medium`
(9x9, medium: MediumSudoku), `sudoku_4x4` and `sudoku_4x4_medium` (4x4 grids, small enough for
a tiny model and quick tests)."""

from envs_jax.catalog import BUILTIN
from envs_jax.registry import register
from envs_jax.sudoku.env import Sudoku, State
from envs_jax.sudoku.parse import Move, parse_move

register("sudoku", Sudoku, settings=BUILTIN["sudoku"], box=3, difficulty="easy")
register("sudoku_medium", Sudoku, settings=BUILTIN["sudoku_medium"], box=3, difficulty="medium")
register("sudoku_4x4", Sudoku, settings=BUILTIN["sudoku_4x4"], box=2, difficulty="easy",
         max_steps=16)
register("sudoku_4x4_medium", Sudoku, settings=BUILTIN["sudoku_4x4_medium"], box=2,
         difficulty="medium", max_steps=16)

__all__ = ["Move", "State", "Sudoku", "parse_move"]
