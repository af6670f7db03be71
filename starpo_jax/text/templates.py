"""Prompt templates (the original's wording), the reward format, and the host-side conversation.

The conversation of one trajectory, as the original's context manager builds it:

    system:    template.system
    user:      intro (instructions, actions, action budget) + turn text of turn 1
    assistant: reply 1 (starts with the forced prefix, e.g. "<think>")
    user:      reward text of turn 1 + turn text of turn 2
    assistant: reply 2
    ...

Rewards are written by `format_reward`: rounded to 2 decimals (half to even, in float32, as
jnp.round does), trailing zeros and a trailing point stripped, no "-0": 0.1 -> "0.1",
-0.1 -> "-0.1", 10.0 -> "10", 0.125 -> "0.12", -0.001 -> "0". Magnitudes are clipped to
`MAX_REWARD` so the text has a bounded width inside jit.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Sequence

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptTemplate:
    """The strings of the prompt; `{name}` fields are filled per env (static) or per turn.

    intro: first user message head; fields {instructions}, {actions}, {max_actions_per_turn},
      {action_sep}. `actions_line` ({actions}) is inserted before the budget line unless the
      env's instructions already contain its text before the field.
    turn: fields {turn}, {state}, {actions_left} (each exactly once, filled in JAX) and
      {max_tokens}.
    reward: field {reward} exactly once (filled in JAX).
    forced_prefix: text the reply is forced to begin with (part of the reply).
    """

    system: str = "You're a helpful assistant."
    intro: str = (
        "{instructions}\n{actions_line}You can make up to {max_actions_per_turn} actions, "
        'separated by the action separator " {action_sep} "\n'
    )
    actions_line: str = "Your available actions are:\n{actions}\n"
    turn: str = (
        "Turn {turn}:\nState:\n{state}\nYou have {actions_left} actions left. Always output: "
        + _FORMAT_RULE[THINK]
        + " with no extra text. Strictly follow this format. "
        "Max response length: {max_tokens} words (tokens)."
    )
    reward: str = "Reward:\n{reward}\n"
    forced_prefix: str = "<think>"
    action_sep: str = "||"
    think: bool = True

    def __post_init__(self) -> None:
        expected = {
            "intro": (
                {"instructions", "actions_line", "max_actions_per_turn", "action_sep"},
                set(),
            ),
            "actions_line": ({"actions"}, set()),
            "turn": ({"max_tokens"}, {"turn", "state", "actions_left"}),
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
        turn = PromptTemplate.turn.replace(_FORMAT_RULE[THINK], _FORMAT_RULE[NO_THINK])
        return PromptTemplate(turn=turn, forced_prefix="<answer>", think=False)
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
    action_names: Sequence[str],
    max_actions_per_turn: int,
) -> str:
    """The first user message's head, with every field filled."""
    actions = ", ".join(action_names)
    head = template.actions_line.split("{", 1)[0]
    # Free-text games (no action words) have no actions line, as the original without a lookup.
    listed = not action_names or (head and head in instructions)
    line = "" if listed else template.actions_line.format(actions=actions)
    return template.intro.format(
        instructions=instructions,
        actions_line=line,
        max_actions_per_turn=max_actions_per_turn,
        action_sep=template.action_sep,
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
    """User message of turn `turn` (1-based): the intro on turn 1, else the previous reward."""
    head = intro if turn == 1 else template.reward.format(reward=format_reward(previous_reward))
    return head + template.turn.format(
        turn=turn, state=state_text, actions_left=actions_left, max_tokens=max_tokens
    )


def render_conversation_text(
    template: PromptTemplate,
    instructions: str,
    action_names: Sequence[str],
    states: Sequence[str],
    replies: Sequence[str],
    rewards: Sequence[float],
    actions_left: Sequence[int],
    *,
    max_actions_per_turn: int = 5,
    max_tokens: int = 100,
) -> list[dict[str, str]]:
    """Host-side messages of a conversation (logs, tests): what the JAX codec assembles.

    states[k], actions_left[k]: the observation text and budget shown on turn k+1;
    replies[k]: the assistant's text (including the forced prefix); rewards[k]: the reward of
    turn k+1, shown at the start of the next user message. len(replies) is len(states) or one
    less (the conversation then ends with a user turn awaiting the reply).
    """
    if not (len(states) - 1 <= len(replies) <= len(states)) or len(rewards) < len(replies) - 1:
        raise ValueError(
            f"inconsistent lengths: {len(states)} states, {len(replies)} replies, "
            f"{len(rewards)} rewards"
        )
    intro = intro_text(template, instructions, action_names, max_actions_per_turn)
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
