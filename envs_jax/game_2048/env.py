"""2048 as RAGEN plays it (ragen/env/game_2048), on jumanji's Game2048.

Where jumanji's game and the original's differ, the original's rule is the default:
- Start: the original spawns two tiles on an empty board, jumanji one (`start_tiles`, default
  2). A spawned tile is a 2 with probability `two_prob` (the original's config, 0.9), else a 4,
  in a uniformly random empty cell: jumanji's rule, with its fixed 0.9 made a parameter.
- Reward: jumanji's is the merged tiles' sum; the original's is that sum for a move that moves,
  `invalid_act_score` (-0.1) for one that does not, and with `use_log_reward` (default) the
  shaping log2(raw + 1) * 0.1 for a positive raw reward and 0.0 otherwise, so the -0.1
  penalty never reaches the agent unless use_log_reward=False.
- Termination: both end when no move is valid (the original checks after a move that moved,
  which is the same). Success (the original's info["success"]): the episode ended this way
  with a tile of 2048 or more; reaching 2048 earlier does not end it. No step limit (the
  original's agent side stops after 700 actions).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jumanji.environments import Game2048 as JumanjiGame2048

from envs_jax.catalog import BUILTIN
from envs_jax.game_2048 import render
from envs_jax.jumanji_text import JumanjiTextEnv

# The original's env_instruction (config/envs.yaml, a YAML block: its newlines kept).
INSTRUCTIONS = (
    "You are playing the 2048 game on a 4x4 grid. Merge equal tiles by sliding Up, Right, "
    "Down, or Left.\nIf a move is invalid (no tiles move), a small penalty is applied. Respond "
    "with a single action.\nExample: <answer>Up</answer>\n"
)
WIN_EXPONENT = 11  # 2 ** 11 = 2048, the original's success tile


class _Board(JumanjiGame2048):
    """jumanji's Game2048 with the original's start (`start_tiles`) and spawn odds."""

    def __init__(self, board_size: int, two_prob: float, start_tiles: int) -> None:
        self.two_prob = two_prob
        self.start_tiles = start_tiles
        super().__init__(board_size=board_size)

    def _generate_board(self, key: chex.PRNGKey) -> chex.Array:
        board = jnp.zeros((self.board_size, self.board_size), jnp.int32)
        for k in range(self.start_tiles):
            board = self._add_random_cell(board, jax.random.fold_in(key, k))
        return board

    def _add_random_cell(self, board: chex.Array, key: chex.PRNGKey) -> chex.Array:
        cell_key, value_key = jax.random.split(key)
        empty = jnp.ravel(board == 0)
        cell = jax.random.choice(cell_key, empty.shape[0], p=empty / jnp.maximum(empty.sum(), 1))
        exponent = jnp.where(jax.random.uniform(value_key) < self.two_prob, 1, 2)
        return board.at[jnp.divmod(cell, self.board_size)].set(exponent.astype(board.dtype))


class Game2048(JumanjiTextEnv):
    """Slide the tiles of a `size` x `size` board Up / Right / Down / Left (module docstring)."""

    settings = BUILTIN["game_2048"]

    def __init__(self, size: int = 4, two_prob: float = 0.9, use_log_reward: bool = True,
                 invalid_act_score: float = -0.1, start_tiles: int = 2) -> None:
        """size in 2..4 (the board's side; 4x4 scores fit int32 digits, larger boards would not);
        0 <= two_prob <= 1; start_tiles in 1..size*size (jumanji: 1, the original: 2)."""
        if isinstance(size, bool) or not isinstance(size, int) or not 2 <= size <= 4:
            raise ValueError(f"size must be an int in 2..4; got {size!r}")
        if isinstance(two_prob, bool) or not isinstance(two_prob, (int, float)) \
                or not 0.0 <= two_prob <= 1.0:
            raise ValueError(f"two_prob (the chance a new tile is a 2) must be in [0, 1]; got "
                             f"{two_prob!r}")
        if not isinstance(use_log_reward, bool):
            raise ValueError(f"use_log_reward must be a bool; got {use_log_reward!r}")
        if isinstance(invalid_act_score, bool) or not isinstance(invalid_act_score, (int, float)):
            raise ValueError(f"invalid_act_score must be a number; got {invalid_act_score!r}")
        if isinstance(start_tiles, bool) or not isinstance(start_tiles, int) \
                or not 1 <= start_tiles <= size * size:
            raise ValueError(f"start_tiles must be an int in 1..{size * size}; got "
                             f"{start_tiles!r}")
        self.size, self.two_prob, self.start_tiles = size, float(two_prob), start_tiles
        self.use_log_reward, self.invalid_act_score = use_log_reward, float(invalid_act_score)
        width = render.tile_digits(size)
        super().__init__(
            _Board(size, self.two_prob, start_tiles),
            action_names=render.ACTION_NAMES,
            observation_parts=render.observation_parts(size),
            render=lambda s: {
                **{f"row{r + 1}": render.row_ids(s.board[r], width) for r in range(size)},
                "menu": render.menu_ids(s.action_mask),
                "score": render._number(s.score.astype(jnp.int32), render.score_digits(size)),
            },
            reward=self._reward,
            success=lambda s, a, s2, ts: s.action_mask[a] & ts.last()
            & (jnp.max(s2.board) >= WIN_EXPONENT),
            effective=lambda s, a, s2, ts: s.action_mask[a],
            dead_end=lambda s: ~jnp.any(s.action_mask) & (jnp.max(s.board) < WIN_EXPONENT),
            instructions=INSTRUCTIONS,
        )

    def _reward(self, state, action, next_state, timestep) -> chex.Array:
        """The original's: the merged sum, or the invalid-move score; log-shaped by default."""
        raw = jnp.where(state.action_mask[action], timestep.reward, self.invalid_act_score)
        if not self.use_log_reward:
            return raw
        return jnp.where(raw > 0, jnp.log2(raw + 1.0) * 0.1, 0.0)

    def _describe(self) -> str:
        return (f"size={self.size}, two_prob={self.two_prob}, use_log_reward="
                f"{self.use_log_reward}, start_tiles={self.start_tiles}")
