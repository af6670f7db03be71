"""The conversation of a host env as token ids, on the host, with the real tokenizer.

    text = build_host_text(tokenizer, env, rollout_config)
    ids, cut = text.first_ids(observation, actions_left)          # turn 1's prompt
    ids, cut = text.later_ids(turn, reward, observation, actions_left)  # after reply turn-1
    actions, format_ok, think = text.parse(reply_ids)

The pieces are the JAX codec's (starpo_jax.text.codec), so that for the same messages

    first_ids + reply_1 + later_ids(2, ...) + reply_2 + ...

is `tokenizer.apply_chat_template(messages)` split at the replies, token for token: the chat
template's fixed text around each message (`chat_pieces`), the prompt template, the intro,
the reward format. Each piece is encoded whole by the tokenizer (no grid tables: any text).
Static widths: an observation gets `observation_tokens` tokens of room; a message that would
not fit has its observation cut (at the longest prefix, in characters, that fits) and is
reported as truncated. Replies are parsed with the JAX parser's rules (`reference_match`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from starpo_jax.config import RolloutConfig
from starpo_jax.text.codec import chat_pieces
from starpo_jax.text.parse import reference_items, reference_match
from starpo_jax.text.templates import (MAX_REWARD, PromptTemplate, default_template,
                                       intro_text, single_turn_user, user_message)
from starpo_jax.text.token_bytes import TokenBytes, cached_token_byte_table

# Room for the digits of turn numbers and budgets beyond the widest ones measured.
_SLACK = 8


@dataclasses.dataclass(frozen=True, eq=False)
class HostText:
    """Host-side text of one env and tokenizer (see the module docstring)."""

    tokenizer: Any
    template: PromptTemplate
    chat: dict[str, str]
    intro: str
    action_names: tuple[str, ...] | None
    forced_prefix_ids: tuple[int, ...]
    table: TokenBytes
    max_tokens: int  # the reply budget the prompt announces
    max_actions_per_turn: int
    first_width: int  # tokens of room for turn 1's prompt
    later_width: int  # tokens of room for each later message
    # The limited context modes: tokens of room for a turn's window (its context before the
    # forced prefix); 0 in the full mode.
    window_width: int = 0
    max_reply_bytes: int | None = None  # None: the whole reply (as the JAX parser)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def first_text(self, observation: str, actions_left: int, turn: int = 1) -> str:
        """The conversation's head up to the assistant header: system, then the intro and turn
        `turn`'s text (a limited context window opens at a later turn the same way)."""
        user = user_message(self.template, self.intro, turn, observation, actions_left,
                            self.max_tokens, None)
        return self._alone(user)

    def single_text(self, turn: int, observation: str, actions_left: int,
                    history: Sequence[tuple[str, str, float]]) -> str:
        """The single_turn mode's prompt of `turn`: system, one user message with the earlier
        turns shown (`history`: (state, reply text, reward) each) and the current one."""
        return self._alone(single_turn_user(self.template, self.intro, turn, observation,
                                            actions_left, self.max_tokens, history))

    def _alone(self, user: str) -> str:
        return (self.chat["start"] + self.template.system + self.chat["system_to_user"] + user
                + self.chat["user_to_assistant"])

    def later_text(self, turn: int, reward: float, observation: str, actions_left: int) -> str:
        user = user_message(self.template, self.intro, turn, observation, actions_left,
                            self.max_tokens, reward)
        return self.chat["assistant_to_user"] + user + self.chat["user_to_assistant"]

    def _fit(self, render, observation: str, width: int) -> tuple[list[int], bool]:
        ids = self.encode(render(observation))
        if len(ids) <= width:
            return ids, False
        low, high = 0, len(observation)  # the longest prefix that fits: in [low, high)
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if len(self.encode(render(observation[:mid]))) <= width \
                else (low, mid)
        ids = self.encode(render(observation[:low]))
        if len(ids) > width:
            raise ValueError(f"a message without its observation takes {len(ids)} tokens, more "
                             f"than its width {width}: {render('')!r:.300}")
        return ids, True

    def first_ids(self, observation: str, actions_left: int, turn: int = 1,
                  ) -> tuple[list[int], bool]:
        """Turn 1's prompt (template start .. assistant header; turn `turn`'s number) ->
        (ids, observation cut)."""
        return self._fit(lambda o: self.first_text(o, actions_left, turn), observation,
                         self.first_width)

    def single_ids(self, turn: int, observation: str, actions_left: int,
                   history: Sequence[tuple[str, str, float]], width: int,
                   ) -> tuple[list[int], bool]:
        """`single_text` in `width` tokens -> (ids, cut): the oldest turns of the history are
        left out until it fits (as the original fits max_model_len), then the observation is
        cut; cut is True when either happened."""
        shown = list(history)
        while shown:
            ids = self.encode(self.single_text(turn, observation, actions_left, shown))
            if len(ids) <= width:
                return ids, len(shown) < len(history)
            shown.pop(0)
        ids, cut = self._fit(lambda o: self.single_text(turn, o, actions_left, ()), observation,
                             width)
        return ids, cut or bool(history)

    def later_ids(self, turn: int, reward: float, observation: str, actions_left: int,
                  ) -> tuple[list[int], bool]:
        """End of reply turn-1 .. assistant header of `turn` -> (ids, observation cut)."""
        return self._fit(lambda o: self.later_text(turn, reward, o, actions_left), observation,
                         self.later_width)

    def reply_bytes(self, ids: Sequence[int]) -> bytes:
        t = self.table
        return b"".join(bytes(t.bytes[i, : t.lengths[i]]) for i in ids)

    def parse(self, reply_ids: Sequence[int]) -> tuple[list[str], bool, int]:
        """Reply (forced prefix included) -> (actions as text, format_ok, think tokens).

        With action names: the known items, as the names are spelled (format_ok: all known);
        free text: every item (format_ok: at least one). think tokens: reply tokens that
        overlap the thoughts (think mode), as the JAX parser counts them.
        """
        data = self.reply_bytes(reply_ids)
        match = reference_match(data, think=self.template.think, max_bytes=self.max_reply_bytes)
        if match is None:
            return [], False, 0
        items = reference_items(match, separator=self.template.action_sep,
                                max_actions=self.max_actions_per_turn)
        if self.action_names is None:
            actions, ok = items, bool(items)
        else:
            lower = {n.lower(): n for n in self.action_names}
            actions = [lower[s.lower()] for s in items if s.lower() in lower]
            ok = bool(items) and len(actions) == len(items)
        think = 0
        if self.template.think:
            lengths = self.table.lengths[np.asarray(reply_ids, np.int64)]
            ends = np.cumsum(lengths)
            starts = ends - lengths
            at = lambda i: len(match.string[:i].encode())  # noqa: E731  (char -> byte offset)
            think = int(np.sum((lengths > 0) & (starts < at(match.end(1)))
                               & (ends > at(match.start(1)))))
        return actions, ok, think


def build_host_text(tokenizer: Any, env: Any, config: RolloutConfig, *,
                    widths: tuple[int, int] | None = None, max_reply_bytes: int | None = None,
                    **template_overrides: Any) -> HostText:
    """HostText for a host env (its instructions, action_names, observation_tokens) and the
    rollout's mode, budgets and reply_tokens. widths: (first, later) message widths instead of
    the ones measured from the env's observation_tokens (the compiled path's, in tests)."""
    template = PromptTemplate(**{**default_template(config.mode).__dict__,
                                 **template_overrides})
    names = getattr(env, "action_names", None)
    # Free text (no action names): no actions line in the intro, as the original.
    listed = names if names is not None and getattr(env, "lists_actions", True) else ()
    intro = intro_text(template, env.instructions, getattr(env, "symbol_legend", ()), listed,
                       max_actions_per_turn=config.max_actions_per_turn,
                       max_actions_per_traj=config.max_actions_per_traj)
    text = HostText(
        tokenizer=tokenizer, template=template, chat=chat_pieces(tokenizer), intro=intro,
        action_names=None if names is None else tuple(names),
        forced_prefix_ids=tuple(tokenizer.encode(template.forced_prefix,
                                                 add_special_tokens=False)),
        table=cached_token_byte_table(tokenizer), max_tokens=config.announced_tokens,
        max_actions_per_turn=config.max_actions_per_turn, first_width=0, later_width=0,
        max_reply_bytes=max_reply_bytes)
    room = int(env.observation_tokens) + _SLACK
    if widths is None:
        left = config.max_actions_per_traj  # the widest numbers a message shows
        widths = (len(text.encode(text.first_text("", left))) + room,
                  len(text.encode(text.later_text(config.max_turns, -MAX_REWARD, "", left)))
                  + room)
    text = dataclasses.replace(text, first_width=int(widths[0]), later_width=int(widths[1]))
    return dataclasses.replace(text, window_width=_window_width(text, config, room))


def _window_width(text: HostText, config: RolloutConfig, room: int) -> int:
    """HostText.window_width: limited_multi_turn's window is the first message and
    window_turns - 1 earlier turns (forced prefix, reply, next message); single_turn's message
    is measured with every field at its widest, `room` tokens per observation and each earlier
    reply's text as many tokens as the forced prefix and the reply budget (and `room` more)."""
    earlier = config.window_turns - 1
    per_turn = len(text.forced_prefix_ids) + config.reply_tokens
    if config.context_window_mode == "limited_multi_turn":
        return text.first_width + earlier * (per_turn + text.later_width)
    if config.context_window_mode == "single_turn":
        left = config.max_actions_per_traj
        history = [("", "", -MAX_REWARD)] * earlier
        fixed = len(text.encode(text.single_text(config.max_turns, "", left, history)))
        return fixed + room + earlier * (room + per_turn + room)
    return 0
