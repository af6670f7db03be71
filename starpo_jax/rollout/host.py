"""The multi-turn rollout of a host env: the compiled sampler per turn, the env on the host.

    pool = EnvPool(name, envs_host.factory(name), rows=config.batch_size)
    text = build_host_text(tokenizer, envs_host.make(name), config)
    out, stats = host_rollout(graphdef, params, pool, text, config, key, eos_id=2, pad_id=2)

The same trajectories as `rollout.rollout` (its docstring) with the env outside jit: one row
b = p * N + n per trajectory, the N rows of group p reset with the same seed; turn 1's prompt
prefilled once per group and its KV cache copied to the N rows; each turn one compiled call
prefills the new environment message (turns >= 2) and samples the reply with the forced prefix
and key fold_in(sample_key, turn) (the KV cache is carried across turns on the device: the
history is never prefilled again). On the host between calls: the replies are parsed
(`HostText.parse`), up to max_actions_per_turn actions per row are stepped in the pool (all
rows in parallel, action by action), and the next messages tokenised into static widths.
The result is a `Rollout` like the compiled one's, so `prepare` / `update` train on it. It
keeps no env states, so its `dead_end` and `looped` are None: its failure classes
(starpo_jax.algo.failures) are only success, format, invalid and out_of_budget. Its GiGPO anchors
(`turn_anchors`) compare the observation texts each turn starts from, exactly (a dict per
group, no hash).

Seeds: `seeds` [P] if given, else drawn from the key's reset half (a run's numbers depend
only on its key). A row whose env call fails (raised or timed out; see envs_host.pool) ends
there with all its env rewards 0 and no success; `stats` counts such rows and the
observations cut to fit their width.

A demonstration (`replies=`, starpo_jax.rollout.demonstrations.host_demonstrate) is this same loop
with each turn's reply tokens supplied, from the rows' current observation texts, instead of
sampled, and no model.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from envs_host.base import HostEnvError
from envs_host.pool import EnvPool
from starpo_jax.config import RolloutConfig
from starpo_jax.rollout.host_text import HostText
from starpo_jax.models.cache import KVCache
from starpo_jax.rollout.jax_env import (Rollout, prefill_cache, repeat_cache, supplied_replies,
                                        turn_buffer_length)
from starpo_jax.rollout.sampling import SamplingOptions, generate_pure
from starpo_jax.text.parse import stop_strings

log = logging.getLogger(__name__)


def host_buffer_length(text: HostText, config: RolloutConfig) -> int:
    """L of a host env's rollout: the JAX rollout's rule (`turn_buffer_length`) on the host
    text's padded prompt widths."""
    return turn_buffer_length(text.first_width, text.later_width, len(text.forced_prefix_ids),
                              config)


def host_sample_width(text: HostText, config: RolloutConfig) -> int:
    """W of a limited context mode's turn sample: window, forced prefix and reply, static."""
    return text.window_width + len(text.forced_prefix_ids) + config.reply_tokens


def _generate(graphdef, params, cache, prefix, key, token_bytes, options, active=None):
    b, f = cache.end.shape[0], prefix.shape[0]
    return generate_pure(graphdef, params, jnp.broadcast_to(prefix, (b, f)),
                         jnp.full((b,), f, jnp.int32), key, cache, token_bytes, options, active)


@functools.partial(jax.jit, static_argnames=("graphdef", "options", "group_size", "length",
                                             "cache_dtype"))
def _first_turn(graphdef, params, ids, counts, prefix, key, token_bytes, *, options, group_size,
                length, cache_dtype):
    """Prefills each group's prompt [P, W] once, copies it to its N rows, samples turn 1."""
    model = nnx.merge(graphdef, params)
    cache = KVCache.init(model.config, ids.shape[0], length, cache_dtype)
    cache = repeat_cache(prefill_cache(model, ids, counts, cache), group_size)
    return _generate(graphdef, params, cache, prefix, key, token_bytes, options)


@functools.partial(jax.jit, static_argnames=("graphdef", "options"), donate_argnames=("cache",))
def _later_turn(graphdef, params, cache, ids, counts, prefix, key, token_bytes, *, options):
    """Appends each row's message ids[b, :counts[b]] (0 for rows that stopped: they sample
    nothing), samples."""
    cache = prefill_cache(nnx.merge(graphdef, params), ids, counts, cache)
    return _generate(graphdef, params, cache, prefix, key, token_bytes, options, counts > 0)


def _padded(rows: list[list[int]], width: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    return ids, np.array([len(r) for r in rows], np.int32)


def _group_observations(pool: EnvPool, observations: list[str | None], n: int) -> list[str]:
    """One first observation per group; rows of a group must agree (same seed, same text)."""
    out = []
    for p in range(len(observations) // n):
        seen = {o for o in observations[p * n: (p + 1) * n] if o is not None}
        if len(seen) > 1:
            raise HostEnvError(f"env {pool.name!r}: reset({pool.seeds[p * n]}) gave different "
                               f"observations on rows of one group: {sorted(seen)!r:.300}; "
                               "reset(seed) must be deterministic")
        out.append(seen.pop() if seen else "")
    return out


def _anchor_ids(texts: np.ndarray, n: int) -> np.ndarray:
    """advantages.anchor_ids on the host: [B, T] observation texts each turn started from (None
    = not taken) -> [B, T] int32, the flat index n * T + k of the group's first turn with the
    same text, -1 for turns not taken. Exact (texts compared as strings)."""
    b, turns = texts.shape
    ids = np.full((b, turns), -1, np.int32)
    for group in range(b // n):
        seen: dict[str, int] = {}
        for i, text in enumerate(texts[group * n: (group + 1) * n].reshape(-1)):
            if text is not None:
                ids[group * n + i // turns, i % turns] = seen.setdefault(text, i)
    return ids


def host_rollout(graphdef: nnx.GraphDef, params: nnx.State, pool: EnvPool, text: HostText,
                 config: RolloutConfig, key: jax.Array, *, eos_id: int, pad_id: int,
                 seeds: Any = None, greedy: bool = False,
                 replies: Callable[[list[str | None], int, jax.Array], tuple[Any, Any]] | None
                 = None) -> tuple[Rollout, dict[str, float]]:
    """B = groups * group_size trajectories of `pool`'s env (see the module docstring).

    graphdef, params = nnx.split(policy); pool: config.batch_size rows; text: built for this
    env, tokenizer and config; key: split into the reset and sampling keys as `rollout` does.
    greedy: argmax replies (evaluation); the temperature then only scales the log-probs.
    replies: a demonstration: each turn's reply tokens come from replies(observations, turn,
    key) -> (tokens [B, W] int32 after the forced prefix, lengths [B]), the observations the
    rows' current texts (None for rows that stopped), instead of the sampler (graphdef and
    params may then be None).
    Returns (Rollout with arrays [B, L] / [B, T] / [B], host stats as floats).
    """
    p, n, turns = config.groups, config.group_size, config.max_turns
    b = p * n
    if pool.rows != b:
        raise ValueError(f"the pool has {pool.rows} rows; the rollout needs groups x group_size"
                         f" = {b}")
    length = host_buffer_length(text, config)
    prefix = list(text.forced_prefix_ids)
    f = len(prefix)
    prefix_arr = jnp.asarray(prefix, jnp.int32)
    options = SamplingOptions(max_new_tokens=config.reply_tokens, temperature=config.temperature,
                              top_p=config.top_p, top_k=config.top_k, greedy=greedy,
                              stop=stop_strings(),
                              eos_ids=(eos_id,), pad_id=pad_id)
    token_bytes = (jnp.asarray(text.table.bytes), jnp.asarray(text.table.lengths))
    reset_key, sample_key = jax.random.split(key)
    if seeds is None:
        seeds = jax.random.randint(reset_key, (p,), 0, np.iinfo(np.int32).max)
    seeds = np.asarray(seeds, np.int64)
    if seeds.shape != (p,):
        raise ValueError(f"seeds must have shape ({p},) (one per group); got {seeds.shape}")
    budget = config.max_actions_per_traj

    env_seconds = time.perf_counter()
    observations = pool.reset(np.repeat(seeds, n).tolist())
    env_seconds = time.perf_counter() - env_seconds
    truncated = 0
    first = []
    for obs in _group_observations(pool, observations, n):
        ids, cut = text.first_ids(obs, budget)
        first.append(ids)
        truncated += cut
    first_ids, first_n = _padded(first, text.first_width)

    windowed = config.turn_samples
    width = host_sample_width(text, config) if windowed else length
    tokens = np.full((b, length), pad_id, np.int32)  # the conversation
    # The returned rows: the conversation, or each turn's sample at columns k * width.
    samples = np.full((b, turns * width), pad_id, np.int32) if windowed else tokens
    mask = np.zeros(samples.shape, bool)
    tids = np.full(samples.shape, -1, np.int32)
    blogp = np.zeros(samples.shape, np.float32)
    bent = np.zeros(samples.shape, np.float32)
    for row in range(b):
        tokens[row, : first_n[row // n]] = first[row // n]
    filled = np.repeat(first_n, n).astype(np.int64)
    per_turn = {name: np.zeros((b, turns), dtype) for name, dtype in (
        ("reward", np.float32), ("penalty", np.float32), ("taken", bool), ("format_ok", bool),
        ("think", np.int32), ("reply", np.int32), ("window", np.int32), ("sample", np.int32))}
    # Per row and turn, for the windows: where its reply starts in the conversation, the
    # observation and budget it was shown, and its reply's text.
    starts = np.zeros((b, turns), np.int64)
    shown = np.full((b, turns), None, object)
    budgets = np.zeros((b, turns), np.int32)
    texts = np.full((b, turns), None, object)
    failed = np.array([o is None for o in observations])
    active = ~failed
    taken = np.zeros(b, np.int32)
    effective = np.zeros(b, np.int32)
    success = np.zeros(b, bool)
    current = [o or "" for o in observations]
    start_texts = np.full((b, turns), None, object)  # GiGPO's anchors (`_anchor_ids`)

    def windows(k: int) -> tuple[np.ndarray, np.ndarray]:
        """Turn k's window of each active row (a limited mode's context; see `rollout`)."""
        nonlocal truncated
        h = max(0, k - config.window_turns + 1)
        rows = [[] for _ in range(b)]
        for row in np.flatnonzero(active):
            starts[row, k], shown[row, k], budgets[row, k] = filled[row], current[row], \
                budget - taken[row]
            if config.context_window_mode == "single_turn":
                history = [(shown[row, j], texts[row, j], float(per_turn["reward"][row, j]))
                           for j in range(h, k)]
                ids, cut = text.single_ids(k + 1, current[row], budget - taken[row], history,
                                           text.window_width)
            else:
                ids, cut = text.first_ids(shown[row, h], int(budgets[row, h]), h + 1)
                ids = ids + tokens[row, starts[row, h]: filled[row]].tolist()
            truncated += cut
            rows[row] = ids
        return _padded(rows, text.window_width)

    def supplied(turn: int):  # a demonstration's replies for the rows still going
        texts = [c if a else None for c, a in zip(current, active)]
        return supplied_replies(replies, texts, turn, jax.random.fold_in(sample_key, turn),
                         config.reply_tokens, pad_id)

    if windowed:
        window_ids, window_n = windows(0)
    if replies is not None:
        gen = supplied(0)
    elif windowed:
        gen = _first_turn(graphdef, params, jnp.asarray(window_ids), jnp.asarray(window_n),
                          prefix_arr, jax.random.fold_in(sample_key, 0), token_bytes,
                          options=options, group_size=1, length=width,
                          cache_dtype=config.cache_dtype)
    else:
        gen = _first_turn(graphdef, params, jnp.asarray(first_ids), jnp.asarray(first_n),
                          prefix_arr, jax.random.fold_in(sample_key, 0), token_bytes,
                          options=options, group_size=n, length=length,
                          cache_dtype=config.cache_dtype)
    for k in range(turns):
        g_tokens, g_len, g_logp, g_ent = jax.device_get(
            (gen.tokens, gen.lengths, gen.logprobs, gen.entropy))
        actions: dict[int, list[str]] = {}
        for row in np.flatnonzero(active):
            at, m = filled[row] + f, int(g_len[row])
            tokens[row, filled[row]: at] = prefix
            tokens[row, at: at + m] = g_tokens[row, :m]
            out_at = at
            if windowed:  # the turn's sample: window, forced prefix, reply
                w, out_at = int(window_n[row]), k * width + int(window_n[row]) + f
                samples[row, k * width: out_at] = np.concatenate([window_ids[row, :w], prefix])
                samples[row, out_at: out_at + m] = g_tokens[row, :m]
                per_turn["window"][row, k], per_turn["sample"][row, k] = w, w + f + m
                texts[row, k] = text.tokenizer.decode(prefix + g_tokens[row, :m].tolist(),
                                                      skip_special_tokens=True)
            mask[row, out_at: out_at + m] = True
            tids[row, out_at: out_at + m] = k
            blogp[row, out_at: out_at + m] = g_logp[row, :m]
            bent[row, out_at: out_at + m] = g_ent[row, :m]
            filled[row] = at + m
            acts, ok, think = text.parse(prefix + g_tokens[row, :m].tolist())
            actions[int(row)] = acts
            per_turn["taken"][row, k], per_turn["format_ok"][row, k] = True, ok
            start_texts[row, k] = current[row]
            per_turn["think"][row, k], per_turn["reply"][row, k] = think, m
            per_turn["penalty"][row, k] = 0.0 if ok else config.format_penalty

        ended = np.zeros(b, bool)
        steps = np.zeros(b, np.int32)
        reward = np.zeros(b, np.float32)
        start = time.perf_counter()
        for i in range(config.max_actions_per_turn):
            due = {row: acts[i] for row, acts in actions.items()
                   if i < len(acts) and not ended[row] and not failed[row]
                   and taken[row] + steps[row] < budget}
            if not due:
                break
            for row, result in pool.step(due).items():
                if result is None:
                    failed[row] = True
                    continue
                obs, r, done, info = result
                reward[row] = np.float32(reward[row] + np.float32(r))  # float32, as in jit
                ended[row] |= done
                steps[row] += 1
                effective[row] += bool(info.get("action_is_effective", True))
                success[row] = bool(info["success"])
                current[row] = obs
        env_seconds += time.perf_counter() - start
        taken += steps
        per_turn["reward"][:, k] = np.where(active, reward, 0.0)
        going = active & ~ended & (taken < budget) & ~failed
        active = going
        if not going.any() or k + 1 == turns:
            break

        messages = [[] for _ in range(b)]
        for row in np.flatnonzero(going):
            ids, cut = text.later_ids(k + 2, float(reward[row]), current[row], budget - taken[row])
            truncated += cut
            m = int(g_len[row])
            if m and g_tokens[row, m - 1] == eos_id and ids[0] == eos_id:
                ids = ids[1:]  # the reply's EOS already is the template's end of turn
            messages[row] = ids
            tokens[row, filled[row]: filled[row] + len(ids)] = ids
            filled[row] += len(ids)
        turn_key = jax.random.fold_in(sample_key, k + 1)
        if windowed:
            window_ids, window_n = windows(k + 1)
            gen = supplied(k + 1) if replies is not None else _first_turn(
                graphdef, params, jnp.asarray(window_ids), jnp.asarray(window_n), prefix_arr,
                turn_key, token_bytes, options=options, group_size=1, length=width,
                cache_dtype=config.cache_dtype)
            continue
        ids, counts = _padded(messages, text.later_width)
        gen = supplied(k + 1) if replies is not None else _later_turn(
            graphdef, params, gen.cache, jnp.asarray(ids), jnp.asarray(counts), prefix_arr,
            turn_key, token_bytes, options=options)

    pool.end_episodes()  # envs holding a server session release it (envs_host.pool)
    for failure in pool.failures:
        log.warning("%s", failure)
    if truncated:
        log.warning("env %r: %d observations cut to fit their message width (observation_tokens"
                    " = the room per observation)", pool.name, truncated)
    per_turn["reward"][failed] = 0.0
    success &= ~failed
    rows = dict(tokens=tokens, lengths=filled.astype(np.int32))
    if windowed:
        rows = dict(tokens=samples, lengths=per_turn["sample"].sum(-1),
                    turn_lengths=per_turn["sample"], window_lengths=per_turn["window"])
    out = Rollout(**rows, prompt_lengths=np.repeat(first_n, n).astype(np.int32), loss_mask=mask,
                  turn_ids=tids,
                  behaviour_logp=blogp, behaviour_entropy=bent,
                  turn_rewards=per_turn["reward"], format_penalties=per_turn["penalty"],
                  turn_taken=per_turn["taken"], format_ok=per_turn["format_ok"],
                  think_tokens=per_turn["think"], reply_lengths=per_turn["reply"],
                  success=success, num_actions=taken, effective_actions=effective,
                  turn_anchors=_anchor_ids(start_texts, n))
    stats = {"host/failed_rows": float(failed.sum()),
             "host/truncated_observations": float(truncated),
             "timing/host_env_seconds": env_seconds}
    return jax.tree.map(jnp.asarray, out), stats
