"""The shared-prefix forward: each group's first prompt runs through the model once, and the
group's rows attend to its keys and values.

    plan = PrefixPlan(width=W, slots=P)
    logp, entropy = shared_logprobs(model, batch, groups, plan, slots, chunk, temperature)
    values = shared_values(critic, batch, groups, plan)

The N rows of a group start with the same first prompt, tokens[:, :prompt_lengths] (the rollout
prefills it once per group). The per-row forwards of the train step (old, reference and
update log-probs, the critic's values) would otherwise run those tokens N times, forward and
backward: at Bandit's shape they are ~95% of a row. Here a slice of s rows (any rows, with
their group ids) is laid out as
  - P prefixes [P, W]: the first prompt of each distinct group of the slice but its last token
    (c = prompt_length - 1 tokens, right-padded to the static width W, the codec's first-prompt
    width), causal attention among themselves;
  - s suffixes [s, S], S = L - W + 1: row r's tokens from position c_r on, at rotary positions
    c_r, c_r + 1, ...; each attends to its group's prefix keys and values (indexed per row: no
    copy of the weights) and causally to its own.
The last prompt token starts the suffix because its hidden state predicts the first reply
token: every hidden state a log-prob needs is then a suffix one. S holds every row's tokens
after c_r because the rollout's buffer leaves exactly L - W slots after the first prompt.
Prefixes and suffixes are packed into one row for the model's dense layers
(`Decoder.hidden_states(..., attend=...)`), so the layer code (and whatever adapters it holds)
is the per-row forward's. The gradient of the prefix's keys and values is summed over the rows
that read them by autodiff (the backward of the gather), so each prefix's backward runs once.

Results equal the per-row forward up to float rounding on every position a loss or advantage
reads (reply tokens and the hidden states before them; values at every t <= length); padding
positions hold other junk. Rows that share no prefix (a group split across slices) are still
exact: a slice computes one prefix per distinct group it holds, up to P; P must bound that
count (`aligned_slots` for group-major slices, else min(groups, rows)).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from starpo_jax.train.forward import logprobs_from_hidden
from starpo_jax.models.decoder import Decoder
from starpo_jax.models.layers import attention


class PrefixPlan(NamedTuple):
    """Static shape of a shared-prefix forward over a slice of rows."""

    width: int  # W: the first prompt's padded width in the buffer (prompt_lengths <= W)
    slots: int  # P: an upper bound on the distinct groups among the slice's rows


def aligned_slots(rows: int, slice_rows: int, group_size: int) -> int:
    """Most groups any slice holds when `rows` group-major rows (row i in group i // group_size)
    are cut into contiguous slices of `slice_rows` rows."""
    if slice_rows < 1 or rows % slice_rows:
        raise ValueError(f"slice_rows = {slice_rows!r} must divide rows = {rows}")
    return max(((j + 1) * slice_rows - 1) // group_size - (j * slice_rows) // group_size + 1
               for j in range(rows // slice_rows))


def plan_for(width: int | None, rows: int, slots: int) -> PrefixPlan | None:
    """The plan of a slice of `rows` rows holding at most `slots` groups, or None (the per-row
    forward) without a known width or when it would not save work (as many prefixes as rows)."""
    if width is None or slots >= rows:
        return None
    return PrefixPlan(width=width, slots=slots)


class SharedHidden(NamedTuple):
    prefix: jax.Array  # [P, W, D] hidden states of the prefixes' positions 0 .. W - 1
    suffix: jax.Array  # [s, S, D] hidden states of positions start .. start + S - 1 of each row
    slot: jax.Array  # [s] int32 the row's prefix
    start: jax.Array  # [s] int32 c: prefix tokens of the row (its first suffix position)


def shared_hidden(model: Decoder, tokens: jax.Array, lengths: jax.Array,
                  prompt_lengths: jax.Array, groups: jax.Array, plan: PrefixPlan) -> SharedHidden:
    """Final hidden states of the rows' tokens, each group's prefix computed once.

    tokens [s, L] int32 (right-padded after lengths [s] int32); prompt_lengths [s] int32 in
    [1, W], the same within a group, whose rows hold the same tokens before it; groups [s]
    int32, equal for rows of a group; every row has lengths - prompt_lengths <= L - W.
    """
    s, length = tokens.shape
    w, p = plan.width, plan.slots
    if not 1 <= w <= length:
        raise ValueError(f"prefix width {w!r} must be in [1, L = {length}]")
    width = length - w + 1  # S
    # Distinct groups, sorted; the unused slots repeat the largest (a duplicate, never read).
    distinct = jnp.unique(groups, size=p, fill_value=jnp.max(groups))
    slot = jnp.searchsorted(distinct, groups).astype(jnp.int32)
    source = jnp.argmax(groups[None, :] == distinct[:, None], axis=1)  # [P] a row of each
    start = jnp.maximum(prompt_lengths - 1, 0).astype(jnp.int32)
    prefix_len = start[source]
    cols = start[:, None] + jnp.arange(width)  # [s, S] positions of the suffix tokens
    suffix_ids = jnp.take_along_axis(tokens, jnp.minimum(cols, length - 1), axis=1)
    suffix_len = lengths - start

    steps_w, steps_s = jnp.arange(w), jnp.arange(width)
    prefix_visible = ((steps_w[None, :, None] >= steps_w[None, None, :])
                      & (steps_w[None, None, :] < prefix_len[:, None, None]))  # [P, W, W]
    own = ((steps_s[None, :, None] >= steps_s[None, None, :])
           & (steps_s[None, None, :] < suffix_len[:, None, None]))  # [s, S, S]
    shared = jnp.broadcast_to((steps_w[None, :] < start[:, None])[:, None, :], (s, width, w))
    suffix_visible = jnp.concatenate([shared, own], axis=2)  # [s, S, W + S]
    n = p * w

    def attend(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        def parts(x):
            heads_first = lambda y: y.transpose(0, 2, 1, 3)  # noqa: E731
            return (heads_first(x[0, :n].reshape(p, w, *x.shape[2:])),
                    heads_first(x[0, n:].reshape(s, width, *x.shape[2:])))

        (kp, ks), (vp, vs) = parts(k), parts(v)
        qp, qs = q[0, :n].reshape(p, w, *q.shape[2:]), q[0, n:].reshape(s, width, *q.shape[2:])
        out_p = attention(qp, kp, vp, prefix_visible, causal=True)
        keys = jnp.concatenate([kp[slot], ks], axis=2)  # [s, KVH, W + S, hd]
        vals = jnp.concatenate([vp[slot], vs], axis=2)
        out_s = attention(qs, keys, vals, suffix_visible, causal=True)
        return jnp.concatenate([out_p.reshape(1, n, *q.shape[2:]),
                                out_s.reshape(1, s * width, *q.shape[2:])], axis=1)

    ids = jnp.concatenate([tokens[source, :w].reshape(-1), suffix_ids.reshape(-1)])[None]
    positions = jnp.concatenate([jnp.tile(steps_w, p), cols.reshape(-1)])[None]
    h = model.hidden_states(ids, positions=positions.astype(jnp.int32), attend=attend)[0]
    return SharedHidden(prefix=h[:n].reshape(p, w, -1), suffix=h[n:].reshape(s, width, -1),
                        slot=slot, start=start)


def shared_logprobs(model: Decoder, batch, groups: jax.Array, plan: PrefixPlan, slots: int,
                    chunk: int, temperature: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """`forward.sequence_logprobs` of a Rollout's rows [s, L] with groups [s] int32, each
    group's prefix computed once: (logp, entropy) [s, L] float32."""
    hidden = shared_hidden(model, batch.tokens, batch.lengths, batch.prompt_lengths, groups, plan)
    return logprobs_from_hidden(model, hidden.suffix, hidden.start, batch.tokens,
                                batch.loss_mask, slots, chunk, temperature)


def shared_values(critic: Decoder, batch, groups: jax.Array, plan: PrefixPlan) -> jax.Array:
    """`forward.sequence_values` of a Rollout's rows with groups [s] int32: [s, L] float32,
    V of the context before each token (0 at t = 0; junk after t = length)."""
    hidden = shared_hidden(critic, batch.tokens, batch.lengths, batch.prompt_lengths, groups,
                           plan)
    prefix = critic.value_from_hidden(hidden.prefix)  # [P, W]
    suffix = critic.value_from_hidden(hidden.suffix)  # [s, S]
    before = jnp.arange(batch.tokens.shape[1] - 1)  # t - 1 for t = 1 .. L - 1
    start = hidden.start[:, None]
    from_prefix = prefix[hidden.slot[:, None], jnp.minimum(before, prefix.shape[1] - 1)]
    from_suffix = jnp.take_along_axis(
        suffix, jnp.clip(before - start, 0, suffix.shape[1] - 1), axis=1)
    values = jnp.where(before < start, from_prefix, from_suffix)
    return jnp.pad(values, ((0, 0), (1, 0)))


def group_sorted(order: jax.Array, minibatches: int, group_size: int) -> jax.Array:
    """The rows of each mini-batch of `order` ([R] int32 kept-row indices, group-major rows)
    sorted by group, stably: which rows make a mini-batch is unchanged (the update's result too,
    up to the order of float sums), and a mini-batch of every row becomes group-major."""
    by_batch = order.reshape(minibatches, -1)
    rank = jnp.argsort(by_batch // group_size, axis=1, stable=True)
    return jnp.take_along_axis(by_batch, rank, axis=1).reshape(-1)


def slice_plans(width: int | None, config) -> tuple[PrefixPlan | None, PrefixPlan | None]:
    """The plans of the train step's row slices (a TrainConfig's kept rows): prepare's
    optim.micro_batches slices of the group-major kept rows, and the update's micro-batches of
    a mini-batch (group-major too when one mini-batch holds every row, after `group_sorted`;
    otherwise any min(groups, rows) groups)."""
    rows, n, pieces = config.kept_rows, config.rollout.group_size, config.optim.micro_batches
    prepare_rows = rows // pieces
    prepare = plan_for(width, prepare_rows, aligned_slots(rows, prepare_rows, n))
    update_rows = rows // config.minibatches // pieces
    if config.minibatches == 1:
        bound = aligned_slots(rows, update_rows, n)
    else:
        bound = min(config.kept_groups, update_rows)
    return prepare, plan_for(width, update_rows, bound)
