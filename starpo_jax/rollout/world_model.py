"""World-model replies (SPA, arXiv 2510.15047): replies that read the board and predict the
state their actions lead to, as demonstrations for a warm start and as a probe of sampled ones.

A world-model reply (think mode; the forced prefix "<think>" included):

    <think> <observation>{coords(s)}</observation> I will move {plan}. <prediction>{coords(s')}
    </prediction></think><answer>{plan}</answer>                       (one line in the reply)

coords: the env's coordinate lines (`env.coordinate_parts` rendered from
`env.render_coordinates(state)`: RAGEN's coordinate render without its "Board size" header,
e.g. "Targets: (4, 3)\\nBoxes: (3, 2)\\nPlayer: (2, 2)"); s is the turn's state and s' the
state after the turn's actions as the rollout executes them (in order, up to the episode's end
and the trajectory's action budget); plan: the turn's actions joined by " || ".

Why coordinates and not the grid: the prompt already shows the grid (and, in the coordinate
envs, these same lines); the coordinates are the part a small model must compute a move from,
and a 6x6 grid twice would add ~90 tokens to each reply (docs/experiments.md measures both).

- `build_world_model_encoder` + `world_model_replies`: demonstrations with a behaviour policy's
  actions (starpo_jax.rollout.policies: random by default, so the task is still RL's to learn),
  tokenised in JAX by a text-layer block (starpo_jax.text.blocks) and verified against
  `tokenizer.encode` when built.
- `probe`: inside the rollout (rollout.world_model), whether a sampled reply's first
  <observation> block equals coords(s) and its first <prediction> block coords(s'), compared as
  text trimmed of whitespace (SPA's .strip()); rollout.prediction_reward pays a right prediction.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.base import TextSlot, slot_text
from starpo_jax.text import parse as ps
from starpo_jax.text.blocks import Block, Slot, build_block, concat_pieces
from starpo_jax.text.codec import Codec, chat_pieces

OPEN_OBS, CLOSE_OBS = "<observation>", "</observation>"
OPEN_PRED, CLOSE_PRED = "<prediction>", "</prediction>"
# SPA's spacing (SPA_agent/ctx_manager.py): "<think> <observation>...</observation> {thought}
# <prediction>...". The space also keeps "><" from merging "<think>" into the reply's tokens.
OBS_HEAD, PLAN_HEAD, PLAN_TAIL = " ", " I will move ", ". "
NOW, NEXT = "now_", "next_"  # slot name prefixes of the two coordinate blocks


def require_world_model_env(env: Any, think: bool) -> None:
    """Raises ValueError unless `env` renders coordinates and the replies have a think block."""
    if getattr(env, "coordinate_parts", None) is None:
        raise ValueError(f"{type(env).__name__} has no coordinate_parts: world-model replies "
                         "need an env that renders its state as coordinates (sokoban, "
                         "frozen_lake and their coord_* names)")
    if not think:
        raise ValueError("world-model replies live in the think block: rollout.mode must be "
                         "'think', not 'nothink'")


def reply_text(coords_now: str, coords_next: str, names: list[str], separator: str,
               forced_prefix: str = "<think>") -> str:
    """A world-model reply's text (forced prefix included, no end-of-turn token)."""
    plan = f" {separator} ".join(names)
    return (f"{forced_prefix}{OBS_HEAD}{OPEN_OBS}{coords_now}{CLOSE_OBS}{PLAN_HEAD}{plan}"
            f"{PLAN_TAIL}"
            f"{OPEN_PRED}{coords_next}{CLOSE_PRED}</think><answer>{plan}</answer>")


def _renamed(parts: tuple[str | TextSlot, ...], prefix: str) -> list[str | Slot]:
    return [p if isinstance(p, str) else Slot(prefix + p.name, tuple(p.symbols), p.sample)
            for p in parts]


def _plan_symbols(env: Any, separator: str) -> tuple[str, ...]:
    return (*env.action_names, f" {separator} ", "")


def plan_row(actions: jax.Array, num_names: int) -> jax.Array:
    """actions [A] int32 (-1 after the turn's) -> [2A - 1] ids into _plan_symbols: the names
    with the separator between them, "" for the missing ones."""
    a = actions.shape[0]
    sep, empty = num_names, num_names + 1
    names = jnp.where(actions >= 0, actions, empty)
    seps = jnp.where(actions[1:] >= 0, sep, empty)
    row = jnp.stack([names[:-1], seps], axis=1).reshape(-1) if a > 1 else names[:0]
    return jnp.concatenate([row, names[-1:]]).astype(jnp.int32)


class WorldModelEncoder(flax.struct.PyTreeNode):
    """Token tables of world-model replies (the tokens after the forced prefix)."""

    block: Block
    eos: jax.Array  # [E] int32: the EOS when it ends the template's turns, else empty
    prefix: int = flax.struct.field(pytree_node=False)  # tokens of the forced prefix
    num_names: int = flax.struct.field(pytree_node=False)

    def encode(self, now: dict[str, jax.Array], after: dict[str, jax.Array],
               actions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """One reply: the coordinate slot ids of s and s' (env.render_coordinates), actions [A]
        int32 (-1 after the turn's; at least one) -> (tokens [W] int32 after the forced prefix,
        -1 padded; length [] int32)."""
        plan = plan_row(actions, self.num_names)
        slots = {**{NOW + k: v for k, v in now.items()}, **{NEXT + k: v for k, v in after.items()},
                 "plan": plan, "answer": plan}
        ids, n = self.block.encode(slots)
        return concat_pieces([(ids[self.prefix:], n - self.prefix),
                              (self.eos, jnp.int32(self.eos.shape[0]))])


def build_world_model_encoder(tokenizer: Any, env: Any, codec: Codec, *,
                              max_actions_per_turn: int, verify: int = 200,
                              seed: int = 0) -> WorldModelEncoder:
    """Host: the world-model reply tables of `env` for `codec` (think mode), the whole reply
    verified against tokenizer.encode on `verify` random fillings (text/blocks.py). Raises
    ValueError for an env without coordinates, nothink mode, or a tokenizer that merges the
    forced prefix with what follows it."""
    t = codec.template
    require_world_model_env(env, t.think)
    sep = t.action_sep
    symbols = _plan_symbols(env, sep)
    k, a = len(env.action_names), max_actions_per_turn

    def sample_plan(rng: np.random.Generator) -> np.ndarray:
        count = int(rng.integers(1, a + 1))
        acts = np.where(np.arange(a) < count, rng.integers(0, k, a), -1)
        return np.asarray(plan_row(jnp.asarray(acts, jnp.int32), k))

    plan = Slot("plan", symbols, sample_plan)
    answer = Slot("answer", symbols, sample_plan)
    parts = [t.forced_prefix + OBS_HEAD + OPEN_OBS, *_renamed(env.coordinate_parts, NOW),
             CLOSE_OBS + PLAN_HEAD, plan, PLAN_TAIL + OPEN_PRED,
             *_renamed(env.coordinate_parts, NEXT), CLOSE_PRED + "</think><answer>", answer,
             "</answer>"]
    block = build_block(tokenizer, parts, verify=verify, seed=seed)
    prefix = list(tokenizer.encode(t.forced_prefix, add_special_tokens=False))
    if list(block.static[0][: len(prefix)]) != prefix:
        raise ValueError(f"world-model replies: this tokenizer merges the forced prefix "
                         f"{t.forced_prefix!r} with the reply that follows it")
    end = chat_pieces(tokenizer)["assistant_to_user"]
    eos = ([tokenizer.eos_token_id]
           if tokenizer.encode(end, add_special_tokens=False)[:1] == [tokenizer.eos_token_id]
           else [])
    return WorldModelEncoder(block=block, eos=jnp.asarray(eos, jnp.int32).reshape(-1),
                             prefix=len(prefix), num_names=k)


def steps_of_turn(env: Any, state: Any, actions: jax.Array, taken: jax.Array,
                  max_actions_per_traj: int) -> Any:
    """One row's state after `actions` [A] (-1 after the turn's) as the rollout executes them:
    in order, stopping at the episode's end or when `taken` + steps reaches the budget."""

    def one(carry, action):
        s, ended, steps = carry
        go = (action >= 0) & ~ended & (taken + steps < max_actions_per_traj)
        new, ts = env.step(s, jnp.maximum(action, 0))
        s = jax.tree.map(lambda n, o: jnp.where(go, n, o), new, s)
        return (s, ended | (go & ts.last()), steps + go), None

    (state, _, _), _ = jax.lax.scan(one, (state, jnp.bool_(False), jnp.int32(0)), actions)
    return state


def world_model_replies(env: Any, policy: Any, encoder: WorldModelEncoder, *,
                        max_actions_per_traj: int, width: int):
    """A demonstration's reply source (rollout.jax_env.ReplySource, with the rows' actions
    taken so far): the policy's actions for each row, spelt as world-model replies of at most
    `width` tokens (rollout.reply_tokens; `check_width` on the host says whether they fit)."""

    def replies(states: Any, turn: jax.Array, key: jax.Array, taken: jax.Array):
        b = jax.tree.leaves(states)[0].shape[0]
        actions = jax.vmap(policy)(states, jax.random.split(key, b))
        after = jax.vmap(lambda s, a, t: steps_of_turn(env, s, a, t, max_actions_per_traj))(
            states, actions, taken)
        ids, n = jax.vmap(encoder.encode)(jax.vmap(env.render_coordinates)(states),
                                          jax.vmap(env.render_coordinates)(after), actions)
        return ids[:, :width], jnp.minimum(n, width)

    return replies


def longest_reply(env: Any, encoder: WorldModelEncoder, max_actions_per_turn: int,
                  samples: int = 256, seed: int = 0) -> int:
    """Host: the most tokens a world-model reply took over `samples` random fillings of the
    env's coordinate slots (its TextSlot samplers: real renders) and the longest plan."""
    rng = np.random.default_rng(seed)
    acts = jnp.zeros((max_actions_per_turn,), jnp.int32)
    fill = lambda: {p.name: jnp.asarray(p.sample(rng), jnp.int32)  # noqa: E731
                    for p in env.coordinate_parts if isinstance(p, TextSlot)}
    encode = jax.jit(encoder.encode)
    return max(int(encode(fill(), fill(), acts)[1]) for _ in range(samples))


# ------------------------------------------------------------------ the probe of sampled replies


class CoordinateBytes(flax.struct.PyTreeNode):
    """The UTF-8 bytes of an env's coordinate text, from its slot ids, inside jit."""

    fixed: tuple[jax.Array, ...]  # the fixed strings' bytes, in order (empty ones included)
    symbols: tuple[jax.Array, ...]  # per slot: [K, M] int32 symbol bytes, -1 padded
    lengths: tuple[jax.Array, ...]  # per slot: [K] int32
    layout: tuple[tuple[str, str], ...] = flax.struct.field(pytree_node=False)  # (kind, name)

    def text(self, ids: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """{slot: [width] int32} -> (bytes [N] int32, -1 padded; length [] int32)."""
        pieces, f, s = [], 0, 0
        for kind, name in self.layout:
            if kind == "text":
                pieces.append((self.fixed[f], jnp.int32(self.fixed[f].shape[0])))
                f += 1
                continue
            table, lengths = self.symbols[s], self.lengths[s]
            for i in ids[name]:
                pieces.append((table[i], lengths[i]))
            s += 1
        return concat_pieces(pieces)


def coordinate_bytes(env: Any) -> CoordinateBytes:
    """Host: the tables of `env.coordinate_parts` (built from static strings only)."""
    fixed, symbols, lengths, layout = [], [], [], []
    for part in env.coordinate_parts:
        if isinstance(part, str):
            fixed.append(jnp.asarray(np.frombuffer(part.encode(), np.uint8), jnp.int32))
            layout.append(("text", ""))
            continue
        encoded = [s.encode() for s in part.symbols]
        table = np.full((len(encoded), max(1, max(map(len, encoded)))), -1, np.int32)
        for i, e in enumerate(encoded):
            table[i, : len(e)] = np.frombuffer(e, np.uint8)
        symbols.append(jnp.asarray(table))
        lengths.append(jnp.asarray([len(e) for e in encoded], jnp.int32))
        layout.append(("slot", part.name))
    return CoordinateBytes(fixed=tuple(fixed), symbols=tuple(symbols), lengths=tuple(lengths),
                           layout=tuple(layout))


def _block_equals(chars: jax.Array, space: jax.Array, open_tag: str, close_tag: str,
                  after: jax.Array, expected: jax.Array, expected_n: jax.Array):
    """(found, equal, close end): the first `open_tag` at or after byte `after`, the first
    `close_tag` after it; equal when the text between, trimmed of whitespace, is `expected`."""
    n = chars.shape[0]
    pos = jnp.arange(n)
    opened = ps.first_true(ps.pattern_hits(chars, open_tag.encode()) & (pos >= after))
    begin = opened + len(open_tag)
    closed = ps.first_true(ps.pattern_hits(chars, close_tag.encode()) & (pos >= begin))
    found = closed < n
    body = (pos >= begin) & (pos < closed) & ~space
    first = ps.first_true(body)
    last = jnp.max(jnp.where(body, pos, -1))
    length = jnp.where(first < n, last + 1 - first, 0)
    j = jnp.arange(expected.shape[0])
    got = chars[jnp.clip(first + j, 0, n - 1)]
    same = jnp.all((j >= expected_n) | (got == expected))
    return found, found & (length == expected_n) & same, closed + len(close_tag)


def probe(parser: ps.ReplyParser, tables: CoordinateBytes, reply: jax.Array, length: jax.Array,
          before: dict[str, jax.Array], after: dict[str, jax.Array]):
    """One sampled reply (ids [T] with the forced prefix, length []) against the coordinate
    slot ids of the turn's state and of the state after it -> (observation_ok, prediction_ok)
    bool []: the first <observation> block equals coords(s); the first <prediction> block after
    it (or anywhere, without one) equals coords(s')."""
    chars, _, _ = ps.reply_chars(parser, reply, length)
    space = ps.whitespace(chars)
    now, now_n = tables.text(before)
    nxt, nxt_n = tables.text(after)
    found, obs_ok, end = _block_equals(chars, space, OPEN_OBS, CLOSE_OBS, jnp.int32(0), now,
                                       now_n)
    _, pred_ok, _ = _block_equals(chars, space, OPEN_PRED, CLOSE_PRED,
                                  jnp.where(found, end, 0), nxt, nxt_n)
    return obs_ok, pred_ok


def coordinate_text(env: Any, state: Any) -> str:
    """Host: coords(state) as the replies spell it (one unbatched state)."""
    return slot_text(env.coordinate_parts, jax.device_get(env.render_coordinates(state)))
