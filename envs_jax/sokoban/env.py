"""Sokoban as a pure-JAX jumanji environment with the original's (gym-sokoban's) rules.

An action pushes the box ahead if the cell beyond it is free floor or target, else walks if the
cell ahead is free. Every step costs 0.1; a box arriving on a target pays +1, one leaving pays -1
(at most one of them per step, as only one box moves); solving pays +10 and terminates; the
episode is truncated after `max_steps` actions. Cells off the grid count as walls.

Observations in RAGEN's formats (envs_jax.coords): "grid" (the symbol grid), "coord" (the
coordinate lines: targets, boxes, boxes on target, player, player on target) or "grid_coord"
(both).
"""

from __future__ import annotations

from functools import cached_property, partial

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jumanji import specs
from jumanji.types import StepType, TimeStep, restart

from envs_jax.base import TextEnv
from envs_jax.coords import CoordinateFormats, CoordinateLines
from envs_jax.sokoban import constants as c
from envs_jax.sokoban.deadlock import has_deadlock
from envs_jax.sokoban.generator import GeneratorConfig, generate
from envs_jax.sokoban.levels import layers_from_symbols, parse_symbols
from envs_jax.sokoban.types import Observation, State

_MIN_SIDE, _MAX_SIDE = 5, 32


def _check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int; got {value!r}")
    if value < low or (high is not None and value > high):
        valid = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name}={value} is out of range; valid: {valid}")
    return int(value)


class Sokoban(CoordinateFormats, TextEnv[State, Observation]):
    """Push every box onto a target; levels come from the in-JAX generator (see generator.py).

    Args:
      dim_room: (rows, cols) of the room, walls included; each side in [5, 32].
      num_boxes: boxes (and targets), 1 <= num_boxes <= cols - 2.
      max_steps: actions before truncation.
      search_depth: the original's reverse-search depth (pulls up to search_depth - 2).
      symbols: the 7 strings of wall, empty, target, box on target, box, player,
        player on target (constants.SYMBOLS or NEW_VOCAB_SYMBOLS).
      max_gen_attempts: cap on level draws (attempts) per level before the fixed fallback
        level.
      num_playouts, playout_length: the generator's reverse search (defaults calibrated to the
        original's difficulty; playout_length defaults to min(search_depth - 2, 40)).
      gen_slot_divisor: under vmap over B keys, each retry round draws ceil(B / divisor)
        attempts side by side, shared by the levels still pending.
      gen_screen_rooms: rooms carved per attempt; the first that can possibly score is
        played out (see generator._room).
      observation_format: "grid", "coord" or "grid_coord" (RAGEN's; module docstring).
      instructions: the prompt's env instruction (None: the original's Sokoban text,
        constants.INSTRUCTIONS).
    """

    action_names = c.ACTION_NAMES
    instructions = c.INSTRUCTIONS

    def __init__(
        self,
        dim_room: tuple[int, int] = (6, 6),
        num_boxes: int = 1,
        max_steps: int = 100,
        search_depth: int = 300,
        symbols: tuple[str, ...] = c.SYMBOLS,
        max_gen_attempts: int = 64,
        num_playouts: int = 16,
        playout_length: int | None = None,
        gen_slot_divisor: int = 4,
        gen_screen_rooms: int = 4,
        observation_format: str = "grid",
        instructions: str | None = None,
    ):
        if not (isinstance(dim_room, (tuple, list)) and len(dim_room) == 2):
            raise ValueError(f"dim_room must be a (rows, cols) pair; got {dim_room!r}")
        rows = _check_int("dim_room[0]", dim_room[0], _MIN_SIDE, _MAX_SIDE)
        cols = _check_int("dim_room[1]", dim_room[1], _MIN_SIDE, _MAX_SIDE)
        # The fallback level puts one box per interior column, so cols - 2 bounds num_boxes.
        if isinstance(num_boxes, (int, np.integer)) and num_boxes > cols - 2:
            raise ValueError(
                f"num_boxes={num_boxes} does not fit a room of dim_room={tuple(dim_room)}: "
                f"at most dim_room[1] - 2 = {cols - 2}"
            )
        num_boxes = _check_int("num_boxes", num_boxes, 1, cols - 2)
        self.max_steps = _check_int("max_steps", max_steps, 1)
        search_depth = _check_int("search_depth", search_depth, 3)
        symbols = tuple(symbols)
        if len(symbols) != 7 or len(set(symbols)) != 7 or not all(
            isinstance(s, str) and s for s in symbols
        ):
            raise ValueError(
                "symbols must be 7 distinct non-empty strings for "
                f"{', '.join(c.SYMBOL_MEANINGS)}; got {symbols!r}"
            )
        if playout_length is None:
            playout_length = min(search_depth - 2, 40)
        self.generator_config = GeneratorConfig(
            dim_room=(rows, cols),
            num_boxes=num_boxes,
            search_depth=search_depth,
            num_playouts=_check_int("num_playouts", num_playouts, 1),
            playout_length=_check_int("playout_length", playout_length, 1, search_depth - 2),
            max_attempts=_check_int("max_gen_attempts", max_gen_attempts, 1),
            slot_divisor=_check_int("gen_slot_divisor", gen_slot_divisor, 1),
            screen_rooms=_check_int("gen_screen_rooms", gen_screen_rooms, 1),
        )
        self.dim_room = (rows, cols)
        self.num_boxes = num_boxes
        self.symbol_strings = symbols
        self.symbol_legend = tuple(zip(symbols, c.SYMBOL_MEANINGS))
        if instructions is not None:
            if not isinstance(instructions, str):
                raise ValueError(f"instructions must be a str; got {instructions!r}")
            self.instructions = instructions
        # Kinds in RAGEN's line order; at most 2 * num_boxes + 1 cells (a level of
        # reset_from_text with more boxes is refused in the coordinate formats).
        self._setup_formats(observation_format, CoordinateLines(
            c.COORDINATE_LABELS, rows, cols, 2 * num_boxes + 1,
            partial(_random_boards, rows=rows, cols=cols, num_boxes=num_boxes),
            exclusive=((3, 4),)), wide_cells=num_boxes)  # a box on a target: "√" (3 bytes)
        super().__init__()

    def _describe(self) -> str:
        cfg = self.generator_config
        return (
            f"dim_room={self.dim_room}, num_boxes={self.num_boxes}, max_steps={self.max_steps}, "
            f"search_depth={cfg.search_depth}"
            + ("" if self.observation_format == "grid"
               else f", observation_format={self.observation_format!r}")
        )

    @cached_property
    def observation_spec(self) -> specs.Spec[Observation]:
        return specs.Spec(
            Observation,
            "ObservationSpec",
            grid=specs.BoundedArray(self.dim_room, jnp.int32, 0, c.PLAYER_ON_TARGET, "grid"),
            step_count=specs.BoundedArray((), jnp.int32, 0, self.max_steps, "step_count"),
        )

    def reset(self, key: chex.PRNGKey) -> tuple[State, TimeStep[Observation]]:
        """A fresh generated level (pure; jit/vmap-able)."""
        key, level_key = jax.random.split(key)
        level = generate(level_key, self.generator_config)
        return self._start(key, level.walls, level.targets, level.boxes, level.player)

    def reset_from_text(self, text: str, key: chex.PRNGKey) -> tuple[State, TimeStep[Observation]]:
        """The level drawn in `text` (this env's symbols, rows split by newlines; of a
        grid_coord observation, the grid after "Grid Map:").

        Raises ValueError for ragged rows, unknown symbols, a player count other than one,
        #boxes != #targets or no box, or a size other than dim_room; in the coordinate
        formats also for more boxes than num_boxes.
        """
        ids = parse_symbols(self._grid_text(text), self.symbol_strings)
        if ids.shape != self.dim_room:
            raise ValueError(f"level is {ids.shape[0]}x{ids.shape[1]}; this env's dim_room is "
                             f"{self.dim_room[0]}x{self.dim_room[1]}")
        layers = layers_from_symbols(ids)
        if self.observation_format != "grid" and layers.boxes.sum() > self.num_boxes:
            raise ValueError(f"level has {int(layers.boxes.sum())} boxes; this env lists the "
                             f"coordinates of num_boxes={self.num_boxes} at most")
        return self._start(
            key,
            jnp.asarray(layers.walls),
            jnp.asarray(layers.targets),
            jnp.asarray(layers.boxes),
            jnp.asarray(layers.player, jnp.int32),
        )

    def _start(self, key, walls, targets, boxes, player) -> tuple[State, TimeStep[Observation]]:
        state = State(
            key=key,
            walls=walls,
            targets=targets,
            boxes=boxes,
            player=player,
            step_count=jnp.int32(0),
            success=jnp.all(boxes == targets),
        )
        extras = {"success": state.success, "action_is_effective": jnp.bool_(False)}
        return state, restart(self._observation(state), extras)

    def step(self, state: State, action: chex.Array) -> tuple[State, TimeStep[Observation]]:
        """One action (int32 index into action_names); pure, jit/vmap-able."""
        move = jnp.asarray(c.MOVES, jnp.int32)[action]
        ahead = state.player + move
        beyond = ahead + move
        box_ahead = _cell(state.boxes, ahead, False)
        beyond_free = ~_cell(state.walls, beyond, True) & ~_cell(state.boxes, beyond, False)
        push = box_ahead & beyond_free
        walk = ~_cell(state.walls, ahead, True) & ~box_ahead
        moved = push | walk
        rows, cols = _coords(self.dim_room)
        at_ahead = (rows == ahead[0]) & (cols == ahead[1])
        at_beyond = (rows == beyond[0]) & (cols == beyond[1])
        boxes = jnp.where(push, (state.boxes & ~at_ahead) | at_beyond, state.boxes)

        on_before = jnp.sum(state.boxes & state.targets)
        on_after = jnp.sum(boxes & state.targets)
        success = jnp.all(boxes == state.targets)
        reward = (
            c.STEP_PENALTY
            + jnp.where(on_after > on_before, c.BOX_ON_TARGET_REWARD, 0.0)
            + jnp.where(on_after < on_before, c.BOX_OFF_TARGET_PENALTY, 0.0)
            + jnp.where(success, c.SOLVED_REWARD, 0.0)
        ).astype(jnp.float32)
        step_count = state.step_count + 1
        state = state.replace(
            boxes=boxes,
            player=jnp.where(moved, ahead, state.player),
            step_count=step_count,
            success=success,
        )
        done = success | (step_count >= self.max_steps)
        timestep = TimeStep(
            step_type=jnp.where(done, StepType.LAST, StepType.MID),
            reward=reward,
            # Solving terminates (discount 0); the step limit truncates (discount 1).
            discount=jnp.where(success, 0.0, 1.0).astype(jnp.float32),
            observation=self._observation(state),
            extras={"success": success, "action_is_effective": moved},
        )
        return state, timestep

    def render_symbols(self, state: State) -> chex.Array:
        """Symbol ids int32 [H, W] of the state (see constants), or in a coordinate format
        {"coords": [width] (, "grid": [H * (W + 1) - 1])} (envs_jax.coords)."""
        return self._format_symbols(state)

    def _grid_symbols(self, state: State) -> chex.Array:
        rows, cols = _coords(self.dim_room)
        is_player = (rows == state.player[0]) & (cols == state.player[1])
        ids = jnp.where(state.walls, c.WALL, c.EMPTY)
        ids = jnp.where(state.targets, c.TARGET, ids)
        ids = jnp.where(state.boxes, jnp.where(state.targets, c.BOX_ON_TARGET, c.BOX), ids)
        player = jnp.where(state.targets, c.PLAYER_ON_TARGET, c.PLAYER)
        return jnp.where(is_player, player, ids).astype(jnp.int32)

    def _coordinate_masks(self, state: State) -> chex.Array:
        """bool [5, H, W]: targets, boxes off target, boxes on target, player, player on
        target (RAGEN's collect_entity_coordinates)."""
        rows, cols = _coords(self.dim_room)
        player = (rows == state.player[0]) & (cols == state.player[1])
        t, b = state.targets, state.boxes
        return jnp.stack([t, b & ~t, b & t, player & ~t, player & t])

    def dead_end(self, state: State) -> chex.Array:
        """bool []: a box off target is in a corner or against a wall it can never leave
        (deadlock.py): the level can no longer be solved."""
        return has_deadlock(state.walls, state.targets, state.boxes)

    def _observation(self, state: State) -> Observation:
        return Observation(grid=self._grid_symbols(state), step_count=state.step_count)


def _random_boards(rng: np.random.Generator, count: int, *, rows: int, cols: int,
                   num_boxes: int) -> np.ndarray:
    """bool [count, 5, rows, cols] (`_coordinate_masks`' kinds) of random boards anywhere in
    the room: num_boxes targets (1..num_boxes in a quarter of them), some boxes on them, the
    player on a free target half the time it can be."""
    out = np.zeros((count, 5, rows * cols), bool)
    for i in range(count):
        n = int(rng.integers(1, num_boxes + 1)) if rng.random() < 0.25 else num_boxes
        cells = rng.permutation(rows * cols)
        on = int(rng.integers(0, n + 1))  # boxes on targets
        targets, boxes = cells[:n], np.concatenate([cells[:on], cells[n : 2 * n - on]])
        player = (cells[on] if on < n and rng.random() < 0.5 else cells[2 * n - on])
        out[i, 0, targets] = True
        out[i, 1, boxes] = True
        out[i, 1, targets] = False
        out[i, 2, cells[:on]] = True
        out[i, 3 + bool(np.isin(player, targets)), player] = True
    return out.reshape(count, 5, rows, cols)


def _coords(dim_room: tuple[int, int]) -> tuple[chex.Array, chex.Array]:
    """Row and column index grids, int32 [H, 1] and [1, W]."""
    return jnp.arange(dim_room[0])[:, None], jnp.arange(dim_room[1])[None, :]


def _cell(grid: chex.Array, pos: chex.Array, outside: bool) -> chex.Array:
    """grid[pos] for bool [H, W] and int32 [2], or `outside` when pos is off the grid."""
    h, w = grid.shape
    inside = (pos[0] >= 0) & (pos[0] < h) & (pos[1] >= 0) & (pos[1] < w)
    value = grid[jnp.clip(pos[0], 0, h - 1), jnp.clip(pos[1], 0, w - 1)]
    return jnp.where(inside, value, outside)
