"""Prompt templates (the original's wording), the reward format, and the host-side conversation.

The conversation of one trajectory, as the original's context manager builds it (RAGEN v1,
`ragen/llm_agent/ctx_manager.py` with `config/envs.yaml`):

    system:    template.system
    user:      intro (instructions, symbol legend, actions and action budget) + turn text of turn 1
    assistant: reply 1 (starts with the forced prefix, e.g. "<think>")
    user:      reward text of turn 1 + turn text of turn 2
    assistant: reply 2
    ...

The intro is the env's instructions, then "\nThe meaning of each symbol in the state is:\n" and
"symbol: meaning, ..." when the env has a legend, then "\nYour available actions are:\n..." and
"\nYou can make up to {max_actions_per_traj} actions, ..." when the env lists its actions (the
bandit neither: its intro is empty, its state holds the whole game text). The turn text
announces `max_tokens` as the "Max response length", which is not the generation budget (the
original announces 100 and generates up to 400 tokens).

Rewards are written by `format_reward`: rounded to 2 decimals (half to even, in float32, as
jnp.round does), trailing zeros and a trailing point stripped, no "-0": 0.1 -> "0.1",
-0.1 -> "-0.1", 10.0 -> "10", 0.125 -> "0.12", -0.001 -> "0". Magnitudes are clipped to
`MAX_REWARD` so the text has a bounded width inside jit.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Sequence
from typing import Any

import numpy as np

MAX_REWARD = 999_999.99
MAX_CENTS = 99_999_999
THINK, NO_THINK = "think", "nothink"

_FORMAT_RULE = {
    THINK: "<think> [Your thoughts] </think> <answer> [your answer] </answer>",
    NO_THINK: "<answer> [your answer] </answer>",
}


def _fields(text: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]


# Fields every intro part may use (filled on the host, once per env).
_INTRO_FIELDS = {"instructions", "legend_line", "actions_line", "legend", "actions",
                 "max_actions_per_turn", "max_actions_per_traj", "action_sep"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptTemplate:
    """The strings of the prompt; `{name}` fields are filled per env (static) or per turn.

    intro: first user message head; fields {instructions}, {legend_line} (`legend_line` filled,
      or "" when the env has no legend), {actions_line} (`actions_line` filled, or "" when the
      env lists no actions); also {legend}, {actions}, {max_actions_per_turn},
      {max_actions_per_traj}, {action_sep}, as `legend_line` and `actions_line` may.
    turn: fields {turn}, {state}, {actions_left} (each exactly once, filled in JAX) and
      {max_tokens} (the announced reply length).
    reward: field {reward} exactly once (filled in JAX).
    forced_prefix: text the reply is forced to begin with (part of the reply).
    """

    system: str = "You're a helpful assistant. "
    intro: str = "{instructions}{legend_line}{actions_line}"
    legend_line: str = "\nThe meaning of each symbol in the state is:\n{legend}"
    actions_line: str = (
        "\nYour available actions are:\n{actions}\nYou can make up to {max_actions_per_traj} "
        'actions, separated by the action separator " {action_sep} "\n'
    )
    turn: str = (
        "\nTurn {turn}:\nState:\n{state}\nYou have {actions_left} actions left. Always output: "
        + _FORMAT_RULE[THINK]
        + " with no extra text. Strictly follow this format. "
        "Max response length: {max_tokens} words (tokens).\n"
    )
    reward: str = "Reward:\n{reward}\n"
    # single_turn context mode: the current turn's text (the original's memory format), after
    # the history (`single_turn_user`); same fields as `turn`.
    single_turn: str = (
        "(Turn {turn}):\nState:\n{state}\nYou have {actions_left} actions left. Always output: "
        + _FORMAT_RULE[THINK]
        + " with no extra text. Strictly follow this format. "
        "Max response length: {max_tokens} words (tokens).\n"
    )
    forced_prefix: str = "<think>"
    action_sep: str = "||"
    think: bool = True

    def __post_init__(self) -> None:
        expected = {
            "intro": (_INTRO_FIELDS, set()),
            "legend_line": (_INTRO_FIELDS - {"legend_line", "actions_line"}, set()),
            "actions_line": (_INTRO_FIELDS - {"legend_line", "actions_line"}, set()),
            "turn": ({"max_tokens"}, {"turn", "state", "actions_left"}),
            "single_turn": ({"max_tokens"}, {"turn", "state", "actions_left"}),
            "reward": (set(), {"reward"}),
            "system": (set(), set()),
        }
        for name, (optional, once) in expected.items():
            fields = _fields(getattr(self, name))
            unknown = set(fields) - optional - once
            if unknown:
                raise ValueError(
                    f"template {name!r} has unknown fields {sorted(unknown)}; "
                    f"allowed: {sorted(optional | once)}"
                )
            for field in once:
                if fields.count(field) != 1:
                    raise ValueError(
                        f"template {name!r} must contain {{{field}}} exactly once; "
                        f"it has it {fields.count(field)} times"
                    )
        tag = "<think>" if self.think else "<answer>"
        if not self.forced_prefix.startswith(tag):
            raise ValueError(f"forced_prefix {self.forced_prefix!r} must start with {tag!r}")
        if not self.action_sep.strip():
            raise ValueError(f"action_sep {self.action_sep!r} must contain a non-space character")


def default_template(mode: str = THINK) -> PromptTemplate:
    """The original's prompt for "think" (reasoning then answer) or "nothink" (answer only)."""
    if mode == THINK:
        return PromptTemplate()
    if mode == NO_THINK:
        swap = lambda text: text.replace(_FORMAT_RULE[THINK], _FORMAT_RULE[NO_THINK])  # noqa: E731
        return PromptTemplate(turn=swap(PromptTemplate.turn),
                              single_turn=swap(PromptTemplate.single_turn),
                              forced_prefix="<answer>", think=False)
    raise ValueError(f"unknown mode {mode!r}; valid: {THINK!r}, {NO_THINK!r}")


def reward_cents(reward: float) -> int:
    """round(reward * 100) exactly as the JAX side computes it (float32, half to even)."""
    clipped = np.clip(np.float32(reward), np.float32(-2 * MAX_REWARD), np.float32(2 * MAX_REWARD))
    return int(np.clip(int(np.round(clipped * np.float32(100))), -MAX_CENTS, MAX_CENTS))


def format_reward(reward: float) -> str:
    """The canonical reward text (see module docstring)."""
    cents = reward_cents(reward)
    whole, frac = divmod(abs(cents), 100)
    text = f"{whole}.{frac:02d}".rstrip("0").rstrip(".")
    return ("-" if cents < 0 else "") + text


def intro_text(
    template: PromptTemplate,
    instructions: str,
    legend: Sequence[tuple[str, str]],
    actions: Sequence[str],
    *,
    max_actions_per_turn: int,
    max_actions_per_traj: int,
) -> str:
    """The first user message's head, with every field filled.

    legend: (symbol, meaning) pairs, () for no legend line; actions: the action names the
    prompt lists, () for no actions line (nor action budget).
    """
    values: dict[str, Any] = dict(
        instructions=instructions,
        legend=", ".join(f"{symbol}: {meaning}" for symbol, meaning in legend),
        actions=", ".join(actions),
        max_actions_per_turn=max_actions_per_turn,
        max_actions_per_traj=max_actions_per_traj,
        action_sep=template.action_sep,
    )
    values["legend_line"] = template.legend_line.format(**values) if legend else ""
    values["actions_line"] = template.actions_line.format(**values) if actions else ""
    return template.intro.format(**values)


def env_intro(
    template: PromptTemplate, env: Any, *, max_actions_per_turn: int, max_actions_per_traj: int
) -> str:
    """`intro_text` of a TextEnv: its instructions, symbol legend and (if it lists them) actions."""
    return intro_text(
        template,
        env.instructions,
        env.symbol_legend,
        env.action_names if env.lists_actions else (),
        max_actions_per_turn=max_actions_per_turn,
        max_actions_per_traj=max_actions_per_traj,
    )


def user_message(
    template: PromptTemplate,
    intro: str,
    turn: int,
    state_text: str,
    actions_left: int,
    max_tokens: int,
    previous_reward: float | None,
) -> str:
    """User message of turn `turn` (1-based): the previous reward, or the intro when there is
    none (turn 1, or a limited context window's first turn)."""
    head = (intro if previous_reward is None
            else template.reward.format(reward=format_reward(previous_reward)))
    return head + template.turn.format(
        turn=turn, state=state_text, actions_left=actions_left, max_tokens=max_tokens
    )


# The single_turn mode's history (the original's SimpleMemory, ragen/llm_agent/memory): a
# summary, then one entry per earlier turn shown, then the current turn after a blank line.
SINGLE_TURN_SUMMARY = ("Summary: {completed} step(s) completed so far. Showing the last {shown} "
                       "turn(s) with state/action/reward details. Recent turns:\n---\n")
SINGLE_TURN_ENTRY = ("Turn {turn} State:\n{state}\nTurn {turn} Action: {reply}\n"
                     "Turn {turn} Reward: {reward}\n---\n")
SINGLE_TURN_CURRENT = "\nCurrent Turn "


def single_turn_user(
    template: PromptTemplate,
    intro: str,
    turn: int,
    state_text: str,
    actions_left: int,
    max_tokens: int,
    history: Sequence[tuple[str, str, float]],
) -> str:
    """The single_turn mode's user message of turn `turn` (1-based): the intro, then (when
    `history` holds the earlier turns shown, each (state text, reply text, reward), oldest
    first) the summary and their entries, then the current turn's `template.single_turn`."""
    text = intro
    first = turn - len(history)
    if history:
        text += SINGLE_TURN_SUMMARY.format(completed=turn - 1, shown=len(history))
        for j, (state, reply, reward) in enumerate(history):
            text += SINGLE_TURN_ENTRY.format(turn=first + j, state=state, reply=reply,
                                             reward=format_reward(reward))
        text += SINGLE_TURN_CURRENT
    return text + template.single_turn.format(turn=turn, state=state_text,
                                              actions_left=actions_left, max_tokens=max_tokens)


def render_conversation_text(
    template: PromptTemplate,
    intro: str,
    states: Sequence[str],
    replies: Sequence[str],
    rewards: Sequence[float],
    actions_left: Sequence[int],
    *,
    max_tokens: int = 100,
) -> list[dict[str, str]]:
    """Host-side messages of a conversation (logs, tests): what the JAX codec assembles.

    intro: the first user message's head (`env_intro`); states[k], actions_left[k]: the
    observation text and budget shown on turn k+1; replies[k]: the assistant's text (including
    the forced prefix); rewards[k]: the reward of turn k+1, shown at the start of the next user
    message; max_tokens: the announced reply length. len(replies) is len(states) or one less
    (the conversation then ends with a user turn awaiting the reply).
    """
    if not (len(states) - 1 <= len(replies) <= len(states)) or len(rewards) < len(replies) - 1:
        raise ValueError(
            f"inconsistent lengths: {len(states)} states, {len(replies)} replies, "
            f"{len(rewards)} rewards"
        )
    messages = [{"role": "system", "content": template.system}]
    for k, state in enumerate(states):
        previous = rewards[k - 1] if k else None
        messages.append(
            {
                "role": "user",
                "content": user_message(
                    template, intro, k + 1, state, actions_left[k], max_tokens, previous
                ),
            }
        )
        if k < len(replies):
            messages.append({"role": "assistant", "content": replies[k]})
    return messages
