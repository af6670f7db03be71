"""Countdown: the in-JAX expression parser and scorer agree with Python's own arithmetic (the
original's `compute_reward`) on random answers; the generator's instances are solvable."""

from __future__ import annotations

import itertools
import re
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax.countdown import expression as ex
from envs_jax.countdown.env import Countdown

WIDTH = 128
ALPHABET = "0123456789+-*/() \t\x0c\n\r"


def original_reward(answer: str, nums: list[int], target: int) -> float:
    """The original's compute_reward (check_format, then check_correctness with eval), on the
    grammar this env scores: answers with other characters, "**" or "//" do not evaluate."""
    try:
        if sorted(int(n) for n in re.findall(r"\d+", answer)) != sorted(nums):
            return 0.0
    except ValueError:
        return 0.0
    if any(ch not in ALPHABET for ch in answer) or "**" in answer or "//" in answer:
        return 0.1
    try:
        result = eval(answer, {"__builtins__": None}, {})  # noqa: S307 - the original's check
        correct = abs(result - target) < 1e-5
    except Exception:  # noqa: BLE001 - the original catches everything
        correct = False
    return 1.0 if correct else 0.1


def exact_value(answer: str) -> Fraction | None:
    """The answer's value in exact arithmetic (None if Python cannot evaluate it)."""
    try:
        value = eval(re.sub(r"\d+", lambda m: f"F({m.group()})", answer),  # noqa: S307
                     {"__builtins__": None, "F": Fraction}, {})
    except Exception:  # noqa: BLE001
        return None
    return value if isinstance(value, Fraction) else None


def _expression(rng: np.random.Generator, nums: list[int]) -> str:
    """A random well-formed expression over nums (each once), with parentheses, unary signs
    and spacing."""
    parts = [str(n) for n in rng.permutation(nums)]
    while len(parts) > 1:
        i = int(rng.integers(len(parts) - 1))
        op = str(rng.choice(list("+-*/")))
        space = " " if rng.random() < 0.6 else ""
        joined = f"{parts[i]}{space}{op}{space}{parts[i + 1]}"
        if rng.random() < 0.5:
            joined = f"({joined})"
        parts[i : i + 2] = [joined]
    text = parts[0]
    if rng.random() < 0.1:
        text = "-" + text if rng.random() < 0.5 else "+(" + text + ")"
    return text


def _malform(rng: np.random.Generator, text: str) -> str:
    """A random corruption: a deleted, inserted or doubled character, or a known trap."""
    kind = int(rng.integers(8))
    i = int(rng.integers(len(text) + 1))
    if kind == 0 and text:
        return text[: max(i - 1, 0)] + text[i:]
    if kind == 1:
        return text[:i] + str(rng.choice(list(ALPHABET + "x=.%,"))) + text[i:]
    if kind == 2:
        return text.replace("*", "**", 1) if "*" in text else text + "//2"
    if kind == 3:
        return "0" + text if text[:1].isdigit() else text + " = 5"
    if kind == 4:
        return f"({text}\n)" if rng.random() < 0.5 else text.replace(" ", "\n", 1)
    if kind == 5:
        return text + "/(1-1)"
    if kind == 6:
        return text.replace("(", "", 1)
    return text + " " + str(int(rng.integers(0, 100)))


def _cases(count: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(count):
        n = int(rng.integers(3, 6))
        nums = [int(x) for x in rng.integers(1, 100, n)]
        text = _expression(rng, nums)
        value = exact_value(text)
        if value is not None and value.denominator == 1 and rng.random() < 0.5:
            target = int(value)  # a right answer
        else:
            target = int(rng.integers(10, 101))
        if k % 3 == 2:
            text = _malform(rng, text)
        if k % 50 == 0:
            nums = nums[:-1]  # a number too many in the answer
        text = text.strip(" \t\n\r\x0b\x0c")  # the answer parser strips the item
        rows.append((text, nums, target))
    return rows


def _encode(texts: list[str]):
    items = np.full((len(texts), WIDTH), -1, np.int32)
    lengths = np.zeros((len(texts),), np.int32)
    for i, t in enumerate(texts):
        b = t.encode()
        items[i, : min(len(b), WIDTH)] = np.frombuffer(b[:WIDTH], np.uint8)
        lengths[i] = len(b)
    return items, lengths


_ANY_COUNT = Countdown(min_numbers=2, max_numbers=5)  # steps with any count of 2..5 numbers


@jax.jit
def _score(items, lengths, nums, counts, targets):
    env = _ANY_COUNT

    def one(item, length, num, count, target):
        state = jax.tree.map(jnp.asarray, env.reset(jax.random.PRNGKey(0))[0])
        state = state._replace(nums=num, count=count, target=target)
        action = env.parse_action(item, length)
        _, ts = env.step(state, action)
        return ts.reward, ts.extras["success"], action.approx

    return jax.vmap(one)(items, lengths, nums, counts, targets)


@pytest.mark.optimized  # its time is running, not compiling (conftest)
def test_rewards_match_python_on_random_answers():
    cases = _cases(12_000)
    items, lengths = _encode([t for t, _, _ in cases])
    nums = np.zeros((len(cases), 5), np.int32)
    for i, (_, n, _) in enumerate(cases):
        nums[i, : len(n)] = n
    counts = np.array([len(n) for _, n, _ in cases], np.int32)
    targets = np.array([t for _, _, t in cases], np.int32)
    reward, success, approx = jax.device_get(_score(items, lengths, nums, counts, targets))
    want = np.array([original_reward(t, n, g) for t, n, g in cases], np.float32)
    bad = [(cases[i], want[i], reward[i]) for i in np.flatnonzero(reward != want)]
    assert not bad, f"{len(bad)} mismatches, e.g. {bad[:5]}"
    assert np.all(np.isfinite(approx)) and np.array_equal(success, want == 1.0)
    # The sample covers every outcome, well-formed and malformed.
    assert min((want == 1.0).sum(), (want == 0.1).sum(), (want == 0.0).sum()) > 1000


@pytest.mark.parametrize("text, value", [
    ("2 + 5 - 3", Fraction(4)), ("-2*3", Fraction(-6)), ("2*-3*4", Fraction(-24)),
    ("((44 + 19) * 35) / 98", Fraction(45, 2)), ("--3", Fraction(3)), ("(1+\n2)", Fraction(3)),
    ("00+1", Fraction(1)), ("1/3*3", Fraction(1)),
])
def test_values_are_exact_fractions(text, value):
    items, lengths = _encode([text])
    e = jax.device_get(jax.jit(jax.vmap(ex.parse_expression))(items, lengths))
    assert e.evaluable[0] and e.exact[0]
    assert Fraction(int(e.numerator[0]), int(e.denominator[0])) == value


@pytest.mark.parametrize("text", ["05+1", "1+\n2", "3/(5-5)", "2**3", "7//2", "(3)(4)", "()",
                                  "1+", "", "1 2", "x+1"])
def test_what_python_rejects_does_not_evaluate(text):
    items, lengths = _encode([text])
    e = jax.device_get(jax.jit(jax.vmap(ex.parse_expression))(items, lengths))
    assert not e.evaluable[0]


def _reachable(nums: list[int], target: int) -> bool:
    """Stream-of-Search rules: combine two numbers with +, *, larger - smaller, exact /."""
    if len(nums) == 1:
        return nums[0] == target
    for i, j in itertools.combinations(range(len(nums)), 2):
        a, b = max(nums[i], nums[j]), min(nums[i], nums[j])
        rest = [x for k, x in enumerate(nums) if k not in (i, j)]
        results = {a + b, a * b, a - b} | ({a // b} if b and a % b == 0 else set())
        if any(_reachable(rest + [r], target) for r in results):
            return True
    return False


def has_solution(nums: list[int], target: int) -> bool:
    """The original's dataset filter (signs on the numbers padded to 4)."""
    padded = nums + [0] * (4 - len(nums))
    return any(sum(s * x for s, x in zip(signs, padded)) == target
               for signs in itertools.product([1, -1], repeat=len(padded)))


@pytest.mark.parametrize("name, sizes, plus_minus_only", [
    ("countdown", (3, 4), True), ("countdown_5", (5,), True), ("countdown", (3, 4), False)])
def test_generated_instances_are_solvable(name, sizes, plus_minus_only):
    env = envs_jax.make(name, plus_minus_only=plus_minus_only)
    states, _ = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(3), 150))
    states = jax.device_get(states)
    for nums, count, target in zip(states.nums, states.count, states.target):
        given = [int(x) for x in nums[:count]]
        assert int(count) in sizes and np.all(nums[count:] == 0)
        assert all(1 <= x <= 99 for x in given) and 10 <= target <= 100
        assert _reachable(given, int(target)), (given, target)
        if plus_minus_only:
            assert has_solution(given, int(target)), (given, target)
    assert set(np.unique(states.count)) == set(sizes)


def test_observation_text_is_the_originals():
    env = envs_jax.make("countdown")
    states, _ = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(0), 20))
    for b in range(20):
        s = jax.tree.map(lambda x, b=b: np.asarray(x[b]), states)
        nums = [int(x) for x in s.nums[: s.count]]
        assert env.render_text(s) == f"Target: {int(s.target)}, nums: {nums}"
