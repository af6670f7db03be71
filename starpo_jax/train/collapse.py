"""RAGEN-2's "template collapse" metrics: does the first reply still depend on its prompt?

Row i of a step's B = P * N rows answered prompt x_g(i), g(i) = i // N. Every sampled first-turn
reply r_i is scored under each of the P first prompts x_j (forced prefix on the prompt side):

    l[i, j] = sum_t log p(r_i,t | x_j, r_i,<t)      (logits / rollout temperature)

As the original's code (ragen/trainer/collapse_metrics.py) does, rows with an empty reply are
left out and the metrics read the per-token scores l[i, j] / |r_i|:
  collapse/mi_estimate      mean_i [lbar[i, g(i)] - (logsumexp_j lbar[i, j] - log P)]
  collapse/mi_seq_estimate  the same on the summed scores l (the fact sheet's formula)
  collapse/retrieval_acc    fraction of i whose best-scoring prompt is x_g(i) (a column whose
                            prompt is token-identical to x_g(i) counts too, as in the original)
  collapse/retrieval_chance that fraction for a random guess: 1 / P when the prompts differ
  collapse/reply_entropy    -mean_i lbar[i, g(i)], H(Z|X) per token (the original's
                            conditional_entropy_est)
  collapse/valid_rate       fraction of rows with a non-empty first reply

Each prompt is prefilled once (all but its last token) into a P-row KV cache; a (reply, prompt)
pair is then one forward of [last prompt token ; reply] continuing a copy of that prompt's
cache rows, `micro_rows` pairs at a time (memory), so a score never recomputes its prompt.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from starpo_jax.config import CollapseConfig, RolloutConfig
from starpo_jax.models.cache import KVCache
from starpo_jax.rollout.jax_env import Rollout
from starpo_jax.text.codec import Codec

Metrics = dict[str, jax.Array]
COMPUTED = "collapse/computed"


class FirstTurn(flax.struct.PyTreeNode):
    """The first turn of a rollout: P distinct prompts and the B = P * N replies to them."""

    prompts: jax.Array  # [P, W] int32 first prompt + forced prefix, garbage after prompt_lengths
    prompt_lengths: jax.Array  # [P] int32 (>= 1)
    replies: jax.Array  # [B, R] int32 sampled tokens, garbage after reply_lengths
    reply_lengths: jax.Array  # [B] int32 (0 = empty)


def first_turn(out: Rollout, codec: Codec, config: RolloutConfig) -> FirstTurn:
    """The first turn of `out` (rows group-major, b = p * N + n), as `rollout` laid it out: the
    first prompt, the forced prefix, then turn 1's reply. W = the codec's padded first-prompt
    width + the prefix, R = config.reply_tokens."""
    n, f = config.group_size, len(codec.forced_prefix_ids)
    symbols = codec.blank_symbols()  # a grid or the env's slots
    width = jax.eval_shape(codec.first_prompt, symbols, jnp.int32(0))[0].shape[-1] + f
    start = out.prompt_lengths + f  # [B]
    cols = jnp.minimum(start[:, None] + jnp.arange(config.reply_tokens), out.tokens.shape[1] - 1)
    return FirstTurn(prompts=out.tokens[::n, :width], prompt_lengths=start[::n],
                     replies=jnp.take_along_axis(out.tokens, cols, axis=1),
                     reply_lengths=out.reply_lengths[:, 0])


def cross_logprobs(graphdef: nnx.GraphDef, params: nnx.State, turn: FirstTurn, *,
                   temperature: float, micro_rows: int, logit_chunk: int) -> jax.Array:
    """l[i, j] = log p(replies[i, :reply_lengths[i]] | prompt j) summed over the reply's tokens,
    at `temperature` -> [B, P] float32 (0 for an empty reply). Scores micro_rows (reply, prompt)
    pairs per forward and the logits of logit_chunk reply positions at a time; jit-able."""
    model = nnx.merge(graphdef, params)
    p, width = turn.prompts.shape
    b, r = turn.replies.shape
    # All but the last prompt token go in the cache: the last one opens the scored block, its
    # output predicting the reply's first token.
    cache = KVCache.init(model.config, p, width + r)
    _, cache = model.hidden_states(
        jnp.maximum(turn.prompts, 0), cache=cache,
        attention_mask=jnp.arange(width) < (turn.prompt_lengths - 1)[:, None])
    last = jnp.take_along_axis(turn.prompts, (turn.prompt_lengths - 1)[:, None], axis=1)[:, 0]

    pairs = p * b
    rows = min(micro_rows, pairs)
    padded = -(-pairs // rows) * rows
    k = jnp.arange(padded)
    j, i = (k // b) % p, k % b  # pair k = (reply i, prompt j); padding pairs score nothing
    counts = jnp.where(k < pairs, turn.reply_lengths[i], 0)
    chunk = min(logit_chunk, r)
    pad_r = -r % chunk

    def score(pair):
        j, i, count = pair
        rows_cache = KVCache(k=jnp.take(cache.k, j, axis=1), v=jnp.take(cache.v, j, axis=1),
                             end=cache.end[j])
        targets = jnp.maximum(turn.replies[i], 0)  # [rows, R]
        ids = jnp.concatenate([last[j][:, None], targets], axis=1)
        mask = jnp.arange(r + 1) < (count + 1)[:, None]
        hidden, _ = model.hidden_states(ids, attention_mask=mask, cache=rows_cache)
        h = jnp.pad(hidden[:, :r], ((0, 0), (0, pad_r), (0, 0)))
        t = jnp.pad(targets, ((0, 0), (0, pad_r)))
        split = lambda x: jnp.moveaxis(x.reshape(rows, -1, chunk, *x.shape[2:]), 1, 0)  # noqa: E731

        def token_logp(xs):
            h, t = xs
            logp = jax.nn.log_softmax(model.logits_from_hidden(h) / temperature, axis=-1)
            return jnp.take_along_axis(logp, t[..., None], axis=-1)[..., 0]

        logp = jnp.moveaxis(jax.lax.map(token_logp, (split(h), split(t))), 0, 1)
        logp = logp.reshape(rows, -1)[:, :r]
        return jnp.sum(jnp.where(jnp.arange(r) < count[:, None], logp, 0.0), axis=1)

    split_pairs = lambda x: x.reshape(-1, rows)  # noqa: E731
    scores = jax.lax.map(score, (split_pairs(j), split_pairs(i), split_pairs(counts)))
    return scores.reshape(-1)[:pairs].reshape(p, b).T


def same_prompt(prompts: jax.Array, lengths: jax.Array) -> jax.Array:
    """[P, W] int32, [P] int32 -> [P, P] bool: prompts j and k are token-identical."""
    real = jnp.arange(prompts.shape[1]) < lengths[:, None]
    ids = jnp.where(real, prompts, -1)
    return jnp.all(ids[:, None] == ids[None], axis=-1)


def metrics_from_scores(scores: jax.Array, reply_lengths: jax.Array, same: jax.Array) -> Metrics:
    """The module docstring's metrics from l = scores [B, P] float32, reply_lengths [B] int32
    and same_prompt [P, P] bool (row i's prompt is i // (B / P))."""
    b, p = scores.shape
    own = jnp.arange(b) // (b // p)
    valid = reply_lengths > 0
    weight = valid / jnp.maximum(valid.sum(), 1)
    mean = lambda x: jnp.sum(x * weight)  # noqa: E731  (over rows with a reply)
    per_token = scores / jnp.maximum(reply_lengths, 1)[:, None]

    def mi(logits):
        matched = logits[jnp.arange(b), own]
        return mean(matched - jax.nn.logsumexp(logits, axis=1) + math.log(p))

    best = jnp.argmax(per_token, axis=1)
    return {"collapse/mi_estimate": mi(per_token), "collapse/mi_seq_estimate": mi(scores),
            "collapse/retrieval_acc": mean(same[best, own]),
            "collapse/retrieval_chance": mean(same[own].sum(1) / p),
            "collapse/reply_entropy": -mean(per_token[jnp.arange(b), own]),
            "collapse/valid_rate": valid.mean()}


def collapse_metrics(graphdef: nnx.GraphDef, params: nnx.State, turn: FirstTurn, *,
                     temperature: float, micro_rows: int, logit_chunk: int) -> Metrics:
    """The module docstring's metrics of one first turn (float32 scalars); jit-able."""
    p, b = turn.prompts.shape[0], turn.replies.shape[0]
    if p < 2 or b % p:
        raise ValueError(f"collapse metrics need P >= 2 prompts and a multiple of P replies; got "
                         f"P = {p} prompts and B = {b} replies")
    scores = cross_logprobs(graphdef, params, turn, temperature=temperature,
                            micro_rows=micro_rows, logit_chunk=logit_chunk)
    return metrics_from_scores(scores, turn.reply_lengths,
                               same_prompt(turn.prompts, turn.prompt_lengths))


def collapse_step_metrics(config: CollapseConfig, rollout_config: RolloutConfig,
                          turn_of: Callable[[Rollout], FirstTurn] | None,
                          graphdef: nnx.GraphDef, params: nnx.State, out: Rollout,
                          step: jax.Array, *, logit_chunk: int) -> Metrics:
    """For the train step: the metrics of out's first turn (`turn_of(out)`: `first_turn` with
    the rollout's codec) under `params` (the rollout's policy) when step % config.every == 0,
    zeros otherwise, with COMPUTED = 1.0 exactly when they were computed (and some reply was
    non-empty). {} when config.every is 0."""
    if not config.every:
        return {}
    if turn_of is None:
        raise ValueError(f"collapse.every = {config.every} is invalid for a rollout without a "
                         "codec (a host env's: no static first turn); valid: 0")
    turn = turn_of(out)

    def compute(_: Any) -> Metrics:
        return collapse_metrics(graphdef, params, turn, temperature=rollout_config.temperature,
                                micro_rows=config.micro_rows, logit_chunk=logit_chunk)

    due = step % config.every == 0
    shapes = jax.eval_shape(compute, None)
    metrics = jax.lax.cond(due, compute, lambda _: jax.tree.map(
        lambda s: jnp.zeros(s.shape, s.dtype), shapes), None)
    metrics[COMPUTED] = (due & (metrics["collapse/valid_rate"] > 0)).astype(jnp.float32)
    return metrics


def drop_uncomputed(metrics: dict[str, float]) -> dict[str, float]:
    """Host side: a step's metrics without COMPUTED, and without every collapse/* metric when
    COMPUTED was 0 (a step the collapse metrics skipped logs none)."""
    keep = metrics.get(COMPUTED, 0.0) > 0
    return {k: v for k, v in metrics.items()
            if k != COMPUTED and (keep or not k.startswith("collapse/"))}
