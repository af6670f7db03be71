"""The 2x2 Rubik's cube (pocket cube) as RAGEN plays it (ragen/env/rubikscube), on jumanji's
RubiksCube(cube_size=2).

- Reset: a solved cube scrambled by `scramble_depth` turns, each uniform over the twelve
  quarter turns (the original's; jumanji's own scrambler also draws half turns, 100 of them).
- Actions: U, U', D, D', L, L', R, R', F, F', B, B' (the original's order); a letter turns that
  face 90 degrees clockwise looking at it, a prime back. B and B' are the original's by
  default, which are not rigid turns (envs_jax.rubiks_cube.moves; moves="jumanji" for
  jumanji's).
- Reward 1.0 on the step that leaves every face one colour, else 0.0 (jumanji's SparseRewardFn
  and the original's). The episode ends then, or after `max_steps` steps (jumanji's
  time_limit, the original's max_steps). Every action is effective (the original's).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jumanji.environments import RubiksCube as JumanjiRubiksCube
from jumanji.environments.logic.rubiks_cube.utils import flatten_action, is_solved

from envs_jax.catalog import BUILTIN
from envs_jax.jumanji_text import JumanjiTextEnv
from envs_jax.rubiks_cube import moves, render

# The original's env_instruction (config/envs.yaml, a YAML block: its newlines kept).
INSTRUCTIONS = (
    "You are solving a 2x2 Rubik's Cube (Pocket Cube). The goal is to restore the cube so that "
    "each of the faces consists of a single, unique color.\nAvailable actions use standard "
    "Singmaster notation for face rotations: U, U', D, D', L, L', R, R', F, F', B, B'.\n"
    "- Faces: U (Up), D (Down), L (Left), R (Right), F (Front), B (Back).\n- Modifiers: A "
    "letter alone means 90\u00b0 clockwise (e.g., 'R'). A letter with prime (') means 90\u00b0 "
    "counter-clockwise (e.g., \"R'\").\nRespond with a sequence of actions separated by "
    "\"||\".\nExample: <answer>U</answer>\n"
)


class _Cube(JumanjiRubiksCube):
    """jumanji's 2x2 RubiksCube with the original's scramble and (moves="ragen") B turns."""

    def __init__(self, scramble_depth: int, max_steps: int, moves_rule: str) -> None:
        self.fix = jnp.asarray(moves.fixups(moves_rule))
        # Flattened jumanji action (18 moves) -> word index (-1: a half turn, no word).
        words = np.full(18, -1, np.int32)
        for i, value in enumerate(moves.ACTION_VALUES):
            words[flatten_action(value, 2)] = i
        self.words = jnp.asarray(words)
        super().__init__(generator=moves.QuarterTurnScramble(scramble_depth, moves_rule),
                         time_limit=max_steps)

    def step(self, state, action):
        next_state, timestep = super().step(state, action)
        word = self.words[flatten_action(jnp.asarray(action, jnp.int32), 2)]
        # Half turns (no word) keep jumanji's stickers; fix-ups only permute within faces, so
        # jumanji's reward and termination stand.
        fix = jnp.where(word >= 0, self.fix[jnp.maximum(word, 0)], jnp.arange(24))
        cube = next_state.cube.reshape(-1)[fix].reshape(next_state.cube.shape)
        observation = timestep.observation._replace(cube=cube)
        return next_state.replace(cube=cube), timestep.replace(observation=observation)


class RubiksCube2x2(JumanjiTextEnv):
    """Restore a scrambled 2x2 cube with face turns (module docstring)."""

    settings = BUILTIN["rubiks_cube_2x2"]

    def __init__(self, scramble_depth: int = 5, max_steps: int = 20, moves: str = "ragen") -> None:
        """scramble_depth >= 0 quarter turns from solved; 1 <= max_steps <= 999; moves: "ragen"
        (the original's B / B') or "jumanji" (rigid ones)."""
        if isinstance(scramble_depth, bool) or not isinstance(scramble_depth, int) \
                or scramble_depth < 0:
            raise ValueError(f"scramble_depth must be an int >= 0; got {scramble_depth!r}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) \
                or not 1 <= max_steps <= 10**render.STEP_WIDTH - 1:
            raise ValueError(f"max_steps must be an int in 1..999; got {max_steps!r}")
        if moves not in _MOVES:
            raise ValueError(f"moves must be one of {_MOVES}; got {moves!r}")
        self.scramble_depth, self.moves = scramble_depth, moves
        super().__init__(
            _Cube(scramble_depth, max_steps, moves),
            action_names=_ACTION_NAMES,
            action_values=_ACTION_VALUES,
            observation_parts=render.observation_parts(max_steps),
            render=lambda s: render.render(s.cube, s.step_count, max_steps),
            success=lambda s, a, s2, ts: is_solved(s2.cube),
            effective=lambda s, a, s2, ts: jnp.bool_(True),
            instructions=INSTRUCTIONS,
            max_steps=max_steps,
        )

    def solver_policy(self, max_actions_per_turn: int):
        """The "solver" policy (starpo_jax.rollout.policies): an optimal plan's first moves."""
        from envs_jax.rubiks_cube.solver import solver_policy

        return solver_policy(self, max_actions_per_turn)

    def _describe(self) -> str:
        return (f"scramble_depth={self.scramble_depth}, max_steps={self.max_steps}, "
                f"moves={self.moves!r}")


_MOVES, _ACTION_NAMES, _ACTION_VALUES = moves.MOVES, moves.ACTION_NAMES, moves.ACTION_VALUES
