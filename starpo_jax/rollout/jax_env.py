"""The multi-turn rollout, inside jit: P initial states x N trajectories, up to max_turns turns.

    out = rollout(graphdef, params, env, codec, config, key, eos_id=2, pad_id=2)

One row b = p * N + n (group-major) per trajectory. Each row owns a token buffer [L] and a KV
cache of L slots that always hold the same tokens. Turn 1's prompt (system + first user message
+ assistant header) is prefilled once per group and the cache copied to its N rows. Then, with
`lax.scan` over turns (compile time does not grow with max_turns), each turn:
  1. prefills the forced prefix ("<think>" / "<answer>") and samples the reply with the sampler
     (per-turn budget, stop at "</answer>", EOS);
  2. parses it and takes up to max_actions_per_turn env steps (a masked scan; the episode end and
     max_actions_per_traj stop it; a turn with no valid action does not step);
  3. records the turn's reward (sum of env rewards) and format penalty, and the fingerprint of
     each state stepped into (loop detection, starpo_jax.algo.failures);
  4. if any row goes on, prefills the next environment message (reward + next state) for it.
Rows whose episode ended, or whose action budget is spent, take no further turns. A reply that
ended with EOS already holds the template's end-of-turn token, so the next message's copy of it
is skipped. Only the sampled tokens are in the loss mask: not the template, env text or prefix.
Inactive rows still run through the prefills (shapes are static) but sample nothing (the decode
loop ends with the active rows), and nothing of theirs is kept.
A demonstration (`replies=`, starpo_jax.rollout.demonstrations) is this same loop with each turn's
reply tokens supplied instead of sampled, and no model.

rollout.context_window_mode = "limited_multi_turn" (RAGEN's context manager) shows the model at
turn t only the last k = max_context_window turns: the first message as turn 1's (system,
instructions) but with turn h = max(1, t - k + 1)'s number, budget and state, then the
conversation from reply h on; "single_turn" shows one user message, the earlier turns h..t-1
as the original's memory text (text/single_turn.py: their states, replies and rewards), then
the current turn. Each turn then prefills its window into a fresh KV cache (the conversation is
still built in a buffer, from which limited_multi_turn cuts its windows), and the Rollout holds
one sample per turn instead of the conversation: turn t's window, forced prefix and reply at
columns t * W .. (t + 1) * W of tokens [B, T * W] (`sample_width`), `turn_lengths` and
`window_lengths` [B, T]. `turn_samples` makes them rows of their own for the update.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from starpo_jax.algo.advantages import anchor_ids
from starpo_jax.config import RolloutConfig
from starpo_jax.algo.failures import LoopHistory, classify
from starpo_jax.models.cache import KVCache
from starpo_jax.phases import PhaseClock, mark
from starpo_jax.rollout import world_model as wm
from starpo_jax.rollout.sampling import (GenerateOutput, SamplingOptions, fold_in,
                                         generate_pure, row_keys)
from starpo_jax.models.sharding import constrain_batch, merge_rows
from starpo_jax.text.codec import Codec
from starpo_jax.text.parse import stop_strings


class Rollout(flax.struct.PyTreeNode):
    """A batch of B = P * N trajectories (T = max_turns, L = buffer length)."""

    tokens: jax.Array  # [B, L] int32, pad_id after `lengths`
    lengths: jax.Array  # [B] int32 tokens in the buffer
    prompt_lengths: jax.Array  # [B] int32 tokens of the first prompt (tokens[:, :n]; no prefix)
    loss_mask: jax.Array  # [B, L] bool, the model's sampled tokens
    turn_ids: jax.Array  # [B, L] int32 turn index (0-based) of sampled tokens, -1 elsewhere
    # The sampler's distribution at each sampled token (rollout temperature, before top-p /
    # top-k truncation): log-prob of the token, and entropy. [B, L] float32, 0 elsewhere.
    behaviour_logp: jax.Array
    behaviour_entropy: jax.Array
    turn_rewards: jax.Array  # [B, T] float32 sum of env rewards of each turn
    format_penalties: jax.Array  # [B, T] float32 penalty (<= 0) of badly formatted turns
    turn_taken: jax.Array  # [B, T] bool the row took this turn
    format_ok: jax.Array  # [B, T] bool
    think_tokens: jax.Array  # [B, T] int32
    reply_lengths: jax.Array  # [B, T] int32 sampled tokens (forced prefix not counted)
    success: jax.Array  # [B] bool
    num_actions: jax.Array  # [B] int32 env steps taken
    effective_actions: jax.Array  # [B] int32 steps that changed the state
    # The failure classifier's env-state inputs (starpo_jax.algo.failures). None where no env states
    # were kept (host rollouts, hand-made batches): such rows are neither dead ends nor loops.
    dead_end: jax.Array | None = None  # [B] bool the final state can no longer succeed
    looped: jax.Array | None = None  # [B] bool some step returned to an earlier state
    # [B, T] int32 GiGPO's anchor state of each turn: equal ids within a group <=> the turns
    # start from identical observations (advantages.anchor_ids); -1 for turns not taken.
    turn_anchors: jax.Array | None = None
    # The limited context modes only (module docstring): tokens, loss_mask, turn_ids and
    # behaviour_* hold turn t's sample at columns t * W .. (t + 1) * W. [B, T] int32 tokens of
    # each turn's sample, and of its window (the context before the forced prefix); 0 for turns
    # not taken. None: the rows are whole conversations.
    turn_lengths: jax.Array | None = None
    window_lengths: jax.Array | None = None
    # rollout.world_model (world_model.py): [B, T] bool, the turn's reply read the state it
    # started from (<observation>) / foresaw the state it led to (<prediction>); None: off.
    observation_ok: jax.Array | None = None
    prediction_ok: jax.Array | None = None

    @property
    def failure(self) -> jax.Array:
        """[B] int32 failure class of each row (index into failures.FAILURE_KINDS)."""
        no = jnp.zeros_like(self.success)
        return classify(self.success, no if self.dead_end is None else self.dead_end,
                        no if self.looped is None else self.looped, self.format_ok,
                        self.turn_taken, self.effective_actions)

    @property
    def scores(self) -> jax.Array:
        """[B] trajectory score with the format penalties (what GRPO / GAE optimise)."""
        return jnp.sum(self.turn_rewards + self.format_penalties, axis=-1)

    @property
    def scores_without_penalty(self) -> jax.Array:
        """[B] summed env rewards (what the uncertainty filter ranks groups by)."""
        return jnp.sum(self.turn_rewards, axis=-1)


def buffer_length(codec: Codec, config: RolloutConfig) -> int:
    """L of a JAX env's rollout: `turn_buffer_length` of the codec's padded prompt widths."""
    first, later = prompt_widths(codec)
    return turn_buffer_length(first, later, len(codec.forced_prefix_ids), config)


def turn_buffer_length(first_width: int, later_width: int, prefix_tokens: int,
                       config: RolloutConfig) -> int:
    """The buffer-length rule of both rollouts (this one and rollout/host.py's): L holds the
    first prompt (first_width tokens), max_turns x (forced prefix + reply) and the
    max_turns - 1 later messages between them (later_width each), static."""
    per_turn = prefix_tokens + config.reply_tokens
    return first_width + config.max_turns * per_turn + (config.max_turns - 1) * later_width


def sample_width(codec: Codec, config: RolloutConfig) -> int:
    """W of a limited context mode's turn sample: the widest window (limited_multi_turn: the
    first message and window_turns - 1 earlier turns; single_turn: its one message), the forced
    prefix and the reply, static."""
    first, later = prompt_widths(codec)
    per_turn = len(codec.forced_prefix_ids) + config.reply_tokens
    if config.context_window_mode == "single_turn":
        return _single_turn_width(codec, config) + per_turn
    return first + (config.window_turns - 1) * (per_turn + later) + per_turn


def _single_turn_width(codec: Codec, config: RolloutConfig) -> int:
    turns = config.max_turns
    rows = lambda x: jnp.zeros((1, turns) + jnp.shape(x), jnp.int32)  # noqa: E731
    symbols = jax.tree.map(rows, codec.blank_symbols())
    zeros = jnp.zeros((1, turns), jnp.int32)
    shape = jax.eval_shape(
        lambda: codec.single_turn_prompt(symbols, zeros, zeros.astype(jnp.float32),
                                         jnp.zeros((1, turns, config.reply_tokens), jnp.int32),
                                         zeros, jnp.int32(0), jnp.int32(0),
                                         config.window_turns - 1))
    return shape[0].shape[-1]


def turn_samples(out: Rollout) -> Rollout:
    """A limited context mode's rollout [B, T * W] -> its turn samples as rows [T * B, W],
    turn-major (row t * B + b: trajectory b's turn t). Each keeps its trajectory's per-turn and
    per-row fields, so scores, the filter's groups and the estimators' groups (N consecutive
    rows: one group's trajectories, at one turn) are the trajectory's; its loss mask is that
    turn's reply. A turn not taken is a row of one pad token with no loss."""
    b, turns = out.turn_taken.shape

    def split(x: jax.Array) -> jax.Array:  # [B, T * W] -> [T * B, W]
        return jnp.swapaxes(x.reshape(b, turns, -1), 0, 1).reshape(turns * b, -1)

    def tile(x: jax.Array | None) -> jax.Array | None:
        return None if x is None else jnp.tile(x, (turns,) + (1,) * (x.ndim - 1))

    per_turn = lambda x: x.T.reshape(-1)  # noqa: E731  [B, T] -> [T * B]
    rows = {name: split(getattr(out, name)) for name in (
        "tokens", "loss_mask", "turn_ids", "behaviour_logp", "behaviour_entropy")}
    others = {f.name: tile(getattr(out, f.name)) for f in dataclasses.fields(out)
              if f.name not in rows and f.name not in (
                  "lengths", "prompt_lengths", "turn_lengths", "window_lengths")}
    # Length >= 1: an empty row would attend to nothing (no loss is taken on it either way).
    return Rollout(**rows, **others, lengths=jnp.maximum(per_turn(out.turn_lengths), 1),
                   prompt_lengths=per_turn(out.window_lengths))


def prompt_widths(codec: Codec) -> tuple[int, int]:
    """Static padded widths of the first prompt and of a later environment message (traced
    once per codec object: building a run and tracing its step ask for them several times)."""
    known = _WIDTHS.get(id(codec))
    if known is not None and known[0]() is codec:
        return known[1]
    widths = _prompt_widths(codec)
    _WIDTHS[id(codec)] = (weakref.ref(codec, lambda _, k=id(codec): _WIDTHS.pop(k, None)),
                          widths)
    return widths


#: id(codec) -> (a weak reference to it, its prompt widths); an entry leaves with its codec.
_WIDTHS: dict[int, tuple[weakref.ref, tuple[int, int]]] = {}


def _prompt_widths(codec: Codec) -> tuple[int, int]:
    symbols = codec.blank_symbols()
    first = jax.eval_shape(codec.first_prompt, symbols, jnp.int32(0))[0].shape[-1]
    later = jax.eval_shape(codec.next_prompt, jnp.int32(2), jnp.float32(0), symbols,
                           jnp.int32(0))[0].shape[-1]
    return first, later


def _write(buffer: jax.Array, start: jax.Array, values: jax.Array, count: jax.Array) -> jax.Array:
    """Writes values[b, :count[b]] at buffer[b, start[b]:]: [B, L], [B], [B, W], [B] -> [B, L]."""
    b, width = values.shape
    cols = start[:, None] + jnp.arange(width)
    cols = jnp.where(jnp.arange(width) < count[:, None], cols, buffer.shape[1])  # dropped
    return buffer.at[jnp.arange(b)[:, None], cols].set(values.astype(buffer.dtype), mode="drop")


#: Token chunk of `prefill_cache`: a message is prefilled in chunks of this many tokens, only
#: as many as its longest row needs (the static message widths hold the longest rendering of
#: any state: Sokoban's 208-token message is ~100 tokens for every 6x6 board).
PREFILL_CHUNK = 32


def prefill_cache(model: Any, ids: jax.Array, counts: jax.Array, cache: KVCache | None,
                  ) -> KVCache | None:
    """Appends ids[b, :counts[b]] to each row's cache (counts may be 0); no cache, no model (a
    demonstration): nothing to do. The columns go in chunks of PREFILL_CHUNK up to the largest
    count (none when every count is 0: rows that ended cost nothing once all have), each chunk
    attending to the filled slots only (layers.cache_attention): the same cache as one call over
    all columns, up to float rounding."""
    if cache is None:
        return None
    width = ids.shape[1]
    chunk = min(PREFILL_CHUNK, width)
    ids = jnp.pad(jnp.maximum(ids, 0), ((0, 0), (0, -width % chunk)))

    def one(i, cache):
        start = i * chunk
        part = jax.lax.dynamic_slice_in_dim(ids, start, chunk, axis=1)
        mask = jnp.arange(chunk) < (counts - start)[:, None]
        return model.hidden_states(part, attention_mask=mask, cache=cache)[1]

    return jax.lax.fori_loop(0, (jnp.max(counts) + chunk - 1) // chunk, one, cache)


def _repeat_rows(tree: Any, n: int) -> Any:
    """Repeats every row n times (row p -> rows p*n .. p*n+n-1) of a [P, ...] pytree."""
    return jax.tree.map(lambda x: jnp.repeat(x, n, axis=0), tree)


def group_states(states: Any, n: int, *, shared_randomness: bool = False) -> Any:
    """P initial env states -> the P * N rows' states (row p * N + i starts from state p).

    Each row gets its own stream of env randomness, `fold_in(state.key, i)` (the original's
    current code: a group's in-reward std then measures the policy, not one shared coin flip),
    unless `shared_randomness`, where all N copy the initial state's key (its first release).
    States without a `key` field are repeated as they are.
    """
    rows = _repeat_rows(states, n)
    if shared_randomness or not hasattr(states, "key"):
        return rows
    index = jnp.tile(jnp.arange(n), states.key.shape[0])
    return rows.replace(key=jax.vmap(jax.random.fold_in)(rows.key, index))


#: A demonstration's replies: (env states [B], turn [] int32, key) -> (tokens [B, W] int32,
#: lengths [B] int32), the tokens after the forced prefix, W <= rollout.reply_tokens. In the
#: JAX rollout a source takes a fourth argument, taken [B] int32: each row's actions so far.
ReplySource = Callable[..., tuple[jax.Array, jax.Array]]


def supplied_replies(replies: ReplySource, states: Any, turn: jax.Array, key: jax.Array,
                     width: int, pad_id: int, taken: jax.Array | None = None) -> GenerateOutput:
    """A turn's supplied replies in the sampler's output shape ([B, width], no log-probs)."""
    tokens, lengths = (replies(states, turn, key) if taken is None
                       else replies(states, turn, key, taken))
    if tokens.shape[1] > width:
        raise ValueError(f"demonstration replies take {tokens.shape[1]} tokens; "
                         f"rollout.reply_tokens = {width} is too small for them")
    tokens = jnp.pad(tokens.astype(jnp.int32), ((0, 0), (0, width - tokens.shape[1])),
                     constant_values=pad_id)
    zeros = jnp.zeros(tokens.shape, jnp.float32)
    return GenerateOutput(tokens=tokens, logprobs=zeros, entropy=zeros,
                          lengths=lengths.astype(jnp.int32),
                          stop_reason=jnp.zeros_like(lengths, jnp.int32), cache=None)


def repeat_cache(cache: KVCache, n: int) -> KVCache:
    """Each of the cache's P rows repeated n times (row p -> rows p*n .. p*n+n-1), as
    group_states repeats the states: a group's shared first prompt prefilled once."""
    return KVCache(k=jnp.repeat(cache.k, n, axis=1), v=jnp.repeat(cache.v, n, axis=1),
                   end=jnp.repeat(cache.end, n))


def _shard_rows(tree: Any, mesh: Mesh | None) -> Any:
    """Rows split over the mesh's data axes (sharding.constrain_batch): axis 0 of every leaf,
    but axis 1 of a KVCache's k and v ([layers, B, ...])."""
    def one(x):
        if isinstance(x, KVCache):
            return KVCache(k=constrain_batch(x.k, mesh, 1), v=constrain_batch(x.v, mesh, 1),
                           end=constrain_batch(x.end, mesh))
        return constrain_batch(x, mesh)

    return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, KVCache))


def observation_ids(env: Any, state: Any) -> jax.Array:
    """[S] int32: every symbol id of one state's `render_symbols` (all its slots), flattened;
    two states render the same text exactly when these are equal (GiGPO's anchor states)."""
    return jnp.concatenate([jnp.ravel(leaf).astype(jnp.int32)
                            for leaf in jax.tree.leaves(env.render_symbols(state))])


def _env_steps(env: Any, state: Any, actions: jax.Array, count: jax.Array, taken: jax.Array,
               max_actions_per_traj: int, history: LoopHistory):
    """Up to A actions per row, stopping at the episode end or the trajectory's action budget.

    state: batched env state [B]; actions [B, A] int32, or a pytree of [B, A, ...] (free-text
    envs); count [B] int32 actions to try (0 for inactive rows); taken [B] int32 actions
    already taken this trajectory; history: the rows' visited states, each step's added.
    Returns (state, reward [B], ended [B], success [B], steps [B], effective [B], history).
    """
    b = count.shape[0]

    def one(carry, i):
        state, reward, ended, success, steps, effective, history = carry
        go = (i < count) & ~ended & (taken + steps < max_actions_per_traj)
        new_state, ts = jax.vmap(env.step)(state, jax.tree.map(lambda a: a[:, i], actions))
        for name in ("success", "action_is_effective"):
            if name not in ts.extras:
                raise ValueError(f"{type(env).__name__}.step must report extras[{name!r}]")
        state = jax.tree.map(
            lambda new, old: jnp.where(go.reshape((b,) + (1,) * (new.ndim - 1)), new, old),
            new_state, state)
        carry = (state, reward + jnp.where(go, ts.reward, 0.0), ended | (go & ts.last()),
                 jnp.where(go, ts.extras["success"], success), steps + go,
                 effective + (go & ts.extras["action_is_effective"]),
                 history.record(jax.vmap(env.fingerprint)(state), go))
        return carry, None

    zeros = jnp.zeros((b,), jnp.int32)
    init = (state, jnp.zeros((b,), jnp.float32), jnp.zeros((b,), bool), jnp.zeros((b,), bool),
            zeros, zeros, history)
    carry, _ = jax.lax.scan(one, init, jnp.arange(jax.tree.leaves(actions)[0].shape[1]))
    return carry


def rollout(graphdef: nnx.GraphDef, params: nnx.State, env: Any, codec: Codec,
            config: RolloutConfig, key: jax.Array, *, eos_id: int, pad_id: int,
            greedy: bool = False, reset_key: jax.Array | None = None,
            mesh: Mesh | None = None, replies: ReplySource | None = None) -> Rollout:
    """Samples B = groups * group_size trajectories (see the module docstring); jit-able.

    graphdef, params = nnx.split(policy model); env: a TextEnv; codec: built for this env and the
    model's tokenizer with the same max_actions_per_turn and mode; key: PRNG key, split into the
    initial-state and sampling keys unless `reset_key` draws the initial states (then `key` only
    drives sampling: evaluation keeps its held-out states fixed). reset_key may also be one
    key per group ([P, 2]: group p starts from env.reset(reset_key[p])) and `key` one per row
    ([B, 2], sampling.row_keys; with reset_key given): then each row's trajectory depends on its
    own keys alone, not on the batch it is in (the evaluator's chunks). greedy: argmax decoding.
    mesh: the rows (tokens, KV cache, env states, the sampler's state) are split over its data
    axes, each device rolling out its share (sharding.constrain_batch).
    replies: a demonstration (starpo_jax.rollout.demonstrations): each turn's reply tokens come from
    `replies(states, turn, key, taken)` instead of the sampler, and everything else is as sampled
    (graphdef and params may then be None: no model runs; behaviour log-probs and entropy 0).
    """
    model = None if replies is not None else nnx.merge(graphdef, params)
    p, n, turns = config.groups, config.group_size, config.max_turns
    b = p * n
    length = buffer_length(codec, config)
    windowed = config.turn_samples
    single = config.context_window_mode == "single_turn"
    if single and codec.single_turn is None:
        raise ValueError("rollout.context_window_mode = 'single_turn' needs a codec built with "
                         "build_codec(..., single_turn=True)")
    width = sample_width(codec, config) if windowed else length  # of the returned rows' turns
    window = width - len(codec.forced_prefix_ids) - config.reply_tokens
    prefix = jnp.asarray(codec.forced_prefix_ids, jnp.int32)
    if config.world_model:
        wm.require_world_model_env(env, codec.template.think)
        wm_tables = wm.coordinate_bytes(env)
    options = SamplingOptions(max_new_tokens=config.reply_tokens, temperature=config.temperature,
                              top_p=config.top_p, top_k=config.top_k, greedy=greedy,
                              stop=stop_strings(), eos_ids=(eos_id,), pad_id=pad_id)
    token_bytes = (codec.parser.token_bytes, codec.parser.token_lengths)
    if reset_key is None:
        reset_key, sample_key = jax.random.split(key)
    else:
        sample_key = key

    # Turn 1's prompt is the same for the N rows of a group: prefill it once per group.
    if row_keys(sample_key) and replies is not None:
        raise ValueError("a demonstration (replies=) takes one sampling key, not one per row")
    reset_keys = reset_key if row_keys(reset_key) else jax.random.split(reset_key, p)
    if reset_keys.shape[0] != p:
        raise ValueError(f"{reset_keys.shape[0]} reset keys for {p} groups")
    states, _ = jax.vmap(env.reset)(reset_keys)
    symbols = jax.vmap(env.render_symbols)(states)
    first_ids, first_n = codec.first_prompt(symbols, jnp.full((p,), config.max_actions_per_traj))
    cache = None
    if model is not None and not windowed:
        group_cache = prefill_cache(model, *_shard_rows((first_ids, first_n, KVCache.init(
            model.config, p, length, config.cache_dtype)), mesh))
        cache = repeat_cache(group_cache, n)
    first_ids, first_n = jnp.repeat(first_ids, n, axis=0), jnp.repeat(first_n, n, axis=0)
    states = group_states(states, n, shared_randomness=config.shared_env_randomness)

    def context(win, k, states, taken, filled, buf):
        """A limited mode's turn k: its window [B, window] int32 and length [B], and a fresh KV
        cache holding it. limited_multi_turn: the first message with the state turn h starts
        from, then the conversation from reply h on (`win` carries each turn's first message
        and reply start); single_turn: its one message (`win` carries each turn's observation,
        budget, reply and reward)."""
        h = jnp.maximum(k - config.window_turns + 1, 0)
        left = config.max_actions_per_traj - taken
        symbols = jax.vmap(env.render_symbols)(states)
        if single:
            win = dict(win, left=win["left"].at[:, k].set(left), symbols=jax.tree.map(
                lambda all_, now: all_.at[:, k].set(now), win["symbols"], symbols))
            ids, count = codec.single_turn_prompt(win["symbols"], win["left"], win["rewards"],
                                                  win["replies"], win["reply_n"], k, h,
                                                  config.window_turns - 1)
        else:
            ids, count = codec.first_prompt(symbols, left, k + 1)
            win = dict(win, firsts=win["firsts"].at[:, k].set(ids),
                       counts=win["counts"].at[:, k].set(count),
                       starts=win["starts"].at[:, k].set(filled))
            head, head_n, start = win["firsts"][:, h], win["counts"][:, h], win["starts"][:, h]
            tail = jnp.take_along_axis(buf, jnp.minimum(start[:, None] + jnp.arange(window),
                                                        length - 1), axis=1)
            ids = _write(jnp.full((b, window), pad_id, jnp.int32), jnp.zeros_like(head_n),
                         head, head_n)
            ids = _write(ids, head_n, tail, filled - start)
            count = head_n + filled - start
        ids = jnp.pad(ids, ((0, 0), (0, window - ids.shape[1])), constant_values=pad_id)
        cache = None
        if model is not None:
            cache = prefill_cache(model, ids, count, KVCache.init(model.config, b, width,
                                                             config.cache_dtype))
        return win, ids, count, cache

    def turn(carry, k):
        (cache, buf, mask, tids, blogp, bent, filled, states, active, taken, success,
         effective, history, win) = carry
        turn_key = fold_in(sample_key, k)
        f = prefix.shape[0]
        if windowed:
            win, window_ids, window_n, cache = context(win, k, states, taken, filled, buf)
        if replies is None:
            gen = generate_pure(graphdef, params, jnp.broadcast_to(prefix, (b, prefix.shape[0])),
                                jnp.full((b,), prefix.shape[0], jnp.int32), turn_key, cache,
                                token_bytes, options, active)
        else:
            gen = supplied_replies(replies, states, k, turn_key, config.reply_tokens, pad_id,
                                   taken)
        cache = None if windowed else gen.cache
        kept = jnp.where(active, gen.lengths, 0)
        buf = _write(buf, filled, jnp.broadcast_to(prefix, (b, f)), jnp.where(active, f, 0))
        at = filled + f
        buf = _write(buf, at, gen.tokens, kept)
        out_at = at
        if windowed:  # the turn's sample: its window, the forced prefix (the reply below)
            row = k * width + jnp.zeros_like(filled)
            samples = _write(win["tokens"], row, window_ids, jnp.where(active, window_n, 0))
            samples = _write(samples, row + window_n, jnp.broadcast_to(prefix, (b, f)),
                             jnp.where(active, f, 0))
            out_at = row + window_n + f
            win = dict(win, tokens=_write(samples, out_at, gen.tokens, kept))
            if single:  # the reply as later prompts show it: its text, without a closing EOS
                last = jnp.take_along_axis(gen.tokens, jnp.maximum(gen.lengths - 1, 0)[:, None],
                                           1)[:, 0]
                shown = gen.lengths - ((gen.lengths > 0) & (last == eos_id))
                win = dict(win, replies=win["replies"].at[:, k].set(gen.tokens),
                           reply_n=win["reply_n"].at[:, k].set(shown))
        mask = _write(mask, out_at, jnp.ones_like(gen.tokens, bool), kept)
        tids = _write(tids, out_at, jnp.full_like(gen.tokens, k), kept)
        blogp = _write(blogp, out_at, gen.logprobs, kept)
        bent = _write(bent, out_at, gen.entropy, kept)
        filled = jnp.where(active, at + gen.lengths, filled)

        reply = jnp.concatenate([jnp.broadcast_to(prefix, (b, f)), gen.tokens], axis=1)
        parsed = codec.parse_reply(reply, f + gen.lengths)
        start_observation = jax.vmap(lambda s: observation_ids(env, s))(states)  # GiGPO
        before = states
        states, reward, ended, won, steps, eff, history = _env_steps(
            env, states, parsed.actions, jnp.where(active, parsed.num_actions, 0), taken,
            config.max_actions_per_traj, history)
        if config.world_model:  # SPA's <observation> / <prediction> blocks (world_model.py)
            seen, foreseen = jax.vmap(wm.probe, in_axes=(None, None, 0, 0, 0, 0))(
                codec.parser, wm_tables, reply, f + gen.lengths,
                jax.vmap(env.render_coordinates)(before), jax.vmap(env.render_coordinates)(states))
            seen, foreseen = seen & active, foreseen & active
            reward = reward + jnp.where(foreseen, config.prediction_reward, 0.0)
        taken = taken + steps
        success = jnp.where(steps > 0, won, success)
        effective = effective + eff
        penalty = jnp.where(active & ~parsed.format_ok, config.format_penalty, 0.0)
        outputs = dict(reward=reward, penalty=penalty, taken=active, anchor=start_observation,
                       format_ok=parsed.format_ok & active,
                       think=jnp.where(active, parsed.think_tokens, 0), reply=kept)
        if config.world_model:
            outputs.update(observation_ok=seen, prediction_ok=foreseen)
        if windowed:
            outputs.update(window=jnp.where(active, window_n, 0),
                           sample=jnp.where(active, window_n + f + kept, 0))
        if single:
            win = dict(win, rewards=win["rewards"].at[:, k].set(reward))
        going = active & ~ended & (taken < config.max_actions_per_traj)

        def next_message(args):
            cache, buf, filled = args
            ids, count = codec.next_prompt(jnp.full((b,), k + 2), reward,
                                           jax.vmap(env.render_symbols)(states),
                                           config.max_actions_per_traj - taken)
            # A reply stopped by EOS already ends with the template's end-of-turn token.
            last = jnp.take_along_axis(gen.tokens, jnp.maximum(gen.lengths - 1, 0)[:, None],
                                       1)[:, 0]
            skip = (gen.lengths > 0) & (last == eos_id) & (ids[:, 0] == eos_id)
            ids = jnp.where(skip[:, None], jnp.roll(ids, -1, axis=1), ids)
            count = jnp.where(going, count - skip, 0)
            cache = prefill_cache(model, ids, count, cache)
            return cache, _write(buf, filled, ids, count), filled + count

        cache, buf, filled = jax.lax.cond(
            jnp.any(going) & (k + 1 < turns), next_message, lambda args: args, (cache, buf, filled))
        carry = (cache, buf, mask, tids, blogp, bent, filled, states, going, taken, success,
                 effective, history, win)
        return _shard_rows(carry, mesh), _shard_rows(outputs, mesh)

    buf = _write(jnp.full((b, length), pad_id, jnp.int32), jnp.zeros((b,), jnp.int32),
                 first_ids, first_n)
    zeros_i = jnp.zeros((b,), jnp.int32)
    out_width = turns * width if windowed else length
    zeros_f = jnp.zeros((b, out_width), jnp.float32)
    win = None
    if windowed:
        first_width = first_ids.shape[1]
        symbols_now = jax.vmap(env.render_symbols)(states)
        win = dict(tokens=jnp.full((b, out_width), pad_id, jnp.int32))
        if single:
            win.update(symbols=jax.tree.map(lambda x: jnp.zeros((b, turns) + x.shape[1:], x.dtype),
                                            symbols_now),
                       left=jnp.zeros((b, turns), jnp.int32),
                       rewards=jnp.zeros((b, turns), jnp.float32),
                       replies=jnp.full((b, turns, config.reply_tokens), pad_id, jnp.int32),
                       reply_n=jnp.zeros((b, turns), jnp.int32))
        else:
            win.update(firsts=jnp.full((b, turns, first_width), pad_id, jnp.int32),
                       counts=jnp.zeros((b, turns), jnp.int32),
                       starts=jnp.zeros((b, turns), jnp.int32))
    init = (cache, buf, jnp.zeros((b, out_width), bool), jnp.full((b, out_width), -1, jnp.int32),
            zeros_f, zeros_f, first_n, states, jnp.ones((b,), bool), zeros_i,
            jnp.zeros((b,), bool), zeros_i,
            LoopHistory.start(jax.vmap(env.fingerprint)(states), config.max_actions_per_traj),
            win)
    carry, per_turn = jax.lax.scan(turn, _shard_rows(init, mesh), jnp.arange(turns))
    (_, buf, mask, tids, blogp, bent, filled, states, _, taken, success, effective, history,
     win) = carry
    observations = jnp.moveaxis(per_turn.pop("anchor"), 0, 1)  # [B, T, S]
    per_turn = jax.tree.map(lambda x: x.T, per_turn)  # [T, B] -> [B, T]
    rows = dict(tokens=buf, lengths=filled)
    if windowed:
        rows = dict(tokens=win["tokens"], lengths=per_turn["sample"].sum(-1),
                    turn_lengths=per_turn["sample"], window_lengths=per_turn["window"])
    return Rollout(**rows, prompt_lengths=first_n, loss_mask=mask,
                   turn_ids=tids, behaviour_logp=blogp, behaviour_entropy=bent,
                   turn_rewards=per_turn["reward"], format_penalties=per_turn["penalty"],
                   turn_taken=per_turn["taken"], format_ok=per_turn["format_ok"],
                   think_tokens=per_turn["think"], reply_lengths=per_turn["reply"],
                   success=success, num_actions=taken, effective_actions=effective,
                   dead_end=jax.vmap(env.dead_end)(states) & ~success, looped=history.looped,
                   turn_anchors=anchor_ids(observations, per_turn["taken"], n),
                   observation_ok=per_turn.get("observation_ok"),
                   prediction_ok=per_turn.get("prediction_ok"))


def chunked_rollout(graphdef: nnx.GraphDef, params: nnx.State, env: Any, codec: Codec,
                    config: RolloutConfig, key: jax.Array, *, eos_id: int, pad_id: int,
                    clock: PhaseClock | None = None, mesh: Mesh | None = None) -> Rollout:
    """`rollout` of config.groups groups in config.chunks sequential pieces (lax.map), piece c
    with key fold_in(key, c); rows stay group-major. One chunk is exactly `rollout(.., key)`.
    With a clock, clock("rollout_chunk", c) runs on the host as piece c ends (phases.py). With a
    mesh, each piece's rows are split over its data axes."""
    if config.chunks == 1:
        return rollout(graphdef, params, env, codec, config, key, eos_id=eos_id, pad_id=pad_id,
                       mesh=mesh)
    piece = dataclasses.replace(config, groups=config.groups // config.chunks, chunks=1)

    def one(c):
        out = rollout(graphdef, params, env, codec, piece, jax.random.fold_in(key, c),
                      eos_id=eos_id, pad_id=pad_id, mesh=mesh)
        return mark(clock, "rollout_chunk", out, c)

    pieces = jax.lax.map(one, jnp.arange(config.chunks))  # [chunks, rows / chunks, ...]
    return merge_rows(jax.tree.map(lambda x: constrain_batch(x, mesh, 1), pieces))
