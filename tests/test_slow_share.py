"""tests/helpers/slow_share.py, the slow tier's share in CI: every slow test is in exactly one
group, the groups are about equal in time, a commit's share adds the tests of changed files,
and .ci/run runs the share after the fast tier."""

from __future__ import annotations

from pathlib import Path

from helpers import slow_share

ROOT = Path(__file__).resolve().parents[1]


def test_groups_cover_every_test_once_heaviest_spread():
    heavy = list(slow_share.SECONDS)[:3]
    ids = heavy + [f"tests/test_x.py::test_{i}" for i in range(12)]
    groups = slow_share.pack(ids, 5)
    assert sorted(n for g in groups for n in g) == sorted(ids)
    assert len({n for g in groups for n in g}) == len(ids)
    # The three heaviest land in three different groups, and no group's seconds exceed the
    # heaviest test's plus what it takes to fill the lightest.
    assert len({k for k, g in enumerate(groups) for n in g if n in heavy}) == 3
    loads = [sum(slow_share.SECONDS.get(n, slow_share.DEFAULT_SECONDS) for n in g)
             for g in groups]
    assert max(loads) <= max(slow_share.SECONDS[heavy[0]], min(loads)
                             + slow_share.DEFAULT_SECONDS)
    order = {n: i for i, n in enumerate(ids)}
    assert all(g == sorted(g, key=order.__getitem__) for g in groups), "collection order"


def test_a_share_adds_every_test_of_a_changed_file():
    ids = [f"tests/test_{f}.py::test_{i}" for f in "abc" for i in range(4)]
    groups = slow_share.pack(ids, 3)
    for k in range(3):
        assert slow_share.share(ids, k, set(), 3) == [n for n in ids if n in groups[k]]
    chosen = slow_share.share(ids, 0, {"tests/test_b.py"}, 3)
    assert {n for n in ids if n.startswith("tests/test_b.py")} <= set(chosen)
    assert set(groups[0]) <= set(chosen) and chosen == [n for n in ids if n in chosen]


def test_ci_runs_the_share_after_the_fast_tier():
    ci = (ROOT / ".ci" / "run").read_text()
    fast = ci.index('-m "serial and not slow"')
    assert fast < ci.index("slow_share.py --parallel") < ci.index("slow_share.py --serial")
    # A fast-tier failure fails CI (its line is no longer the script's last), and an empty
    # share runs nothing (pytest with no test ids would run the whole suite).
    assert 'python -m pytest -q -m "serial and not slow" || exit 1' in ci
    assert 'if [ -n "$parallel" ]' in ci and 'if [ -n "$serial" ]' in ci
    base = (ROOT / ".ci" / "slow_base").read_text().strip()
    assert len(base) == 40 and int(base, 16) >= 0
