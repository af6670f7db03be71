"""RAGEN-2's template-collapse metrics: the cached cross-scoring equals a full uncached forward of
every [prompt ; reply] pair, the metrics equal a plain numpy reading of those scores, the train
step computes them only every `collapse.every` steps, and an untrained SmolLM2 tells distinct
Sokoban levels apart from its replies alone."""

from __future__ import annotations

import functools
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

import envs_jax  # noqa: E402
from starpo_jax import api  # noqa: E402
from starpo_jax.train.collapse import (FirstTurn, collapse_metrics, cross_logprobs,  # noqa: E402
                                       first_turn)
from starpo_jax.config import CollapseConfig, RolloutConfig, TrainConfig  # noqa: E402
from starpo_jax.models import load_pretrained  # noqa: E402
from starpo_jax.rollout.jax_env import rollout  # noqa: E402
from starpo_jax.text import build_codec  # noqa: E402
from helpers import forward  # noqa: E402
from helpers.tiny import tiny_config  # noqa: E402
from test_rollout import tiny_bandit_setup  # noqa: E402

TEMPERATURE = 0.7
P, N, W, R = 4, 2, 7, 5
PROMPT_LENGTHS = [5, 7, 3, 5]  # prompt 3 repeats prompt 0 (with other padding)
REPLY_LENGTHS = [5, 2, 0, 3, 5, 1, 0, 4]  # empty replies, full-width replies


@functools.cache
def synthetic_turn() -> FirstTurn:
    """P prompts (two token-identical) and B = P * N replies, random garbage after each length."""
    rng = np.random.default_rng(3)
    prompts = rng.integers(0, 49152, (P, W)).astype(np.int32)
    prompts[3, :5] = prompts[0, :5]
    replies = rng.integers(0, 49152, (P * N, R)).astype(np.int32)
    return FirstTurn(prompts=jnp.asarray(prompts), prompt_lengths=jnp.array(PROMPT_LENGTHS),
                     replies=jnp.asarray(replies), reply_lengths=jnp.array(REPLY_LENGTHS))


def host_scores(model, turn: FirstTurn) -> np.ndarray:
    """l[i, j] from one uncached forward of each [x_j ; r_i] (right-padded), numpy reductions."""
    t = jax.tree.map(np.asarray, turn)
    rows, spans = [], []
    for i in range(P * N):
        for j in range(P):
            x, r = t.prompts[j, :t.prompt_lengths[j]], t.replies[i, :t.reply_lengths[i]]
            rows.append(np.concatenate([x, r]))
            spans.append((len(x), len(r)))
    ids = np.zeros((len(rows), W + R), np.int32)
    for k, row in enumerate(rows):
        ids[k, :len(row)] = row
    mask = np.arange(W + R) < np.array([len(r) for r in rows])[:, None]
    logits = np.asarray(forward.logits(model, jnp.asarray(ids), jnp.asarray(mask)), np.float64)
    z = logits / TEMPERATURE
    logp = z - (z.max(-1, keepdims=True)
                + np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)))
    scores = np.zeros(len(rows))
    for k, (start, count) in enumerate(spans):
        positions = np.arange(start, start + count)
        scores[k] = logp[k, positions - 1, ids[k, positions]].sum()
    return scores.reshape(P * N, P)


def numpy_metrics(scores: np.ndarray, lengths: np.ndarray, prompts: list[tuple]) -> dict:
    """The original's reading (collapse_metrics.py), on the rows with a non-empty reply."""
    own = np.arange(P * N) // N
    valid = lengths > 0
    lbar = scores / np.maximum(lengths, 1)[:, None]
    same = np.array([[a == b for b in prompts] for a in prompts])

    def mi(s):
        top = s.max(1)
        marginal = top + np.log(np.exp(s - top[:, None]).sum(1)) - np.log(P)
        return np.mean((s[np.arange(P * N), own] - marginal)[valid])

    best = lbar.argmax(1)
    return {"collapse/mi_estimate": mi(lbar), "collapse/mi_seq_estimate": mi(scores),
            "collapse/retrieval_acc": np.mean(same[best, own][valid]),
            "collapse/retrieval_chance": np.mean(same[own].sum(1)[valid] / P),
            "collapse/reply_entropy": -np.mean(lbar[np.arange(P * N), own][valid]),
            "collapse/valid_rate": valid.mean()}


@functools.cache
def compiled_metrics():
    """(tiny model, cross_logprobs, collapse_metrics) jitted with uneven pair and logit chunks."""
    model, _ = load_pretrained("tiny-random")
    graphdef, params = nnx.split(model)
    options = dict(temperature=TEMPERATURE, micro_rows=5, logit_chunk=3)  # 32 pairs, R = 5
    scores = jax.jit(lambda p, t: cross_logprobs(graphdef, p, t, **options))
    metrics = jax.jit(lambda p, t: collapse_metrics(graphdef, p, t, **options))
    return model, params, scores, metrics


def test_cached_cross_scores_equal_full_forward():
    model, params, scores, _ = compiled_metrics()
    expected = host_scores(model, synthetic_turn())
    got = np.asarray(scores(params, synthetic_turn()))
    assert np.all(got[np.array(REPLY_LENGTHS) == 0] == 0)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    assert np.ptp(expected[np.array(REPLY_LENGTHS) > 0], axis=1).min() > 1e-3, "prompts matter"


def test_metrics_equal_numpy_reading_of_the_scores():
    model, params, _, metrics = compiled_metrics()
    turn = synthetic_turn()
    prompts = [tuple(np.asarray(turn.prompts[j, :n])) for j, n in enumerate(PROMPT_LENGTHS)]
    expected = numpy_metrics(host_scores(model, turn), np.array(REPLY_LENGTHS), prompts)
    got = jax.device_get(metrics(params, turn))
    assert set(got) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5, err_msg=name)
    assert expected["collapse/retrieval_chance"] == pytest.approx((3 * 0.5 + 3 * 0.25) / 6)


def test_first_turn_is_the_first_prompt_prefix_and_reply_of_each_row():
    model, tok, env, codec = tiny_bandit_setup()
    config = RolloutConfig(groups=2, group_size=2, max_turns=2, reply_tokens=4, mode="nothink")
    graphdef, params = nnx.split(model)
    out = jax.jit(lambda p, k: rollout(graphdef, p, env, codec, config, k, eos_id=tok.eos_token_id,
                                       pad_id=tok.pad_token_id))(params, jax.random.PRNGKey(1))
    turn, o = jax.device_get((first_turn(out, codec, config), out))
    states, _ = jax.vmap(env.reset)(jax.random.split(jax.random.split(jax.random.PRNGKey(1))[0], 2))
    ids, n = jax.device_get(codec.first_prompt(jax.vmap(env.render_symbols)(states),
                                               jnp.full((2,), config.max_actions_per_traj)))
    prefix = list(codec.forced_prefix_ids)
    for g in range(2):
        got = turn.prompts[g, :turn.prompt_lengths[g]].tolist()
        assert got == ids[g, :n[g]].tolist() + prefix
    for b in range(4):
        reply = o.tokens[b][o.loss_mask[b] & (o.turn_ids[b] == 0)].tolist()
        assert turn.replies[b, :turn.reply_lengths[b]].tolist() == reply and reply


@pytest.mark.slow  # the slow tier (README)
def test_train_step_computes_them_every_n_steps_only():
    """Logged on steps 0 and 2 of every=2, absent on step 1; step 0's values are those of its
    rollout under the weights that sampled it."""
    config = tiny_config().to_dict()
    config.update(collapse={"every": 2, "micro_rows": 3}, progress_after=0)
    exp = api.build(config)
    initial = exp.fresh_state().actor  # exp.state is donated to the step
    logged = [exp.step() for _ in range(3)]
    names = {"collapse/mi_estimate", "collapse/mi_seq_estimate", "collapse/retrieval_acc",
             "collapse/retrieval_chance", "collapse/reply_entropy", "collapse/valid_rate"}
    assert names <= set(logged[0]) and names <= set(logged[2])
    assert not any(k.startswith("collapse/") for k in logged[1])
    assert "collapse/computed" not in logged[0]

    graphdef, tok, train = nnx.graphdef(exp.model), exp.tokenizer, exp.train
    rollout_key = jax.random.split(jax.random.fold_in(exp.key, 0))[0]  # train/step.py's step 0

    @jax.jit
    def direct(params):
        out = rollout(graphdef, params, exp.env, exp.codec, train.rollout, rollout_key,
                      eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
        return collapse_metrics(graphdef, params, first_turn(out, exp.codec, train.rollout),
                                temperature=train.rollout.temperature, micro_rows=3,
                                logit_chunk=train.optim.logit_chunk)

    for name, value in jax.device_get(direct(initial)).items():
        assert logged[0][name] == pytest.approx(float(value), rel=1e-5, abs=1e-5), name


def test_collapse_needs_two_groups():
    with pytest.raises(ValueError, match=r"collapse.every = 1 is invalid; valid: 0 \(off\)"):
        TrainConfig(rollout=RolloutConfig(groups=1, group_size=4), collapse=CollapseConfig(every=1))
    with pytest.raises(ValueError, match=r"collapse.micro_rows = 0 is invalid"):
        CollapseConfig(micro_rows=0)


@pytest.mark.slow  # minutes on a 2-core CPU: the slow tier (README)
@pytest.mark.optimized  # its time is running, not compiling (conftest)
def test_untrained_smollm2_retrieves_distinct_sokoban_levels():
    """Sampled replies (4 levels x 4, 32-token nothink, temperature 1) are attributed to their
    level above chance; replies that copy their level's grid are attributed to it every time."""
    model, tok = load_pretrained("smollm2-135m-instruct")
    env = envs_jax.make("sokoban")
    config = RolloutConfig(groups=4, group_size=4, max_turns=1, reply_tokens=32, mode="nothink")
    codec = build_codec(tok, env, mode="nothink", max_tokens=config.reply_tokens, verify=5)
    graphdef, params = nnx.split(model)
    score = functools.partial(collapse_metrics, graphdef, temperature=config.temperature,
                              micro_rows=16, logit_chunk=32)

    @jax.jit
    def run(params, key):
        out = rollout(graphdef, params, env, codec, config, key, eos_id=tok.eos_token_id,
                      pad_id=tok.pad_token_id)
        turn = first_turn(out, codec, config)
        # The rollout's levels (its reset key), their grids as the replies.
        states, _ = jax.vmap(env.reset)(jax.random.split(jax.random.split(key)[0], 4))
        grids, n = codec.render_observation(jax.vmap(env.render_symbols)(states))
        copied = turn.replace(replies=jnp.repeat(grids, 4, axis=0), reply_lengths=jnp.repeat(n, 4))
        return score(params, turn), score(params, copied), turn

    sampled, copied, turn = jax.device_get(run(params, jax.random.PRNGKey(0)))
    print("sampled", {k: float(v) for k, v in sampled.items()})
    print("copied", {k: float(v) for k, v in copied.items()})
    levels = {tuple(turn.prompts[g, :turn.prompt_lengths[g]]) for g in range(4)}
    assert len(levels) == 4 and sampled["collapse/retrieval_chance"] == 0.25
    assert sampled["collapse/valid_rate"] == 1.0
    # Seeds 0, 1, 2 measured 0.5, 0.625, 0.5 (chance 0.25): the untrained model's replies
    # barely read the grid, so the margin is modest and noisy at 16 rows.
    assert sampled["collapse/retrieval_acc"] >= 0.375
    assert sampled["collapse/mi_seq_estimate"] > 0
    assert copied["collapse/retrieval_acc"] == 1.0
    assert copied["collapse/mi_seq_estimate"] > 0.9 * np.log(4)
