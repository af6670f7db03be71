"""Bandit state, observation, action ids and the layout of its symbol table."""

from __future__ import annotations

import re
from typing import NamedTuple

import chex

# Action ids (static per env): the low-risk arm, then the high-risk arm.
LOW, HIGH = 0, 1
# Payout kinds of a pull: the low arm's fixed reward, a high-arm win, a high-arm miss.
PAID_LOW, PAID_HIGH_WIN, PAID_HIGH_MISS = 0, 1, 2
NOT_PULLED = -1

# Symbol ids. The state before the pull is the original's whole game text (its INIT_PROMPT),
# arm names in the presented order; after it, the feedback line. Every symbol starts at a
# word/punctuation boundary (names and numbers carry their leading space), so tokenising symbol
# by symbol matches tokenising the whole text for byte-level BPE tokenizers.
NAME = 0  # NAME + arm: the bare arm name (feedback line "Dragon: 1.0 points")
SPACED_NAME = 2  # SPACED_NAME + arm: " Dragon" (inside the game text)
GAME, AND, RULES, OUTPUT_LIKE, OR_ANSWER, END_ANSWER = 4, 5, 6, 7, 8, 9
COLON, POINTS = 10, 11
PAYOUT = 12  # PAYOUT + payout kind: the reward as the original prints it, " 0.1"
BLANK = 15  # empty string: pads the shorter feedback row to the menu's width
#: The original's game text (its INIT_PROMPT, trailing spaces and missing period included);
#: {a} and {b} are the arms in the presented order.
GAME_TEXT = (
    "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to "
    "pull. \nGame Rules: \n1. There are 2 arms, named {a} and {b}\n2. Each arm has its own "
    "reward distribution, related to their names. \n3. Analyze the symbolic meaning of each "
    "arm's name to guess how their reward distribution might behave.\n4. Based on the symbolic "
    "meaning of their names, which arm do you think is more likely to give higher rewards on "
    "average? Choose between {a} and {b}, and output like <answer> {a} </answer> or "
    "<answer> {b} </answer>.\n"
)
# The text between the names (" {a}" / " {b}" take their space along): a b a b a b.
_PIECES = re.split(r" \{[ab]\}", GAME_TEXT)
FIXED_STRINGS = (*_PIECES[:3], *_PIECES[4:], ":", " points")
ROW_WIDTH = 13


def symbol_strings(
    low_name: str, high_name: str, payouts: tuple[float, float, float]
) -> tuple[str, ...]:
    """The id -> text table for these arm names and payouts (low reward, high win, high miss)."""
    return (
        low_name,
        high_name,
        " " + low_name,
        " " + high_name,
        *FIXED_STRINGS,
        *(f" {float(x)}" for x in payouts),
        "",
    )


@chex.dataclass(frozen=True)
class State:
    """One bandit game.

    order:      [] int32, 0 if the low arm is presented first, 1 if the high arm is.
    pulled:     [] int32, NOT_PULLED or the action id (LOW / HIGH) of the pulled arm.
    payout:     [] int32, PAID_* kind of the pull (meaningless before it).
    step_count: [] int32.
    key:        PRNG key for the high arm's draw (and for auto-reset wrappers).
    """

    order: chex.Array
    pulled: chex.Array
    payout: chex.Array
    step_count: chex.Array
    key: chex.PRNGKey


class Observation(NamedTuple):
    """The state's text as symbol ids: [1, ROW_WIDTH] int32 (see `Bandit.render_symbols`)."""

    symbols: chex.Array
