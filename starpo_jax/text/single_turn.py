"""The single_turn context mode's prompt inside jit (rollout.context_window_mode).

The prompt of turn t (1-based) is one user message (templates.single_turn_user): the intro,
then, when earlier turns h..t-1 are shown, the original's memory text (a summary and, per turn,
"Turn j State: ... Turn j Action: <reply> Turn j Reward: ..."), then the current turn. The
earlier replies are the model's own tokens, spliced in between four blocks (text with grid,
number and reward slots, blocks.py):

    alone                                  when no earlier turn is shown
    head reply_h (between reply_j)* tail   otherwise

head ends with the summary, turn h's state and "Turn h Action: " + the forced prefix; between
holds turn j's reward and turn j+1's state up to its action's forced prefix; tail the last
shown turn's reward and the current turn. The whole is the tokenizer's encoding of the text
when, as for the full mode's replies, each spliced reply is the tokenizer's own encoding of its
text and its ends are cuts (for byte-level BPEs of the GPT-2 kind: a reply ending in "</answer>"
before "\nTurn"); a reply's closing EOS is left out, as the original decodes replies with
skip_special_tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from starpo_jax.text import blocks as bk
from starpo_jax.text.templates import (SINGLE_TURN_CURRENT, SINGLE_TURN_ENTRY,
                                       SINGLE_TURN_SUMMARY, PromptTemplate)


class SingleTurn(flax.struct.PyTreeNode):
    """The four blocks of single_turn prompts (see the module docstring)."""

    alone: bk.Block
    head: bk.Block
    between: bk.Block
    tail: bk.Block

    def prompt(self, states: dict[str, jax.Array], left: jax.Array, rewards: jax.Array,
               replies: jax.Array, reply_lengths: jax.Array, turn: jax.Array, first: jax.Array,
               most: int) -> tuple[jax.Array, jax.Array]:
        """One row's prompt of turn index `turn` (0-based) showing turns first..turn-1.

        states: {slot: [T, width] int32} each turn's observation slots (the codec's `_state`);
        left [T] int32 budgets shown; rewards [T] float32; replies [T, R] int32 (after the
        forced prefix), reply_lengths [T] int32 (a closing EOS not counted); turn, first []
        int32, turn - most <= first <= turn; most: static. Returns (ids [W] int32 (-1
        padded), length [] int32), W static.
        """
        at = lambda k: {name: ids[k] for name, ids in states.items()}  # noqa: E731
        number = bk.int_symbols
        alone = _encode(self.alone, {**at(turn), "turn": number(turn + 1),
                                     "actions_left": number(left[turn])})
        shown = turn - first
        pieces = [_encode(self.head, {**at(first), "completed": number(turn),
                                      "shown": number(shown), "turn": number(first + 1)})]
        count = most
        for s in range(count):
            j = jnp.minimum(first + s, replies.shape[0] - 1)
            used = s < shown
            pieces.append((replies[j], jnp.where(used, reply_lengths[j], 0)))
            if s + 1 < count:
                nxt = jnp.minimum(j + 1, replies.shape[0] - 1)
                ids, n = _encode(self.between, {**at(nxt), "turn": number(j + 1),
                                                "reward": bk.reward_symbols(rewards[j]),
                                                "next_turn": number(j + 2)})
                pieces.append((ids, jnp.where(s + 1 < shown, n, 0)))
        last = jnp.maximum(turn - 1, 0)
        pieces.append(_encode(self.tail, {**at(turn), "turn": number(turn),
                                          "reward": bk.reward_symbols(rewards[last]),
                                          "next_turn": number(turn + 1),
                                          "actions_left": number(left[turn])}))
        ids, n = bk.concat_pieces(pieces)
        width = max(ids.shape[0], alone[0].shape[0])
        ids = jnp.pad(ids, (0, width - ids.shape[0]), constant_values=-1)
        alone_ids = jnp.pad(alone[0], (0, width - alone[0].shape[0]), constant_values=-1)
        return jnp.where(shown > 0, ids, alone_ids), jnp.where(shown > 0, n, alone[1])


def _encode(block: bk.Block, values: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """Block.encode with a repeated slot's later places ("turn#2") given the same value."""
    return block.encode({name: values[name.split("#")[0]] for name in block.slot_names})


def _numbered(parts: list[str | bk.Slot]) -> list[str | bk.Slot]:
    """Repeated slots get names of their own ("turn", "turn#2"): a block's slots are places."""
    seen: dict[str, int] = {}
    out = []
    for part in parts:
        if isinstance(part, bk.Slot):
            seen[part.name] = seen.get(part.name, 0) + 1
            if seen[part.name] > 1:
                part = dataclasses.replace(part, name=f"{part.name}#{seen[part.name]}")
        out.append(part)
    return out


def build_single_turn(tokenizer: Any, template: PromptTemplate, chat: dict[str, str],
                      intro: str, state: list, forced_prefix: str, max_tokens: int,
                      split: Any, verify: int) -> SingleTurn:
    """Host: the blocks for this tokenizer, template and env (`state`: the observation's block
    parts; `split`: codec._split), each verified against tokenizer.encode."""
    number = lambda name: bk.Slot(name, bk.NUMBER_SYMBOLS, bk.sample_int)  # noqa: E731
    turn, left, next_turn = number("turn"), number("actions_left"), number("next_turn")
    reward = bk.Slot("reward", bk.NUMBER_SYMBOLS, bk.sample_reward)
    before, after = SINGLE_TURN_ENTRY.split("{reply}")
    opening = chat["start"] + template.system + chat["system_to_user"] + intro
    current = split(template.single_turn.replace("{max_tokens}", str(max_tokens)),
                    {"turn": next_turn, "state": state, "actions_left": left})
    parts = {
        "alone": [opening, *split(template.single_turn.replace("{max_tokens}", str(max_tokens)),
                                  {"turn": turn, "state": state, "actions_left": left}),
                  chat["user_to_assistant"]],
        "head": [opening, *split(SINGLE_TURN_SUMMARY, {"completed": number("completed"),
                                                       "shown": number("shown")}),
                 *split(before, {"turn": turn, "state": state}), forced_prefix],
        "between": [*split(after, {"turn": turn, "reward": reward}),
                    *split(before, {"turn": next_turn, "state": state}), forced_prefix],
        "tail": [*split(after, {"turn": turn, "reward": reward}), SINGLE_TURN_CURRENT, *current,
                 chat["user_to_assistant"]],
    }
    return SingleTurn(**{name: bk.build_block(tokenizer, _numbered(p), verify=verify)
                         for name, p in parts.items()})
