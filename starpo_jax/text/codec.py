"""The codec: everything the rollout needs to speak to the model inside jit, built once.

    codec = build_codec(tokenizer, env, mode="think")     # the env's settings unless given
    ids, n = codec.render_observation(symbols)            # == tokenizer.encode(env.render_text(s))
    ids, n = codec.first_prompt(symbols, actions_left)    # system + user turn 1 + assistant header
    ids, n = codec.next_prompt(turn, reward, symbols, actions_left)  # end of reply .. header
    parsed = codec.parse_reply(reply_ids, reply_length)

A conversation of K turns is, token for token, `tokenizer.apply_chat_template(messages)` of
`render_conversation_text(...)`:

    first_prompt + reply_1 + next_prompt(2, r_1, ...) + reply_2 + ... + reply_K + closing

where reply_k are the assistant's tokens *including* the forced prefix (`forced_prefix_ids`) and
excluding any end-of-turn token (the template's `closing` supplies it). The reply tokens must be
the tokenizer's own encoding of their text for the whole to re-tokenise identically; sampled
replies generally are not, which matters only for comparing with the host, not for training.
All methods take one row or any leading batch axes.

`symbols` is what the env's `render_symbols` returns: an int32 [R, C] grid for a grid game
(envs_jax.TextEnv), a {slot name: [width] int32} dict for an env with `observation_parts` (a
free-text game, envs_jax.base.FreeTextEnv, or a grid game in a coordinate format), whose
observation parts then stand where the grid would.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from starpo_jax.text import blocks as bk
from starpo_jax.text.parse import ParsedReply, ReplyParser, build_parser, parse
from starpo_jax.text.single_turn import SingleTurn, build_single_turn
from starpo_jax.text.templates import NO_THINK, THINK, PromptTemplate, default_template, env_intro
from starpo_jax.text.token_bytes import TokenBytes, cached_token_byte_table

_SENTINELS = ("\x01SYS\x01", "\x01U1\x01", "\x01A1\x01", "\x01U2\x01", "\x01A2\x01")


def chat_pieces(tokenizer: Any) -> dict[str, str]:
    """The chat template's fixed text around each message, found with sentinel contents.

    Returns {"start", "system_to_user", "user_to_assistant", "assistant_to_user", "closing"}.
    Raises ValueError when turns are not rendered uniformly or the generation prompt differs
    from the text before an assistant message.
    """
    roles = ("system", "user", "assistant", "user", "assistant")
    messages = [{"role": r, "content": c} for r, c in zip(roles, _SENTINELS)]
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    # reply_prefix="": the generation prompt without the reply prefix an exported policy's
    # template adds (models/export.py prefixed_chat_template); other templates ignore it.
    prompt = tokenizer.apply_chat_template(messages[:2], tokenize=False,
                                           add_generation_prompt=True, reply_prefix="")
    cuts = [full.find(s) for s in _SENTINELS]
    if any(c < 0 for c in cuts) or cuts != sorted(cuts):
        raise ValueError(
            "the chat template drops or reorders message contents; cannot build turns from it"
        )
    between = [full[cuts[i] + len(_SENTINELS[i]) : cuts[i + 1]] for i in range(4)]
    pieces = {
        "start": full[: cuts[0]],
        "system_to_user": between[0],
        "user_to_assistant": between[1],
        "assistant_to_user": between[2],
        "closing": full[cuts[4] + len(_SENTINELS[4]) :],
    }
    if between[3] != between[1]:
        raise ValueError(
            f"the chat template renders user turns differently: {between[1]!r} vs {between[3]!r}"
        )
    expected = pieces["start"] + _SENTINELS[0] + between[0] + _SENTINELS[1] + between[1]
    if prompt != expected:
        raise ValueError(
            f"the generation prompt {prompt!r} differs from the conversation's {expected!r}"
        )
    return pieces


class Codec(flax.struct.PyTreeNode):
    """Host-built tables (pytree leaves) and static settings; see the module docstring."""

    observation: bk.Block
    first: bk.Block
    later: bk.Block
    parser: ReplyParser
    closing_ids: tuple[int, ...] = flax.struct.field(pytree_node=False)
    forced_prefix_ids: tuple[int, ...] = flax.struct.field(pytree_node=False)
    template: PromptTemplate = flax.struct.field(pytree_node=False)
    grid_shape: tuple[int, int] = flax.struct.field(pytree_node=False)  # (0, 0): slots
    newline_id: int = flax.struct.field(pytree_node=False)
    #: Envs with observation_parts: ((slot name, width), ...); None for a symbol grid.
    slot_widths: tuple[tuple[str, int], ...] | None = flax.struct.field(
        pytree_node=False, default=None
    )
    #: The single_turn context mode's prompt blocks (text/single_turn.py); None unless built.
    single_turn: SingleTurn | None = None

    def _state(self, symbols: Any) -> dict[str, jax.Array]:
        """One row's observation slots: {"state": flat grid} or the env's own slots."""
        if self.slot_widths is None:
            if tuple(symbols.shape) != self.grid_shape:
                raise ValueError(
                    f"symbols have shape {symbols.shape}; this codec renders {self.grid_shape} "
                    "grids"
                )
            return {"state": bk.flatten_grid(symbols, self.newline_id)}
        got = {name: tuple(jnp.shape(ids)) for name, ids in symbols.items()}
        want = {name: (width,) for name, width in self.slot_widths}
        if got != want:
            raise ValueError(f"observation slots {got}; this codec renders {want}")
        return {name: jnp.asarray(ids, jnp.int32) for name, ids in symbols.items()}

    def _batch_axes(self, symbols: Any) -> int:
        if self.slot_widths is None:
            return symbols.ndim - 2
        return jnp.ndim(symbols[self.slot_widths[0][0]]) - 1

    def blank_symbols(self) -> Any:
        """Zero symbols of one row's observation, in the structure `render_symbols` returns."""
        if self.slot_widths is None:
            return jnp.zeros(self.grid_shape, jnp.int32)
        return {name: jnp.zeros((width,), jnp.int32) for name, width in self.slot_widths}

    def _observation_row(self, symbols):
        return self.observation.encode(self._state(symbols))

    def _first_row(self, symbols, actions_left, turn):
        return self.first.encode(
            {
                "turn": bk.int_symbols(turn),
                **self._state(symbols),
                "actions_left": bk.int_symbols(actions_left),
            }
        )

    def _later_row(self, turn, reward, symbols, actions_left):
        return self.later.encode(
            {
                "reward": bk.reward_symbols(reward),
                "turn": bk.int_symbols(turn),
                **self._state(symbols),
                "actions_left": bk.int_symbols(actions_left),
            }
        )

    def render_observation(self, symbols: Any) -> tuple[jax.Array, jax.Array]:
        """symbols [..., R, C] int32 (or {slot: [..., width]}) -> (ids [..., T] int32 (-1
        padded), lengths [...] int32)."""
        return _over_leading(self._observation_row, self._batch_axes(symbols), symbols)

    def first_prompt(
        self, symbols: Any, actions_left: jax.Array, turn: jax.Array | int = 1
    ) -> tuple[jax.Array, jax.Array]:
        """Turn 1's prompt, from the template's start to the assistant header.

        symbols [..., R, C] int32 (or {slot: [..., width]}), actions_left [...] int32 ->
        (ids [..., T], lengths [...]). turn [...] int32: the number the turn text shows (a
        limited context window opens with a later turn's state in this same message).
        """
        axes = self._batch_axes(symbols)
        actions_left = jnp.asarray(actions_left, jnp.int32)
        return _over_leading(
            self._first_row,
            axes,
            symbols,
            actions_left,
            jnp.broadcast_to(jnp.asarray(turn, jnp.int32), jnp.shape(actions_left)),
        )

    def next_prompt(
        self, turn: jax.Array, reward: jax.Array, symbols: jax.Array, actions_left: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """What follows reply turn-1: end of that reply, user message (reward of turn-1, turn's
        state), assistant header. turn [...] int32 (>= 2), reward [...] float32,
        symbols [..., R, C] int32, actions_left [...] int32 -> (ids [..., T], lengths [...])."""
        return _over_leading(
            self._later_row,
            self._batch_axes(symbols),
            jnp.asarray(turn, jnp.int32),
            jnp.asarray(reward, jnp.float32),
            symbols,
            jnp.asarray(actions_left, jnp.int32),
        )

    def single_turn_prompt(self, symbols: Any, actions_left: jax.Array, rewards: jax.Array,
                           replies: jax.Array, reply_lengths: jax.Array, turn: jax.Array,
                           first: jax.Array, most: int) -> tuple[jax.Array, jax.Array]:
        """The single_turn mode's prompt of turn index `turn` (0-based) showing the earlier
        turns first..turn-1 (SingleTurn.prompt), for rows [B]: symbols [B, T, R, C] (or
        {slot: [B, T, width]}) each turn's observation, actions_left [B, T] int32, rewards
        [B, T] float32, replies [B, T, W] int32 and reply_lengths [B, T] int32 (after the
        forced prefix, without a closing EOS), turn and first [] int32; most (static): the
        most earlier turns shown -> (ids [B, P] int32 (-1 padded), lengths [B] int32)."""
        if self.single_turn is None:
            raise ValueError("this codec was built without single_turn=True")

        def row(symbols, left, rewards, replies, lengths):
            states = jax.vmap(self._state)(symbols)
            return self.single_turn.prompt(states, left, rewards, replies, lengths, turn, first,
                                           most)

        return jax.vmap(row)(symbols, actions_left, rewards, replies, reply_lengths)

    def parse_reply(self, reply_ids: jax.Array, reply_length: jax.Array) -> ParsedReply:
        """reply_ids [..., T] int32 (whole assistant text incl. the forced prefix),
        lengths [...]."""
        return parse(self.parser, reply_ids, reply_length)


def build_codec(
    tokenizer: Any,
    env: Any,
    mode: str = THINK,
    *,
    max_actions_per_turn: int | None = None,
    max_actions_per_traj: int | None = None,
    max_tokens: int | None = None,
    max_reply_bytes: int | None = None,
    verify: int = 300,
    single_turn: bool = False,
    **template_overrides: Any,
) -> Codec:
    """Host: builds and verifies a Codec for this tokenizer and env (a TextEnv).

    max_actions_per_turn: actions the parser keeps from a reply; max_actions_per_traj: the
    prompt's "You can make up to N actions"; max_tokens: the "Max response length" it announces
    (not the generation budget). None takes the env's `settings` (max_tokens: its
    announced_tokens). single_turn: also build the single_turn context mode's prompt blocks
    (rollout.context_window_mode). template_overrides replace fields of
    `default_template(mode)` (e.g. system=..., turn=...). Raises ValueError, naming the symbol
    or slot, if a rendering cannot be made exact.
    """
    if mode not in (THINK, NO_THINK):
        raise ValueError(f"unknown mode {mode!r}; valid: {THINK!r}, {NO_THINK!r}")
    settings = env.settings
    if max_actions_per_turn is None:
        max_actions_per_turn = settings.max_actions_per_turn
    if max_actions_per_traj is None:
        max_actions_per_traj = settings.max_actions_per_traj
    if max_tokens is None:
        max_tokens = settings.announced_tokens
    template = PromptTemplate(**{**default_template(mode).__dict__, **template_overrides})
    # Slots (a FreeTextEnv, or a grid game in a coordinate format) or a symbol grid; the
    # replies are parsed by the env's own parse_action (a FreeTextEnv) or as action words.
    slotted = getattr(env, "observation_parts", None) is not None
    action_parser = getattr(env, "parse_action", None)
    if slotted:
        state = _free_parts(env)
        rows = cols = 0
        newline = -1
    else:
        rows, cols = jax.eval_shape(
            lambda key: env.render_symbols(env.reset(key)[0]), jax.random.PRNGKey(0)
        ).shape
        grids = getattr(env, "symbol_grids", lambda: None)()  # TextEnv: None = any grid
        state = [bk.grid_slot(tuple(env.symbol_strings), rows, cols, grids)]
        newline = len(env.symbol_strings)
    number = lambda name, sample: bk.Slot(name, bk.NUMBER_SYMBOLS, sample)  # noqa: E731
    turn, left = number("turn", bk.sample_int), number("actions_left", bk.sample_int)
    reward = number("reward", bk.sample_reward)

    observation = bk.build_block(tokenizer, state, verify=max(verify, 1000))
    chat = chat_pieces(tokenizer)
    intro = env_intro(
        template,
        env,
        max_actions_per_turn=max_actions_per_turn,
        max_actions_per_traj=max_actions_per_traj,
    )
    turn_parts = _split(
        template.turn.replace("{max_tokens}", str(max_tokens)),
        {"turn": turn, "state": state, "actions_left": left},
    )
    first = bk.build_block(
        tokenizer,
        [
            chat["start"] + template.system + chat["system_to_user"] + intro,
            *turn_parts,
            chat["user_to_assistant"],
        ],
        verify=verify,
    )
    later = bk.build_block(
        tokenizer,
        [
            chat["assistant_to_user"],
            *_split(template.reward, {"reward": reward}),
            *turn_parts,
            chat["user_to_assistant"],
        ],
        verify=verify,
    )
    encode = lambda text: tuple(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    parser = build_parser(
        _without_special_tokens(cached_token_byte_table(tokenizer), tokenizer),
        env.action_names,
        think=template.think,
        separator=template.action_sep,
        max_actions=max_actions_per_turn,
        max_bytes=max_reply_bytes,
        action_parser=action_parser,
        action_bytes=env.action_bytes if action_parser is not None else 0,
    )
    single = None
    if single_turn:
        single = build_single_turn(tokenizer, template, chat, intro, state,
                                   template.forced_prefix, max_tokens, _split, verify)
    return Codec(
        observation=observation,
        first=first,
        later=later,
        parser=parser,
        closing_ids=encode(chat["closing"]),
        forced_prefix_ids=encode(template.forced_prefix),
        template=template,
        grid_shape=(rows, cols),
        newline_id=newline,
        slot_widths=tuple((s.name, s.width) for s in env.slots) if slotted else None,
        single_turn=single,
    )


_TEMPLATE_SLOTS = ("turn", "actions_left", "reward")


def _free_parts(env: Any) -> list[str | bk.Slot]:
    """An env's observation parts as block parts (its TextSlots as Slots)."""
    parts: list[str | bk.Slot] = []
    for part in env.observation_parts:
        if isinstance(part, str):
            parts.append(part)
            continue
        if part.name in _TEMPLATE_SLOTS or part.name == "state":
            raise ValueError(
                f"{type(env).__name__}: slot name {part.name!r} is taken by the prompt template "
                f"(reserved: {('state', *_TEMPLATE_SLOTS)})"
            )
        sample = np.asarray(part.sample(np.random.default_rng(0)))
        if sample.shape != (part.width,):
            raise ValueError(
                f"{type(env).__name__}: slot {part.name!r} samples shape {sample.shape}; its "
                f"width is {part.width}"
            )
        parts.append(bk.Slot(part.name, tuple(part.symbols), part.sample,
                             max_bytes=getattr(part, "max_bytes", None)))
    return parts


def _without_special_tokens(table: TokenBytes, tokenizer: Any) -> TokenBytes:
    """`table` with the special tokens (`<|im_start|>`, `<|endoftext|>`, ...) reading as no text:
    the original decodes replies with skip_special_tokens=True before parsing them, and vLLM
    matches stop strings on that same text."""
    special = [i for i, t in tokenizer.added_tokens_decoder.items() if t.special]
    special = [i for i in {*special, *tokenizer.all_special_ids} if 0 <= i < table.vocab_size]
    data, lengths = table.bytes.copy(), table.lengths.copy()
    data[special], lengths[special] = 0, 0
    return TokenBytes(data, lengths)


def _over_leading(fn, extra: int, *args):
    """Applies a one-row function over `extra` leading batch axes of every argument."""
    for _ in range(extra):
        fn = jax.vmap(fn)
    return fn(*args)


def _split(text: str, slots: dict[str, bk.Slot | list]) -> list[str | bk.Slot]:
    """ "a {x} b" -> ["a ", slots["x"], " b"] (fields other than `slots` are an error); a field
    whose value is a list of parts (the observation) is spliced in."""
    parts: list[str | bk.Slot] = []
    rest = text
    while "{" in rest:
        head, _, tail = rest.partition("{")
        name, _, rest = tail.partition("}")
        if name not in slots:
            raise ValueError(
                f"unknown field {{{name}}} in template text {text!r}; expected {sorted(slots)}"
            )
        value = slots[name]
        parts += [head, *(value if isinstance(value, list) else [value])]
    return parts + [rest]
