"""Memory settings chosen from the compiled plan (starpo_jax/sizing/autofit.py, check_memory)."""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from starpo_jax import api  # noqa: E402
from starpo_jax.sizing import autofit  # noqa: E402
from starpo_jax.sizing.autofit import MARGIN, Settings, StepShape  # noqa: E402
from starpo_jax.config import FilterConfig, RolloutConfig, TrainConfig  # noqa: E402
from starpo_jax.sizing.memory import GIB  # noqa: E402
from helpers.tiny import tiny_config  # noqa: E402
from test_flops import SMOLLM2  # noqa: E402

# 4 groups x 4 rows, half the groups kept: one mini-batch of 8 rows; a first prompt of 512 of
# the 1024 positions that a group's rows share in the update's forwards.
TRAIN = TrainConfig(algo="ppo", rollout=RolloutConfig(groups=4, group_size=4),
                    filter=FilterConfig(keep_ratio=0.5))
SHAPE = StepShape.of(TRAIN, SMOLLM2, length=1024, state_bytes=3 * GIB, prefix_width=512)


def test_options_are_fastest_first_within_the_given_knobs():
    every = autofit.options(TRAIN, autofit.KNOBS, SHAPE)
    # micro-batches 1, 2, 4, 8 x remat x (float32 at 1, 2, 4 chunks + bfloat16 at 4 chunks)
    assert len(every) == 4 * 2 * 4 == len(set(every))
    # One slice of 5120 positions is large (slice_cost): with remat it costs its positions and
    # no more, so it comes first; then 2 micro-batches of one group each (each group's prompt
    # once, slices of 2560) without remat; 4 and 8 (half or a quarter of a group) recompute the
    # prompt in slices small enough that remat costs its extra forward.
    assert every[:2] == [Settings(1, True, "float32", 1), Settings(2, False, "float32", 1)]
    times = [autofit.relative_time(SHAPE, TRAIN, s) for s in every]
    assert times == sorted(times)
    assert {s.chunks for s in every if s.cache_dtype == "bfloat16"} == {4}
    # A knob that was set keeps its value in every candidate.
    set_some = dataclasses.replace(TRAIN, optim=dataclasses.replace(TRAIN.optim, remat=True))
    only = autofit.options(set_some, ("optim.micro_batches",), SHAPE)
    assert only == [Settings(m, True, "float32", 1) for m in (1, 2, 4, 8)]
    with pytest.raises(ValueError, match="auto = \\['optim.lr'\\] is invalid"):
        autofit.options(TRAIN, ("optim.lr",), SHAPE)
    # A bfloat16 sampler's cache is bfloat16 whatever cache_dtype says: only that is offered.
    half = dataclasses.replace(
        TRAIN, rollout=dataclasses.replace(TRAIN.rollout, sampler_dtype="bfloat16"))
    sampled = autofit.options(half, autofit.KNOBS, SHAPE)
    assert len(sampled) == 4 * 2 * 3 and {s.cache_dtype for s in sampled} == {"bfloat16"}
    assert {s.chunks for s in sampled} == {1, 2, 4}


def _positions_by_hand(rows: int, group: int, pieces: int, length: int, width: int) -> int:
    """Positions the update computes over `rows` group-major rows in `pieces` slices: each
    slice runs the first prompt once per group it holds (at least once), then every row's
    remaining positions; a slice of one row runs it whole."""
    per = rows // pieces
    total = 0
    for k in range(pieces):
        groups = {(k * per + i) // group for i in range(per)}
        total += per * length if per == 1 else len(groups) * width + per * (length - width)
    return total


@pytest.mark.parametrize("pieces", [1, 2, 4, 8])
def test_the_update_time_counts_a_groups_prompt_once_per_slice(pieces):
    # GRPO (no critic), one chunk: the update's modelled time is TRAIN_TOKEN per position of
    # its slices (+ a third of one for the old log-probs' forward), the rollout's is fixed.
    # L = 256 with a 128-token prompt: every slice is below SLICE_FAST (no per-position excess).
    train = dataclasses.replace(TRAIN, algo="grpo")
    shape = dataclasses.replace(SHAPE, critic=False, length=256, prefix_width=128)
    s = Settings(pieces, False, "float32", 1)
    positions = _positions_by_hand(8, 4, pieces, 256, 128)
    update = autofit.relative_time(shape, train, s) - autofit.relative_time(
        shape, train, Settings(1, False, "float32", 1))
    base = _positions_by_hand(8, 4, 1, 256, 128)
    assert base < autofit.SLICE_FAST
    assert update == pytest.approx(autofit.TRAIN_TOKEN * (4 / 3) * (positions - base))
    remat = autofit.relative_time(shape, train, Settings(pieces, True, "float32", 1)) \
        - autofit.relative_time(shape, train, s)
    assert remat == pytest.approx(autofit.TRAIN_TOKEN * positions / 3)


def test_large_slices_the_model_fits_the_measured_update_sweep():
    # The CPU suite's Sokoban GRPO update (8 kept rows of one group, L = 1288, a 208-token
    # prompt) measured 75.1 / 66.3 / 75.0 s in 2 / 4 / 8 micro-batches without remat (slices of
    # 4 / 2 / 1 rows; results/cpu/bench/update_micro_batches.txt), and 50.1 / 59.5 / 63.3 s in 1
    # / 2 / 4 with remat (docs/performance.md): the model's ratios without remat within 8%, and
    # the measured order of the settings tried, one slice with remat first (autofit chose 2
    # micro-batches without remat before it modelled the slices).
    train = TrainConfig(algo="grpo", rollout=RolloutConfig(groups=4, group_size=8),
                        filter=FilterConfig(keep_ratio=0.25))
    shape = StepShape.of(train, SMOLLM2, length=1288, state_bytes=GIB, prefix_width=208)
    shape = dataclasses.replace(shape, decode_tokens=0)  # the update and old log-probs alone

    def time(m: int, remat: bool) -> float:
        return autofit.relative_time(shape, train, Settings(m, remat, "float32", 1))

    assert time(2, False) / time(4, False) == pytest.approx(75.1 / 66.3, rel=0.08)
    assert time(8, False) / time(4, False) == pytest.approx(75.0 / 66.3, rel=0.08)
    assert time(1, True) < time(2, True) < time(4, False) < time(2, False)
    fastest = autofit.options(train, ("optim.micro_batches", "optim.remat"), shape)[0]
    assert fastest == Settings(1, True, "float32", 1)
    # Per position, a large slice costs 1 + SLICE_EXCESS times a small one without remat, and
    # the same as a small one without remat with it (4/3 at small slices); the bounds scale
    # with the MLP's width (a model twice as wide reaches them at half the positions).
    cost = {(n, r): autofit.slice_cost(SMOLLM2, n, r) / n for n in (1000, 9000)
            for r in (False, True)}
    assert cost == {(1000, False): 1.0, (9000, False): pytest.approx(1 + autofit.SLICE_EXCESS),
                    (1000, True): pytest.approx(4 / 3), (9000, True): 1.0}
    wide = dataclasses.replace(SMOLLM2, intermediate_size=2 * SMOLLM2.intermediate_size)
    assert autofit.slice_cost(wide, autofit.SLICE_SLOW // 2, False) == pytest.approx(
        autofit.slice_cost(SMOLLM2, autofit.SLICE_SLOW, False) / 2)


def _decode_ms(rows: int, chunks: int, length: int, width: int) -> float:
    """The modelled rollout of `rows` rows in `chunks` chunks, per generated row-token."""
    train = TrainConfig(rollout=RolloutConfig(groups=rows // 8, group_size=8))
    shape = StepShape.of(train, SMOLLM2, length=length, state_bytes=GIB, prefix_width=width)
    s = Settings(1, False, "float32", chunks)
    update = autofit.relative_time(dataclasses.replace(shape, decode_tokens=0), train, s)
    return (autofit.relative_time(shape, train, s) - update) / (rows * shape.decode_tokens)


def test_chunks_the_decode_model_fits_its_measured_points():
    # Decode steps timed alone (autofit's comment): per row-token, the quickstart's cache (32
    # rows, ~210 filled slots) 2.38 ms in one chunk against 3.94 in four of 8; the CPU suite's
    # Sokoban (32 rows, L = 1288) 3.54 in one against 4.06 in two of 16; the paper shape (128
    # rows, L = 1758, first prompt 371) 5.40 / 4.77 / 5.01 / 6.16 ms in chunks of 16 / 32 / 64
    # / 128 rows. The model's mean fill, (L + prompt) / 2, is not the benches' fill, so the
    # ratios are checked, and the order.
    short = _decode_ms(32, 4, 223, 208) / _decode_ms(32, 1, 223, 208)
    assert short == pytest.approx(3.94 / 2.38, rel=0.1)
    suite = _decode_ms(32, 2, 1288, 208) / _decode_ms(32, 1, 1288, 208)
    assert suite == pytest.approx(4.06 / 3.54, rel=0.1)
    paper = {c: _decode_ms(128, c, 1758, 371) for c in (1, 2, 4, 8)}
    assert paper[8] / paper[4] == pytest.approx(5.40 / 4.77, rel=0.1)
    assert paper[1] / paper[4] == pytest.approx(6.16 / 4.77, rel=0.1)
    # So one chunk ranks first at the quickstart's and the suite's caches (autofit picked two
    # 16-row chunks at the suite's shape, 8% slower a rollout), 32-row chunks at the paper's.
    assert min((1, 2, 4), key=lambda c: _decode_ms(32, c, 223, 208)) == 1
    assert min((1, 2, 4), key=lambda c: _decode_ms(32, c, 1288, 208)) == 1
    assert min(paper, key=paper.get) == 4


def test_cache_bytes_by_hand():
    # SmolLM2: 30 layers x 3 kv heads x 64 dims, keys and values, 16 rows x 1732 slots.
    assert autofit.cache_bytes(SMOLLM2, 16, 1732, "float32") == 2 * 30 * 16 * 3 * 1732 * 64 * 4
    assert autofit.cache_bytes(SMOLLM2, 16, 1732, "bfloat16") == 2 * 30 * 16 * 3 * 1732 * 64 * 2


def _fake_plans(rollout_scale: float, update_scale: float):
    """A 'compiler' whose plans are the estimate with each phase mis-estimated by a factor;
    records what it compiled."""
    compiled = []

    def plan_of(settings: Settings) -> int:
        compiled.append(settings)
        rollout, update = autofit.estimate(SHAPE, settings)
        return int(SHAPE.state_bytes + max(rollout * rollout_scale, update * update_scale))

    return plan_of, compiled


@pytest.mark.parametrize("scales", [(1.0, 1.0), (1.6, 1.0), (1.0, 0.5), (0.7, 1.8)])
@pytest.mark.parametrize("free_gib", [5, 7, 8, 12, 40])
def test_choice_is_the_fastest_that_fits_among_all_candidates(scales, free_gib):
    candidates = autofit.options(TRAIN, autofit.KNOBS, SHAPE)
    plan_of, compiled = _fake_plans(*scales)
    # Reference: every candidate's plan, the first (fastest) within the margin.
    limit = (1 - MARGIN) * free_gib * GIB
    every_plan = {s: _fake_plans(*scales)[0](s) for s in candidates}
    expected = next((s for s in candidates if every_plan[s] <= limit), None)
    if expected is None:
        with pytest.raises(MemoryError):
            autofit.choose(candidates, SHAPE, plan_of, free_gib * GIB, "host RAM",
                           autofit.KNOBS)
        return
    choice = autofit.choose(candidates, SHAPE, plan_of, free_gib * GIB, "host RAM",
                            autofit.KNOBS)
    assert choice.settings == expected
    assert choice.needed == every_plan[expected] and choice.budget == free_gib * GIB
    assert len(compiled) <= autofit.MAX_COMPILES and len(set(compiled)) == len(compiled)
    assert [s for s, _ in choice.compiled] == compiled
    if scales == (1.0, 1.0):  # right estimates: one compile, of the answer
        assert compiled == [expected]


def test_nothing_fits_raises_with_the_most_frugal_plan_and_the_hint():
    plan_of, compiled = _fake_plans(1.0, 1.0)
    candidates = autofit.options(TRAIN, autofit.KNOBS, SHAPE)
    with pytest.raises(MemoryError, match="would not fit with any memory settings tried") as error:
        autofit.choose(candidates, SHAPE, plan_of, GIB, "host RAM", autofit.KNOBS,
                       hint="HINT")
    assert compiled == [Settings(8, True, "bfloat16", 4)]  # the most frugal, then nothing left
    assert "optim.micro_batches=8, optim.remat=True" in str(error.value)
    assert str(error.value).endswith("HINT")


def test_choice_line_and_record_say_what_and_why():
    plan_of, _ = _fake_plans(1.0, 1.0)
    candidates = autofit.options(TRAIN, ("optim.micro_batches",), SHAPE)
    choice = autofit.choose(candidates, SHAPE, plan_of, 12 * GIB, "host RAM",
                            ("optim.micro_batches",))
    line = choice.line()
    # 8 micro-batches: 9.8 GiB (estimate = plan here), 4: 13.1 GiB.
    assert line == ("memory settings (unset, so chosen): optim.micro_batches=8, the fastest "
                    "that fits 90% of the free memory: 9.8 GiB needed, 12.0 GiB host RAM "
                    "available; every faster setting needs >= 13.1 GiB (1 compiled)")
    record = choice.record()
    assert record["settings"]["optim.micro_batches"] == choice.settings.micro_batches
    assert record["auto"] == ["optim.micro_batches"] and record["available_gib"] == 12.0


# --- the api, on the tiny model (each compile of its step takes seconds) ---


def _config(**optim):
    """tiny_config with every memory knob set but micro_batches (2 groups x 2 rows, all kept:
    one mini-batch of 4 rows), replies of 32 tokens so that the update's logits take room."""
    c = tiny_config()
    c.rollout.update(reply_tokens=32, cache_dtype="float32", chunks=1)
    c.filter.keep_ratio = 1.0
    c.optim.update(remat=False, **optim)
    return c


@pytest.fixture(scope="module")
def auto_exp():
    return api.build(_config())


@pytest.fixture(scope="module")
def explicit_exp():
    return api.build(_config(micro_batches=4))


def test_unset_is_none_in_the_config_and_fastest_in_the_train_config():
    c = api.default_config()
    assert [c.optim.micro_batches, c.optim.remat, c.rollout.cache_dtype, c.rollout.chunks] \
        == [None] * 4
    assert api.auto_knobs(c) == autofit.KNOBS
    t = api.train_config(c)
    assert Settings.of(t) == Settings(1, False, "float32", 1)
    assert api.auto_knobs(_config()) == ("optim.micro_batches",)
    assert api.auto_knobs(_config(micro_batches=2)) == ()


@pytest.mark.slow  # the slow tier (README)
def test_chooses_on_an_injected_free_memory_and_equals_the_explicit_setting(auto_exp,
                                                                            explicit_exp):
    exp = auto_exp
    base = exp.train
    # The plan of 4 micro-batches (one row each); free memory such that it just fits: the
    # choice must be 4, as 1 and 2 hold more rows' logits at once (checked below).
    exp.use(Settings(4, False, "float32", 1).apply(base))
    four = api.memory_plan(exp).needed
    free = int(1.01 * four / (1 - MARGIN))
    exp.use(base)
    api.check_memory(exp, available=lambda: free)
    assert exp.memory.settings == Settings(4, False, "float32", 1)
    assert exp.train.optim.micro_batches == 4 and exp.memory.budget == free
    for m in (1, 2):  # the faster settings do not fit (compiled already, or now)
        exp.use(Settings(m, False, "float32", 1).apply(base))
        assert api.memory_plan(exp).needed > (1 - MARGIN) * free
    exp.use(exp.memory.settings.apply(base))
    chosen = exp.step()
    assert explicit_exp.auto == () and explicit_exp.train == exp.train
    assert explicit_exp.step() == chosen


def test_explicit_setting_wins_and_an_impossible_budget_names_the_knobs(auto_exp,
                                                                        explicit_exp):
    with pytest.raises(MemoryError, match="would not fit: .* GiB needed") as error:
        api.check_memory(explicit_exp, available=lambda: 2**20)
    assert "optim.micro_batches (now 4" in str(error.value)
    assert explicit_exp.train.optim.micro_batches == 4 and explicit_exp.memory is None
    exp = auto_exp
    exp.memory = None
    with pytest.raises(MemoryError, match="any memory settings tried: the most frugal, "
                                          "optim.micro_batches=4") as error:
        api.check_memory(exp, available=lambda: 2**20)
    assert "check_memory=False runs it anyway" in str(error.value)
    assert exp.memory is None


def test_a_resumed_run_takes_the_earlier_choice_for_unset_knobs_only(auto_exp):
    exp = auto_exp
    before = exp.train, exp.auto
    try:
        # A record of config.json: remat was set in this config (False), so it stays.
        api.pin_memory(exp, {"optim.micro_batches": 2, "optim.remat": True})
        assert Settings.of(exp.train) == Settings(2, False, "float32", 1) and exp.auto == ()
    finally:
        exp.auto = before[1]
        exp.use(before[0])


def test_the_step_time_estimate_scales_inversely_with_the_matmul_rate(auto_exp):
    """The printed estimate is autofit's model at the fitted CPU's matmul rate, scaled by the
    rate measured here (speed): half the rate, twice the time; the range brackets it."""
    from starpo_jax.sizing.speed import (MODEL_BAND, REFERENCE, REFERENCE_MATMUL_FLOPS,
                                         MatmulRate, step_range, step_seconds)

    modelled = autofit.relative_time(SHAPE, TRAIN, Settings(1, False, "float32", 1))
    assert step_seconds(modelled, REFERENCE) == pytest.approx(modelled / 1e3)
    half = MatmulRate(REFERENCE_MATMUL_FLOPS / 2, REFERENCE_MATMUL_FLOPS / 2)
    assert step_seconds(modelled, half) == pytest.approx(2 * modelled / 1e3)
    rate = MatmulRate(1e11, 1e11)
    assert auto_exp.estimated_step_seconds(rate=half) == pytest.approx(
        2 * auto_exp.estimated_step_seconds(rate=REFERENCE))
    assert auto_exp.estimated_step_seconds(rate=rate) == pytest.approx(
        4.2 * auto_exp.estimated_step_seconds(rate=REFERENCE))
    # One rate: the model's band around it; a rate that varied widens it on both sides.
    assert step_range(10.0, rate) == pytest.approx((10.0 * MODEL_BAND[0], 10.0 * MODEL_BAND[1]))
    varied = MatmulRate(1.44e11, 1e11)  # typical: 1.2e11
    assert step_range(10.0, varied) == pytest.approx((10.0 / 1.2 * MODEL_BAND[0],
                                                      10.0 * 1.2 * MODEL_BAND[1]))
    assert varied.describe() == "100-144 GFLOP/s" and rate.describe() == "100 GFLOP/s"


def test_the_matmul_is_timed_within_its_budget():
    from starpo_jax.sizing.speed import time_matmul

    rate = time_matmul(n=64, reps=3, budget=10.0)
    assert 0 < rate.slowest <= rate.typical <= rate.fastest
    assert time_matmul(n=64, reps=5, budget=0.0).fastest > 0  # one timed repeat at least
