"""The uncertainty filter keeps exactly the groups RAGEN-2's rules keep, in static shapes under
jit, and the train step learns from those groups only."""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from starpo_jax.config import (AdvantageConfig, FilterConfig, LossConfig,  # noqa: E402
                               OptimConfig, RolloutConfig, TrainConfig)
from starpo_jax.algo.filtering import (FILTER_METRICS, gather_group_rows,  # noqa: E402
                                       gather_groups, group_std, kept_bound, kept_share,
                                       num_kept_groups, select_groups)

# Five groups of four; unbiased stds (in order): 0.5, 0, 1, 0.5, 0.
SCORES = np.array(
    [
        [0.0, 1.0, 1.0, 1.0],
        [2.0, 2.0, 2.0, 2.0],
        [0.0, 2.0, 2.0, 2.0],
        [1.0, 0.0, 0.0, 0.0],
        [5.0, 5.0, 5.0, 5.0],
    ],
    np.float32,
)


def reference(stds: list[float], config: FilterConfig) -> list[int]:
    """The kept groups, ascending: RAGEN-2's `_select_top_groups` rules in plain Python (ties:
    the lower group index ranks first; max_groups keeps the highest-ranked ones). Thresholds
    are float32 (f32), as the original's torch tensors; its linear running sum is a Python
    float, compared in float32."""
    f32 = np.float32
    p = len(stds)
    largest = config.mode == "std"
    groups = [g for g in range(p) if config.include_zero or abs(stds[g]) > 1e-10]
    groups.sort(key=lambda g: (-stds[g] if largest else stds[g], g))
    s = [stds[g] for g in groups]
    if not groups:
        kept = []
    elif config.strategy in ("top_k", "top_k_abs"):
        k = int(config.keep_ratio * p) if config.strategy == "top_k" else config.keep_groups
        kept = groups[:max(1, min(k, len(groups)))]
    elif config.strategy == "min_p":
        if largest:
            keep = [x >= f32(max(s)) * f32(config.min_p) - f32(1e-10) for x in s]
        else:
            keep = [x <= f32(min(s)) / f32(config.min_p + 1e-10) + f32(1e-10) for x in s]
        kept = [g for g, k in zip(groups, keep) if k]
    elif config.top_p >= 1.0:
        kept = groups
    elif config.top_p_weights == "softmax":
        logits = np.array(s if largest else [-x for x in s], np.float64)
        probs = np.exp(logits - logits.max())
        cumulative = np.cumsum(probs / probs.sum())
        k = next((i for i, c in enumerate(cumulative) if c >= config.top_p), len(s) - 1) + 1
        kept = groups[:k]
    else:
        threshold = f32(config.top_p) * np.sum(s, dtype=f32) - f32(config.top_p_eps)
        total, count = 0.0, 0
        for x in s:
            if f32(total) >= threshold or x <= 0:
                break
            total, count = total + x, count + 1
        kept = groups[:count] if f32(total) >= threshold else []
    if config.max_groups is not None:
        kept = kept[:config.max_groups]
    return sorted(kept)


def random_scores(rng: np.random.Generator, kind: str, shape=(8, 4)) -> np.ndarray:
    """"normal": distinct stds; "coins": rewards in {0, 1, 3}, so tied and zero stds abound;
    "flat": every group's rewards equal (all stds 0)."""
    if kind == "normal":
        return rng.normal(size=shape).astype(np.float32) * rng.uniform(0.1, 3.0, (shape[0], 1))
    if kind == "coins":
        return rng.choice(np.array([0.0, 1.0, 3.0], np.float32), size=shape, p=[0.5, 0.3, 0.2])
    return np.repeat(rng.normal(size=(shape[0], 1)), shape[1], axis=1).astype(np.float32)


RULES = [
    dict(strategy="top_k", keep_ratio=0.25), dict(strategy="top_k", keep_ratio=0.6),
    dict(strategy="top_k", keep_ratio=1.0), dict(strategy="top_k_abs", keep_groups=1),
    dict(strategy="top_k_abs", keep_groups=3), dict(strategy="top_k_abs", keep_groups=8),
    dict(strategy="top_p", top_p=0.3), dict(strategy="top_p", top_p=0.9),
    dict(strategy="top_p", top_p=0.9, top_p_eps=0.0), dict(strategy="top_p", top_p=1.0),
    dict(strategy="top_p", top_p=0.5, top_p_weights="softmax"),
    dict(strategy="top_p", top_p=0.9, top_p_weights="softmax"),
    dict(strategy="min_p", min_p=0.3), dict(strategy="min_p", min_p=0.8),
    dict(strategy="min_p", min_p=1.0),
    dict(strategy="top_p", top_p=0.9, max_groups=2),
    dict(strategy="min_p", min_p=0.2, max_groups=3),
]
# Each rule under two of the four (include_zero, mode) pairs, every pair for every strategy.
PAIRS = [[(True, "std"), (False, "std_rev")], [(False, "std"), (True, "std_rev")]]
CONFIGS = [FilterConfig(**rule, include_zero=zero, mode=mode)
           for i, rule in enumerate(RULES) for zero, mode in PAIRS[i % 2]]


@pytest.fixture(scope="module")
def selections():
    """Every config of CONFIGS on 52 random [8, 4] score sets, in ONE compiled program (jit,
    vmap over the sets): (scores, [GroupSelection with leaves [52, ...]] per config)."""
    rng = np.random.default_rng(0)
    scores = np.stack([random_scores(rng, kind) for kind in ["normal"] * 20 + ["coins"] * 30 +
                       ["flat"] * 2])
    run = jax.jit(lambda s: [jax.vmap(lambda x: select_groups(x, c))(s) for c in CONFIGS])
    return scores, jax.device_get(run(scores))


@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=lambda i: _config_id(CONFIGS[i]))
def test_select_groups_matches_the_reference(selections, index):
    config = CONFIGS[index]
    scores, results = selections
    got = results[index]
    bound = kept_bound(8, config)
    assert got.indices.shape == got.kept.shape == (len(scores), bound)
    assert got.indices.dtype == np.int32 and got.kept.dtype == bool
    for i, s in enumerate(scores):
        assert np.all(np.diff(got.indices[i]) > 0), "indices ascending, no repeats"
        want = reference(got.group_std[i].tolist(), config)
        assert got.indices[i][got.kept[i]].tolist() == want, (i, got.group_std[i])
    np.testing.assert_allclose(got.group_std, np.std(scores, axis=2, ddof=1), rtol=1e-5,
                               atol=1e-6)


def _config_id(config: FilterConfig) -> str:
    fields = ("strategy", "keep_ratio", "keep_groups", "top_p", "top_p_weights", "top_p_eps",
              "min_p", "include_zero", "mode", "max_groups")
    default = FilterConfig()
    changed = [f"{getattr(config, f)}" for f in fields
               if f in ("strategy", "include_zero", "mode") or
               getattr(config, f) != getattr(default, f)]
    return "-".join(changed)


@pytest.mark.parametrize(
    "rule,want",
    [
        # top_k / top_k_abs: a count of the ranking (stds 0.5, 0, 1, 0.5, 0); ties: lower index.
        (dict(keep_ratio=0.2), [2]),
        (dict(keep_ratio=0.4), [0, 2]),
        (dict(keep_ratio=0.4, mode="std_rev"), [1, 4]),
        (dict(keep_ratio=0.6, mode="std_rev"), [0, 1, 4]),
        (dict(keep_ratio=0.1), [2]),  # int(0.5) = 0 -> at least one group
        (dict(keep_ratio=1.0, include_zero=False), [0, 2, 3]),
        (dict(strategy="top_k_abs", keep_groups=2, mode="std_rev", include_zero=False), [0, 3]),
        # top_p linear: total 2, threshold 0.5 * 2 - 0.01 = 0.99: 1 reaches it.
        (dict(strategy="top_p", top_p=0.5), [2]),
        # threshold 0.9 * 2 - 0.01 = 1.79: 1 + 0.5 + 0.5.
        (dict(strategy="top_p", top_p=0.9), [0, 2, 3]),
        # std_rev ranks the zeros first and stops there: threshold never reached, none kept.
        (dict(strategy="top_p", top_p=0.5, mode="std_rev"), []),
        (dict(strategy="top_p", top_p=0.5, mode="std_rev", include_zero=False), [0, 3]),
        (dict(strategy="top_p", top_p=1.0, include_zero=False), [0, 2, 3]),
        # softmax(1, .5, .5, 0, 0) sorted: .339 .206 .206 .125 .125 -> cumulative .75 at 3.
        (dict(strategy="top_p", top_p=0.7, top_p_weights="softmax"), [0, 2, 3]),
        (dict(strategy="top_p", top_p=0.76, top_p_weights="softmax"), [0, 1, 2, 3]),
        # min_p: std >= 0.5 * 1; std_rev: std <= 0.5 / 0.5 among the non-zero.
        (dict(strategy="min_p", min_p=0.5), [0, 2, 3]),
        (dict(strategy="min_p", min_p=0.6), [2]),
        (dict(strategy="min_p", min_p=0.5, mode="std_rev", include_zero=False), [0, 2, 3]),
        (dict(strategy="min_p", min_p=0.5, mode="std_rev"), [1, 4]),
        (dict(strategy="min_p", min_p=0.5, max_groups=2), [0, 2]),
    ],
)
def test_select_groups_worked_examples(rule, want):
    got = select_groups(SCORES, FilterConfig(**rule))
    assert got.indices[got.kept].tolist() == want
    np.testing.assert_allclose(got.group_std, np.std(SCORES, axis=1, ddof=1), rtol=1e-6)


def metric_reference(scores, values, metric):
    """The original's group scores (rollout_filter.py) in numpy: [P, N] -> [P]."""
    x = np.asarray(values if metric in ("entropy", "entropy_variance", "length") else scores,
                   np.float64)
    if metric.endswith("variance"):
        return np.std(x, axis=1, ddof=1)
    return x.sum(axis=1) if metric == "reward_sum" else x.mean(axis=1)


METRIC_RULES = [dict(keep_ratio=0.25), dict(strategy="top_p", top_p=0.6),
                dict(strategy="min_p", min_p=0.5, mode="std_rev", include_zero=False),
                dict(strategy="top_p", top_p=0.9, top_p_weights="softmax")]


@pytest.mark.parametrize("metric", FILTER_METRICS)
def test_filter_metrics_rank_groups_by_the_originals_scores(metric):
    rng = np.random.default_rng(7)
    for kind in ("normal", "coins"):
        scores = random_scores(rng, kind) + 0.5  # positive: mean and sum rank as scores
        values = rng.uniform(0.5, 4.0, (8, 4)).astype(np.float32)
        values[2] = 1.5  # a group of equal values: entropy_variance 0, exactly
        want_score = metric_reference(scores, values, metric)
        for rule in METRIC_RULES:
            config = FilterConfig(metric=metric, **rule)
            got = select_groups(scores, config, values)
            np.testing.assert_allclose(got.group_score, want_score, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got.group_std, np.std(scores, axis=1, ddof=1), rtol=1e-5,
                                       atol=1e-6)  # the reward std stays logged as it was
            # The reference ranks the computed scores: float ties resolve as the code's.
            assert (got.indices[got.kept].tolist()
                    == reference(np.asarray(got.group_score).tolist(), config)), (kind, rule)
    if metric == "entropy_variance":
        assert got.group_score[2] == 0.0


def test_value_metrics_need_the_per_trajectory_values():
    with pytest.raises(ValueError, match="filter metric 'length' needs per-trajectory values"):
        select_groups(SCORES, FilterConfig(metric="length"))


@pytest.mark.parametrize("scaling,factor", [("none", lambda r: 1.0), ("linear", lambda r: r),
                                            ("sqrt", np.sqrt)])
def test_loss_scaling_is_the_share_of_groups_kept(scaling, factor):
    # top_p 0.6 of stds (0.5, 0, 1, 0.5, 0): groups 2 and 0 (1.5 of 2.0 >= 1.2 - 0.01): 2 of 5.
    config = FilterConfig(strategy="top_p", top_p=0.6, loss_scaling=scaling)
    selection = select_groups(SCORES, config)
    assert int(selection.kept.sum()) == 2
    np.testing.assert_allclose(kept_share(selection, config), factor(2 / 5), rtol=1e-6)


def test_top_k_keeps_todays_fixed_count():
    """The default strategy returns K = max(1, int(keep_ratio * P)) groups, all kept, as
    before the other strategies existed."""
    for keep_ratio, want in [(0.2, [2]), (0.4, [0, 2]), (0.6, [0, 2, 3]), (1.0, [0, 1, 2, 3, 4])]:
        got = jax.jit(select_groups, static_argnums=1)(SCORES, FilterConfig(keep_ratio=keep_ratio))
        assert got.indices.tolist() == want and got.kept.all()


@pytest.mark.parametrize(
    "num_groups,keep_ratio,want",
    [(8, 0.25, 2), (8, 0.3, 2), (8, 0.1, 1), (8, 1.0, 8), (1, 0.25, 1), (100, 0.29, 28),
     (5, 0.6, 3)],
)
def test_num_kept_groups_follows_ragen_rounding(num_groups, keep_ratio, want):
    assert num_kept_groups(num_groups, keep_ratio) == want


@pytest.mark.parametrize(
    "rule,want",
    [
        (dict(keep_ratio=0.25), 2), (dict(strategy="top_k_abs", keep_groups=3), 3),
        (dict(strategy="top_p"), 8), (dict(strategy="min_p"), 8),
        (dict(strategy="top_p", max_groups=5), 5), (dict(strategy="top_p", max_groups=20), 8),
        (dict(keep_ratio=0.5, max_groups=3), 3),
    ],
)
def test_the_static_bound_sizes_the_batch(rule, want):
    config = TrainConfig(rollout=RolloutConfig(groups=8, group_size=2), filter=FilterConfig(**rule))
    assert kept_bound(8, config.filter) == config.kept_groups == want


def test_equal_scores_have_exactly_zero_std():
    # 0.1 is not a binary fraction: a float32 mean of sixteen 0.1s is not 0.1.
    scores = np.array([[0.1] * 16, [0.7] * 16, [0.1] * 15 + [0.2]], np.float32)
    np.testing.assert_array_equal(group_std(scores)[:2], [0.0, 0.0])
    assert group_std(scores)[2] > 0
    np.testing.assert_array_equal(group_std(np.array([[1.0], [3.0]])), [0.0, 0.0])
    got = select_groups(scores, FilterConfig(strategy="top_p", top_p=1.0, include_zero=False))
    assert got.indices[got.kept].tolist() == [2]


@pytest.mark.parametrize(
    "rule,match",
    [
        (dict(strategy="top_q"), r"filter.strategy = 'top_q' is invalid; valid: one of \('top_k'"),
        (dict(keep_ratio=0.0), r"filter.keep_ratio = 0.0 is invalid; valid: a number in \(0.0"),
        (dict(keep_groups=0), "filter.keep_groups = 0 is invalid; valid: an int >= 1"),
        (dict(top_p=1.5), r"filter.top_p = 1.5 is invalid; valid: a number in \(0.0, 1.0\]"),
        (dict(top_p_weights="exp"), "filter.top_p_weights = 'exp' is invalid; valid: one of "
                                    r"\('linear', 'softmax'\)"),
        (dict(top_p_eps=-0.1), r"filter.top_p_eps = -0.1 is invalid; valid: a number in \[0.0"),
        (dict(min_p=0.0), r"filter.min_p = 0.0 is invalid; valid: a number in \(0.0, 1.0\]"),
        (dict(include_zero=1), "filter.include_zero = 1 is invalid; valid: True or False"),
        (dict(mode="var"), r"filter.mode = 'var' is invalid; valid: one of \('std', 'std_rev'\)"),
        (dict(max_groups=0), "filter.max_groups = 0 is invalid; valid: an int >= 1"),
        (dict(metric="std"), r"filter.metric = 'std' is invalid; valid: one of "
                             r"\('reward_variance', 'reward'"),
        (dict(loss_scaling="log"), r"filter.loss_scaling = 'log' is invalid; valid: one of "
                                   r"\('none', 'linear', 'sqrt'\)"),
    ],
)
def test_filter_config_rejects_bad_values(rule, match):
    with pytest.raises(ValueError, match=match):
        FilterConfig(**rule)


def test_train_config_checks_keep_groups_and_vanilla_turns_any_filter_off():
    rollout = RolloutConfig(groups=4, group_size=2)
    with pytest.raises(ValueError, match=r"filter.keep_groups = 5 is invalid; valid: an int in "
                                         r"\[1, rollout.groups = 4\]"):
        TrainConfig(rollout=rollout, filter=FilterConfig(strategy="top_k_abs", keep_groups=5))
    top_p = TrainConfig(rollout=rollout, filter=FilterConfig(strategy="top_p", top_p=0.5,
                                                             include_zero=False))
    assert top_p.vanilla().filter == FilterConfig(keep_ratio=1.0)


def test_select_groups_rejects_scores_not_p_by_n():
    with pytest.raises(ValueError, match=r"\[P, N\]"):
        select_groups(np.zeros(4), FilterConfig())


def test_gather_groups_and_rows():
    num_groups, group_size = 5, 4
    tree = {
        "tokens": np.arange(num_groups * group_size * 3).reshape(num_groups, group_size, 3),
        "scores": SCORES,
    }
    kept = jnp.array([0, 2], jnp.int32)
    got = jax.jit(gather_groups)(tree, kept)
    np.testing.assert_array_equal(got["tokens"], tree["tokens"][[0, 2]])
    np.testing.assert_array_equal(got["scores"], SCORES[[0, 2]])

    flat = {k: v.reshape(num_groups * group_size, *v.shape[2:]) for k, v in tree.items()}
    got_rows = jax.jit(gather_group_rows, static_argnums=2)(flat, kept, group_size)
    np.testing.assert_array_equal(got_rows["tokens"], got["tokens"].reshape(8, 3))
    np.testing.assert_array_equal(got_rows["scores"], np.concatenate([SCORES[0], SCORES[2]]))
    with pytest.raises(ValueError, match="not a multiple of group_size 3"):
        gather_group_rows(flat, kept, 3)


# The train step with a variable-count filter. Its rollout is the real one with two things put
# in from the host at run time (io_callback, so one compiled step serves several cases): the
# rows' rewards, and whether to scramble the tokens and loss masks of rows 2-5 (groups 1, 2).
# Rewards [0, 2 | 1, 1 | 0, .2 | 0, 4]: stds 1.41, 0, .141, 2.83; top_p 0.9 without zero-std
# groups needs 2.83 + 1.41 >= 0.9 * 4.38 - 0.01, so groups 0 and 3 are kept, 1 and 2 not.
SPLIT_REWARDS = np.array([0.0, 2.0, 1.0, 1.0, 0.0, 0.2, 0.0, 4.0], np.float32)
UNKEPT_ROWS = np.array([False, False, True, True, True, True, False, False])


def _host_rollout(host: dict):
    from jax.experimental import io_callback

    from starpo_jax.train import step as train_lib

    real = train_lib.chunked_rollout

    def rollout(*args, **kwargs):
        out = real(*args, **kwargs)
        rewards, scramble = io_callback(
            lambda: (host["rewards"], np.bool_(host["scramble"])),
            (jax.ShapeDtypeStruct((8,), jnp.float32), jax.ShapeDtypeStruct((), jnp.bool_)))
        rows = jnp.asarray(UNKEPT_ROWS)[:, None] & scramble
        k1, k2 = jax.random.split(jax.random.PRNGKey(11))
        noise = jax.random.randint(k1, out.tokens.shape, 0, 400, jnp.int32)
        flips = jax.random.bernoulli(k2, 0.5, out.loss_mask.shape)
        return out.replace(
            turn_rewards=out.turn_rewards.at[:, 0].set(rewards).at[:, 1:].set(0.0),
            tokens=jnp.where(rows, noise, out.tokens),
            loss_mask=jnp.where(rows, flips & (jnp.arange(out.tokens.shape[1]) > 0),
                                out.loss_mask))

    return rollout


@pytest.fixture(scope="module")
def masked_steps():
    """{case: (state before, state after, metrics)} for a GRPO step filtered by top_p (8 static
    rows in 2 mini-batches of 2 micro-batches): "split" (groups 0 and 3 kept), "scrambled"
    (the same, rows of groups 1 and 2 scrambled), "none" (equal rewards: nothing kept); and
    "top_k_abs": keep_groups=2 (the same two groups, 4 rows in one mini-batch)."""
    from starpo_jax.train import step as train_lib
    from test_rollout import REPLY_TOKENS, tiny_bandit_setup

    model, tok, env, codec = tiny_bandit_setup()
    masked = TrainConfig(
        algo="grpo",
        rollout=RolloutConfig(groups=4, group_size=2, max_turns=1, reply_tokens=REPLY_TOKENS,
                              mode="nothink"),
        filter=FilterConfig(strategy="top_p", top_p=0.9, include_zero=False),
        advantage=AdvantageConfig(whiten=True),  # a statistic over the whole batch's tokens
        loss=LossConfig(agg="seq_mean_token_sum_norm", kl_coef=0.01, entropy_coef=0.01),
        optim=OptimConfig(actor_lr=1e-3, critic_lr=1e-3, minibatch_rows=4, micro_batches=2))
    fixed = dataclasses.replace(
        masked, filter=FilterConfig(strategy="top_k_abs", keep_groups=2, include_zero=False),
        optim=dataclasses.replace(masked.optim, micro_batches=1))
    host = {"rewards": SPLIT_REWARDS, "scramble": False}
    cases = {"split": (masked, SPLIT_REWARDS, False),
             "scrambled": (masked, SPLIT_REWARDS, True),
             "none": (masked, np.ones(8, np.float32), False),
             "top_k_abs": (fixed, SPLIT_REWARDS, False)}
    steps, out = {}, {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train_lib, "chunked_rollout", _host_rollout(host))
        for name, (config, rewards, scramble) in cases.items():
            if config not in steps:
                steps[config] = train_lib.make_train_step(
                    config, env, codec, model=model, eos_id=tok.eos_token_id,
                    pad_id=tok.pad_token_id)
            host.update(rewards=rewards, scramble=scramble)
            before = train_lib.init_train_state(config, jax.random.PRNGKey(0), model=model)
            # The step donates its state: it gets a copy, `before` stays readable.
            state, metrics = steps[config](jax.tree.map(jnp.copy, before),
                                           jax.random.PRNGKey(3))
            before = jax.device_get(before)
            out[name] = (before, jax.device_get(state), jax.device_get(metrics))
    return out


def _params(state):
    return jax.tree.leaves(state.actor)


def test_masked_rows_change_nothing_in_the_update(masked_steps):
    """Scrambling the tokens and loss masks of the groups top_p did not keep leaves the step's
    weights and update metrics exactly as they were."""
    _, split, metrics = masked_steps["split"]
    _, scrambled, scrambled_metrics = masked_steps["scrambled"]
    assert metrics["rollout/kept_groups"] == 2
    for a, b in zip(_params(split), _params(scrambled)):
        np.testing.assert_array_equal(a, b)
    # actor/entropy is the sampler's over every rolled-out row, kept or not (train/step.py).
    unkept_free = lambda m: {k: v for k, v in m.items() if k != "actor/entropy"}  # noqa: E731
    assert unkept_free(metrics) == unkept_free(scrambled_metrics)


def test_masked_step_equals_the_step_on_the_kept_groups_alone(masked_steps):
    """top_p's 8 static rows (half masked, in 2 mini-batches of 2 micro-batches) train exactly
    as top_k_abs's 4 rows of the same two groups in one mini-batch: one update, the same
    normalisers (Dr.GRPO's row count is the kept rows'), the same metrics."""
    before, masked, want = masked_steps["split"]
    _, fixed, got = masked_steps["top_k_abs"]
    assert got["rollout/kept_groups"] == want["rollout/kept_groups"] == 2
    assert not all(np.array_equal(a, b) for a, b in zip(_params(before), _params(masked)))
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-6, err_msg=key)
    # Adam's first step moves each weight by about lr whatever the gradient's size (see
    # test_train): equal weights to 1% of lr mean equal gradients.
    for a, b in zip(_params(masked), _params(fixed)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_a_step_that_keeps_nothing_leaves_the_state_alone(masked_steps):
    """All groups of zero std and include_zero False: no group kept, no optimizer step (AdamW
    would otherwise move the weights by weight decay), as the original skips such a step."""
    before, after, metrics = masked_steps["none"]
    assert metrics["rollout/kept_groups"] == 0
    assert metrics["actor/pg_loss"] == 0 and metrics["rollout/chosen_in_group_std"] == 0
    for name in ("actor", "actor_opt"):
        for a, b in zip(jax.tree.leaves(getattr(before, name)),
                        jax.tree.leaves(getattr(after, name))):
            np.testing.assert_array_equal(a, b, err_msg=name)
    assert after.step == before.step + 1


def test_prepare_ranks_by_the_metric_and_scales_the_advantages():
    """`prepare` ranks groups by the trajectories' mean sampled-token entropies (the sampler's;
    metric "entropy"), and loss_scaling "sqrt" multiplies the advantages by the square root of
    the share of groups kept. The per-row values of "length" are the sampled-token counts."""
    from starpo_jax.train import step as train_lib
    from test_rollout import REPLY_TOKENS, tiny_bandit_setup

    model, tok, env, codec = tiny_bandit_setup()
    base = TrainConfig(
        algo="grpo",
        rollout=RolloutConfig(groups=4, group_size=2, max_turns=1, reply_tokens=REPLY_TOKENS,
                              mode="nothink"),
        filter=FilterConfig(keep_ratio=0.5, metric="entropy"),
        advantage=AdvantageConfig(grpo_mode="mean"))
    scaled = dataclasses.replace(base, filter=dataclasses.replace(base.filter,
                                                                  loss_scaling="sqrt"))
    kw = dict(model=model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    state = train_lib.init_train_state(base, jax.random.PRNGKey(0), model=model)
    out = jax.jit(train_lib.make_train_fns(base, env, codec, **kw).rollout)(
        state, jax.random.PRNGKey(11))
    # Rewards of its own for each row (the tiny model's replies all earn the format penalty).
    out = out.replace(turn_rewards=out.turn_rewards.at[:, 0].set(jnp.arange(8.0) % 3))
    mask = np.asarray(out.loss_mask)
    lengths = mask.sum(-1).astype(np.float32)
    entropy = (np.asarray(out.behaviour_entropy) * mask).sum(-1) / np.maximum(mask.sum(-1), 1)
    np.testing.assert_allclose(train_lib.filter_values(out, "entropy"), entropy, rtol=1e-6)
    np.testing.assert_array_equal(train_lib.filter_values(out, "length"), lengths)
    assert train_lib.filter_values(out, "reward") is None
    batches = [jax.device_get(jax.jit(train_lib.make_train_fns(c, env, codec, **kw).prepare)(
        state, out)) for c in (base, scaled)]
    selection = batches[0].selection
    mean_entropy = entropy.reshape(4, 2).mean(1)
    np.testing.assert_allclose(selection.group_score, mean_entropy, rtol=1e-6)
    kept = selection.indices[selection.kept].tolist()
    # The tiny random model's entropies differ in the 6th digit: rank the computed scores.
    assert kept == reference(selection.group_score.tolist(), base.filter) and len(kept) == 2
    np.testing.assert_allclose(batches[1].advantages,
                               batches[0].advantages * np.sqrt(len(kept) / 4), rtol=1e-6)
    assert np.abs(batches[0].advantages).max() > 0
