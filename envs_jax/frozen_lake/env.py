"""FrozenLake as RAGEN plays it: gymnasium's slippery rules on a new random map every reset.

Observations in RAGEN's formats (envs_jax.coords): "grid", "coord" (start, goal, player /
player on goal / player in hole, holes, as RAGEN reads its map `desc`: the start stays the
start after the player leaves it) or "grid_coord" (both).
"""

from __future__ import annotations

from functools import cached_property, partial

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jumanji import specs
from jumanji.types import StepType, TimeStep

from envs_jax.base import TextEnv
from envs_jax.coords import CoordinateFormats, CoordinateLines
from envs_jax.frozen_lake.generator import RandomMapGenerator
from envs_jax.frozen_lake.types import (
    ACTION_NAMES,
    FROZEN,
    GOAL,
    HOLE,
    MOVES,
    PLAYER,
    PLAYER_IN_HOLE,
    PLAYER_ON_GOAL,
    SYMBOL_STRINGS,
    Observation,
    State,
    symbol_grid,
)

# The original's env_instruction (config/envs.yaml, its typos included); the prompt adds the
# symbol legend, the actions and the action budget after it.
INSTRUCTIONS = (
    "You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You may move "
    "to the unintended direction due to the slippery ice. Example answer format: <think>To "
    "forbid the hole and go to the target, I should go left then go up.</think><answer>Left || "
    "Up</answer>"
)
# CoordFrozenLake's env_instruction (RAGEN config/envs.yaml, a YAML `|` block: its final newline
# kept). It says "(5, 5)" although that env's board is RAGEN's default 4x4 (corner (3, 3)):
# the original's text, word for word.
COORD_INSTRUCTIONS = (
    "You are solving the FrozenLake puzzle. The observation includes both a symbol grid and "
    "zero-indexed coordinates for the start, goal, player, and any holes.\n"
    "Coordinates range from the top-left corner (0, 0) to the bottom-right corner (5, 5).\n"
    "Beware that the ice is slippery, so the agent might slide and end up in an unintended "
    "tile.\n"
    "Respond with a sequence of actions such as <answer>Left || Up || Up</answer>.\n"
)
# The coordinate lines' labels in RAGEN's order (frozen_lake/utils.py format_coordinate_render).
COORDINATE_LABELS = ("Start", "Goal", "Player", "Player on goal", "Player in hole", "Holes")
# gymnasium's FrozenLake-v1 default: with is_slippery, each of the three directions 1/3.
GYMNASIUM_SUCCESS_RATE = 1.0 / 3.0
# The original's grid_vocab: "_" is "empty" there (a frozen tile).
MEANINGS = ("player", "empty", "hole", "goal", "player in hole", "player on goal")

# Tile under each symbol, for parsing text maps (the player symbols say what they stand on).
_TILE_OF_SYMBOL = {"P": FROZEN, "_": FROZEN, "O": HOLE, "G": GOAL, "X": HOLE, "√": GOAL}
_PLAYER_SYMBOLS = {SYMBOL_STRINGS[i] for i in (PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL)}


class FrozenLake(CoordinateFormats, TextEnv[State, Observation]):
    """Reach the goal on slippery ice without falling into a hole.

    - Map: `size` x `size`, each tile frozen with probability `p`, start and goal on distinct
      random cells, a start-to-goal path guaranteed; a new map at every reset.
    - Actions (gymnasium's ids): 0 Left, 1 Down, 2 Right, 3 Up. With `slippery` the player moves
      in the intended direction with probability `success_rate`, else in either perpendicular
      one, (1 - success_rate) / 2 each: gymnasium FrozenLake-v1's is_slippery and
      success_rate (default 1/3: each direction 1/3), which RAGEN passes on (its
      FrozenLakeEnvConfig.success_rate). slippery=False is success_rate=1.0 (never slips);
      moving off the grid leaves the player in place.
    - Reward 1 on reaching the goal, else 0. Terminates in a hole or at the goal (stepping a
      finished episode leaves it unchanged with reward 0, as gymnasium); truncates after
      `max_steps` steps. extras: `success` (player on the goal), `action_is_effective` (moved).
    """

    action_names = ACTION_NAMES
    symbol_strings = SYMBOL_STRINGS
    instructions = INSTRUCTIONS
    symbol_legend = tuple(zip(SYMBOL_STRINGS, MEANINGS))

    def __init__(
        self,
        size: int = 4,
        p: float = 0.8,
        slippery: bool = True,
        max_steps: int = 100,
        max_map_tries: int = 64,
        success_rate: float = GYMNASIUM_SUCCESS_RATE,
        observation_format: str = "grid",
        instructions: str | None = None,
    ) -> None:
        """size >= 2; 0 < p <= 1 (probability a tile is frozen); max_steps >= 1 (gymnasium's
        FrozenLake-v1 limit for 4x4 is 100; the original caps actions at 10 on the agent side);
        max_map_tries >= 1 redraws before a corridor is thawed instead; 0 <= success_rate <= 1
        (when slippery, see the class docstring); observation_format "grid", "coord" or
        "grid_coord"; instructions: the prompt's env instruction (None: the original's
        FrozenLake text)."""
        ints = (("size", size, 2), ("max_steps", max_steps, 1), ("max_map_tries", max_map_tries, 1))
        for label, value, least in ints:
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{label} must be an int >= {least}; got {value!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise ValueError(f"p (probability a tile is frozen) must be in (0, 1]; got {p!r}")
        if not isinstance(slippery, bool):
            raise ValueError(f"slippery must be a bool; got {slippery!r}")
        if (isinstance(success_rate, bool) or not isinstance(success_rate, (int, float))
                or not 0.0 <= success_rate <= 1.0):
            raise ValueError(f"success_rate (probability of moving as intended) must be in "
                             f"[0, 1]; got {success_rate!r}")
        if instructions is not None:
            if not isinstance(instructions, str):
                raise ValueError(f"instructions must be a str; got {instructions!r}")
            self.instructions = instructions
        self.success_rate = float(success_rate)
        self.size = size
        self.p = float(p)
        self.slippery = slippery
        self.max_steps = max_steps
        self.generator = RandomMapGenerator(size, self.p, max_map_tries)
        # Start, goal and player: one cell each; holes: at most all other cells but the goal.
        self._setup_formats(observation_format, CoordinateLines(
            COORDINATE_LABELS, size, size, size * size + 2,
            partial(_random_lakes, size=size), exclusive=((2, 3, 4),)),
            wide_cells=1)  # the player on the goal: "√" (3 bytes)
        super().__init__()

    def _describe(self) -> str:
        rate = ("" if self.success_rate == GYMNASIUM_SUCCESS_RATE
                else f", success_rate={self.success_rate}")
        shown = ("" if self.observation_format == "grid"
                 else f", observation_format={self.observation_format!r}")
        return (f"size={self.size}, p={self.p}, slippery={self.slippery}{rate}, "
                f"max_steps={self.max_steps}{shown}")

    def reset(self, key: chex.PRNGKey) -> tuple[State, TimeStep[Observation]]:
        """A new random map with the player on its start. key: PRNG key."""
        return self._restart(self.generator(key))

    def step(self, state: State, action: chex.Array) -> tuple[State, TimeStep[Observation]]:
        """One move. action: [] int32 in 0..3 (Left, Down, Right, Up)."""
        slip_key, next_key = jax.random.split(state.key)
        # A split key's words are already uniform bits: reading one instead of hashing again
        # with randint doubles the batched step rate. gymnasium's default 1/3 each reads it
        # mod 3 (bias 2**-32); another success_rate compares its top 24 bits with thresholds.
        bits = jax.random.key_data(slip_key)[..., 0]
        if self.success_rate == GYMNASIUM_SUCCESS_RATE:
            slip = (bits % 3).astype(jnp.int32) - 1
        else:
            u = (bits >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)  # [0, 1)
            side = jnp.float32(self.success_rate + (1.0 - self.success_rate) / 2)
            slip = jnp.where(u < jnp.float32(self.success_rate), 0,
                             jnp.where(u < side, -1, 1)).astype(jnp.int32)
        slip = slip if self.slippery else 0
        direction = (jnp.asarray(action, jnp.int32) + slip) % 4
        moved = jnp.clip(state.player + jnp.asarray(MOVES, jnp.int32)[direction], 0, self.size - 1)
        finished = state.tiles[state.player[0], state.player[1]] != FROZEN
        player = jnp.where(finished, state.player, moved)
        tile = state.tiles[player[0], player[1]]

        reward = jnp.where(~finished & (tile == GOAL), 1.0, 0.0).astype(jnp.float32)
        step_count = state.step_count + 1
        terminated = tile != FROZEN
        done = terminated | (step_count >= self.max_steps)
        next_state = state.replace(player=player, step_count=step_count, key=next_key)
        timestep = TimeStep(
            step_type=jnp.where(done, StepType.LAST, StepType.MID),
            reward=reward,
            discount=jnp.where(terminated, 0.0, 1.0).astype(jnp.float32),
            observation=self._observe(next_state),
            extras={
                "success": tile == GOAL,
                "action_is_effective": jnp.any(player != state.player),
            },
        )
        return next_state, timestep

    def render_symbols(self, state: State) -> chex.Array:
        """[S, S] int32 ids into `symbol_strings`, or in a coordinate format {"coords": [width]
        (, "grid": [S * (S + 1) - 1])} (envs_jax.coords)."""
        return self._format_symbols(state)

    def _grid_symbols(self, state: State) -> chex.Array:
        return symbol_grid(state.tiles, state.player)

    def _coordinate_masks(self, state: State) -> chex.Array:
        """bool [6, S, S]: start, goal, player (on ice), player on goal, player in hole, holes
        (RAGEN's collect_entity_coordinates on its desc)."""
        cells = jnp.arange(self.size)
        at = lambda p: (cells[:, None] == p[0]) & (cells[None, :] == p[1])  # noqa: E731
        player, goal, hole = at(state.player), state.tiles == GOAL, state.tiles == HOLE
        return jnp.stack([at(state.start), goal, player & ~goal & ~hole, player & goal,
                          player & hole, hole])

    def dead_end(self, state: State) -> chex.Array:
        """bool []: the player fell into a hole (the episode ended without success)."""
        return state.tiles[state.player[0], state.player[1]] == HOLE

    def reset_from_text(self, text: str, key: chex.PRNGKey) -> tuple[State, TimeStep[Observation]]:
        """A state from a `render_text` grid: size rows of size symbols, one goal, one player
        (of a grid_coord observation, the grid after "Grid Map:").

        The player's cell becomes the start. key seeds the slippery transitions.
        """
        rows = self._grid_text(text).strip("\n").split("\n")
        if len(rows) != self.size or any(len(row) != self.size for row in rows):
            shape = [len(row) for row in rows]
            raise ValueError(
                f"expected {self.size} rows of {self.size} symbols; "
                f"got {len(rows)} rows of lengths {shape}"
            )
        bad = sorted({c for row in rows for c in row} - set(_TILE_OF_SYMBOL))
        if bad:
            raise ValueError(f"unknown symbols {bad}; valid symbols are {list(SYMBOL_STRINGS)}")
        cells = [(r, c, ch) for r, row in enumerate(rows) for c, ch in enumerate(row)]
        players = [(r, c) for r, c, ch in cells if ch in _PLAYER_SYMBOLS]
        goals = sum(_TILE_OF_SYMBOL[ch] == GOAL for _, _, ch in cells)
        if len(players) != 1 or goals != 1:
            raise ValueError(
                f"a map needs exactly one player (P, X or √) and one goal (G or √); "
                f"got {len(players)} players and {goals} goals in\n{text}"
            )
        tiles = np.array([[_TILE_OF_SYMBOL[ch] for ch in row] for row in rows], np.int32)
        start = jnp.asarray(players[0], jnp.int32)
        state = State(
            tiles=jnp.asarray(tiles), start=start, player=start, step_count=jnp.int32(0), key=key
        )
        return self._restart(state)

    def _restart(self, state: State) -> tuple[State, TimeStep[Observation]]:
        timestep = TimeStep(
            step_type=StepType.FIRST,
            reward=jnp.float32(0.0),
            discount=jnp.float32(1.0),
            observation=self._observe(state),
            extras={"success": jnp.bool_(False), "action_is_effective": jnp.bool_(False)},
        )
        return state, timestep

    def _observe(self, state: State) -> Observation:
        return Observation(grid=self._grid_symbols(state), step_count=state.step_count)

    @cached_property
    def observation_spec(self) -> specs.Spec[Observation]:
        return specs.Spec(
            Observation,
            "ObservationSpec",
            grid=specs.BoundedArray(
                (self.size, self.size), jnp.int32, 0, len(SYMBOL_STRINGS) - 1, "grid"
            ),
            step_count=specs.BoundedArray((), jnp.int32, 0, self.max_steps, "step_count"),
        )


def _random_lakes(rng: np.random.Generator, count: int, *, size: int) -> np.ndarray:
    """bool [count, 6, size, size] (`_coordinate_masks`' kinds) of random lakes: holes of a
    random density, start and goal on distinct cells, the player anywhere (on the start,
    the goal or in a hole more often than by chance)."""
    out = np.zeros((count, 6, size * size), bool)
    for i in range(count):
        start, goal = rng.choice(size * size, 2, replace=False)
        holes = rng.random(size * size) < rng.uniform(0.0, 0.6)
        holes[[start, goal]] = False
        pick = rng.random()
        player = start if pick < 0.25 else goal if pick < 0.4 else int(rng.integers(size * size))
        out[i, 0, start], out[i, 1, goal], out[i, 5] = True, True, holes
        out[i, 2 + (player == goal) + 2 * bool(holes[player]), player] = True
    return out.reshape(count, 6, size, size)
