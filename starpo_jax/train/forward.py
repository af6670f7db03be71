"""Teacher-forced forwards over rollout rows, and the row slicing that bounds their memory.

    logp, entropy = sequence_logprobs(model, tokens, lengths, loss_mask, slots, chunk,
                                      temperature=1.0)
    values = sequence_values(critic, tokens, lengths)

The policy's probabilities in training are those of the sampler's distribution: the logits are
divided by the rollout temperature before every softmax (veRL's convention), so the PPO ratio,
the entropy and the KL are on-policy at any temperature. top-p / top-k truncation is a sampling
device only and is not applied here (as in veRL).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from starpo_jax.algo.losses import token_entropy
from starpo_jax.models.decoder import Decoder
from starpo_jax.models.sharding import constrain_batch, merge_rows, split_rows


def accumulated_grad(loss_fn: Callable[[Any, Any], tuple[jax.Array, Any]], params: Any, batch: Any,
                     micro_batches: int, mesh: Mesh | None = None) -> tuple[Any, Any]:
    """Gradient of loss_fn(params, batch) -> (loss, aux) summed over `micro_batches` row slices.

    Every leaf of batch is [rows, ...] with rows divisible by micro_batches; the slices' grads
    are summed in a lax.scan, so only one slice's activations are live at a time. The sum is
    the whole batch's gradient when loss_fn normalises by the whole batch (see
    `losses.aggregate`'s normaliser). aux leaves [rows / micro_batches, ...] come back
    concatenated to [rows, ...]. mesh: each slice's rows split over its data axes.
    """
    grad_fn = jax.grad(loss_fn, has_aux=True)
    if micro_batches == 1:
        return grad_fn(params, batch)

    def add_slice(total, piece):
        grads, aux = grad_fn(params, piece)
        return jax.tree.map(jnp.add, total, grads), aux

    grads, aux = jax.lax.scan(add_slice, jax.tree.map(jnp.zeros_like, params),
                              split_rows(batch, micro_batches, mesh))
    return grads, merge_rows(aux)


def in_row_slices(fn: Callable[[Any], Any], batch: Any, pieces: int,
                  mesh: Mesh | None = None) -> Any:
    """fn(batch) for a row-wise fn, computed on `pieces` row slices in turn (lax.map): the
    same rows out, with one slice's activations live at a time (the old, reference and value
    forwards, under optim.micro_batches). mesh: each slice's rows split over its data axes."""
    if pieces == 1:
        return fn(batch)
    return merge_rows(jax.lax.map(fn, split_rows(batch, pieces, mesh)))


#: Buffers at least this long run their teacher-forced passes over the shortest of a few widths
#: that holds the batch's real tokens (`length_widths`); shorter ones always run whole.
TRIM_FROM = 512
#: The widths' shares of the buffer length L (each rounded up to WIDTH_MULTIPLE), L itself last.
WIDTH_SHARES = (0.55, 0.7, 0.85)
WIDTH_MULTIPLE = 32


def length_widths(length: int, floor: int = 1) -> tuple[int, ...]:
    """The compiled widths of a buffer of `length` tokens, none below `floor`, ascending, the
    last = length."""
    if length < TRIM_FROM:
        return (length,)
    up = lambda x: -(-x // WIDTH_MULTIPLE) * WIDTH_MULTIPLE  # noqa: E731
    return tuple(sorted({min(length, max(floor, up(int(length * f)))) for f in WIDTH_SHARES}
                        | {length}))


def over_real_length(fn: Callable[[Any], tuple[Any, Any]], tree: Any, need: jax.Array,
                     length: int, floor: int = 1) -> tuple[Any, Any]:
    """fn(tree) over the shortest of length_widths(length, floor) that is >= need (a
    lax.switch: each width its own compiled branch, one of them runs; floor: the least width
    fn takes, e.g. a shared prefix's).

    Every leaf of tree whose axis 1 has `length` entries ([rows, L, ...]) is cut to the
    width's first columns; fn(cut) -> (out, per_token) with per_token's leaves [rows, width, ...],
    padded back to [rows, L, ...] with zeros. need: [] int32, the columns fn's result reads
    (e.g. the rows' longest real length). Padding takes a share of a rollout's buffer that
    grows with its turns (a turn's message is padded to its static width): the forward and
    backward passes of a causal model over columns before `need` do not read the later ones,
    so the result is fn(tree)'s up to float rounding wherever per_token is read.
    """
    widths = length_widths(length, floor)
    if len(widths) == 1:
        return fn(tree)

    def branch(width: int) -> Callable[[Any], tuple[Any, Any]]:
        def run(tree):
            cut = jax.tree.map(lambda x: x[:, :width] if x.ndim >= 2 and x.shape[1] == length
                               else x, tree)
            out, per_token = fn(cut)
            pad = lambda y: jnp.pad(y, [(0, 0), (0, length - width)]  # noqa: E731
                                    + [(0, 0)] * (y.ndim - 2))
            return out, jax.tree.map(pad, per_token)
        return run

    index = jnp.searchsorted(jnp.asarray(widths, jnp.int32), need.astype(jnp.int32))
    return jax.lax.switch(jnp.minimum(index, len(widths) - 1), [branch(w) for w in widths], tree)


def reply_slots(loss_mask: jax.Array, slots: int) -> tuple[jax.Array, jax.Array]:
    """Positions of the first `slots` reply tokens of each row, in order.

    loss_mask [B, L] bool -> (positions [B, slots] int32 (0 where unused), used [B, slots] bool).
    """
    b, length = loss_mask.shape
    rank = jnp.cumsum(loss_mask, axis=1) - 1
    target = jnp.where(loss_mask & (rank < slots), rank, slots)
    positions = jnp.zeros((b, slots), jnp.int32).at[jnp.arange(b)[:, None], target].set(
        jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length)), mode="drop")
    return positions, jnp.arange(slots) < jnp.minimum(loss_mask.sum(1), slots)[:, None]


def sequence_logprobs(model: Decoder, tokens: jax.Array, lengths: jax.Array,
                      loss_mask: jax.Array, slots: int, chunk: int, temperature: float = 1.0,
                      ) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced log p(tokens[t] | tokens[:t]) and that distribution's entropy, at reply
    tokens only, under softmax(logits / temperature).

    tokens [B, L] int32, lengths [B] int32, loss_mask [B, L] bool (reply tokens, none at t = 0);
    slots: static bound on reply tokens per row. Returns (logp, entropy), [B, L] float32, 0 off
    the mask. Logits exist only for the reply positions, `chunk` of them at a time, and are
    recomputed in the backward pass: the [*, V] projection is the costly part for small models.
    """
    mask = jnp.arange(tokens.shape[1]) < lengths[:, None]
    hidden = model.hidden_states(tokens, attention_mask=mask)
    start = jnp.zeros(tokens.shape[:1], jnp.int32)
    return logprobs_from_hidden(model, hidden, start, tokens, loss_mask, slots, chunk, temperature)


def logprobs_from_hidden(model: Decoder, hidden: jax.Array, start: jax.Array, tokens: jax.Array,
                         loss_mask: jax.Array, slots: int, chunk: int, temperature: float = 1.0,
                         ) -> tuple[jax.Array, jax.Array]:
    """`sequence_logprobs` from hidden states [B, S, D] of positions start[b] .. start[b] + S - 1
    of each row (start [B] int32; every reply position t must have start <= t - 1 < start + S);
    tokens [B, L] int32, loss_mask [B, L] bool. Returns (logp, entropy) [B, L] float32."""
    b = tokens.shape[0]
    positions, used = reply_slots(loss_mask, slots)
    rows = jnp.arange(b)[:, None]
    # The hidden state at t - 1 predicts the token at t.
    index = jnp.clip(positions - 1 - start[:, None], 0, hidden.shape[1] - 1)
    h = hidden[rows, index]
    targets = tokens[rows, positions]
    pad = -slots % chunk
    h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    n = (slots + pad) // chunk

    @jax.checkpoint
    def one(xs):
        h, t = xs
        logits = model.logits_from_hidden(h)
        if temperature != 1.0:
            logits = logits / temperature
        logp = jax.nn.log_softmax(logits, axis=-1)
        return jnp.take_along_axis(logp, t[..., None], axis=-1)[..., 0], token_entropy(logits)

    split = lambda x: jnp.moveaxis(x.reshape(b, n, chunk, *x.shape[2:]), 1, 0)  # noqa: E731
    logp, entropy = jax.lax.map(one, (split(h), split(targets)))

    def scatter(x):
        x = jnp.moveaxis(x, 0, 1).reshape(b, -1)[:, :slots]
        cols = jnp.where(used, positions, tokens.shape[1])
        return jnp.zeros(tokens.shape, jnp.float32).at[rows, cols].set(x, mode="drop")

    return scatter(logp), scatter(entropy)


def sequence_values(critic: Decoder, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
    """V of the context before each token: [B, L] int32, [B] -> [B, L] float32 (0 at t = 0)."""
    mask = jnp.arange(tokens.shape[1]) < lengths[:, None]
    values = critic.value(tokens, attention_mask=mask)
    return jnp.pad(values[:, :-1], ((0, 0), (1, 0)))
