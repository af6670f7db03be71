"""Sokoban (and its larger and new-vocabulary variants) as pure-JAX text environments."""

from envs_jax.catalog import BUILTIN
from envs_jax.registry import register
from envs_jax.sokoban.constants import COORD_INSTRUCTIONS, NEW_VOCAB_SYMBOLS, SYMBOLS
from envs_jax.sokoban.env import Sokoban
from envs_jax.sokoban.types import Observation, State

register("sokoban", Sokoban, settings=BUILTIN["sokoban"], dim_room=(6, 6), num_boxes=1,
         search_depth=300)
# Depth 10 allows only 8 pulls, so the DFS covers that small ball almost fully: many short
# playouts match its difficulty (median 6 moves; 128 gives noticeably easier levels).
register(
    "sokoban_large", Sokoban, settings=BUILTIN["sokoban_large"], dim_room=(8, 8), num_boxes=2,
    search_depth=10, num_playouts=256,
)
register(
    "sokoban_new_vocab",
    Sokoban,
    settings=BUILTIN["sokoban_new_vocab"],
    dim_room=(6, 6),
    num_boxes=1,
    search_depth=300,
    symbols=NEW_VOCAB_SYMBOLS,
)

# RAGEN's CoordSokoban: 6x6, one box, the grid and the coordinate lines (envs_jax.coords).
register(
    "coord_sokoban", Sokoban, settings=BUILTIN["coord_sokoban"], dim_room=(6, 6), num_boxes=1,
    max_steps=100, search_depth=300, observation_format="grid_coord",
    instructions=COORD_INSTRUCTIONS,
)

__all__ = ["NEW_VOCAB_SYMBOLS", "SYMBOLS", "Observation", "Sokoban", "State"]
