"""The share of the slow tier CI runs after the fast one (.ci/run), so that a slow-tier failure
cannot land unseen while CI stays within its budget.

    python tests/helpers/slow_share.py --parallel   # node ids for `pytest -n 2 --dist load`
    python tests/helpers/slow_share.py --serial     # node ids for plain `pytest` (multi-device)
    python tests/helpers/slow_share.py --plan       # every group, its tests and seconds

The slow tests (`-m slow`, collected here) are packed into GROUPS groups of about equal time by
their measured seconds (SECONDS below: a slow-tier run's --durations on the 2-core CI machine;
a test not listed counts DEFAULT_SECONDS), heaviest first into the lightest group. A CI run takes
the group named by its commit (HEAD's hash mod GROUPS: every group comes round as commits land,
shallow clones included), plus every slow test of a test file changed since .ci/slow_base (the
commit at which the whole slow tier last passed: tests written or changed since then run at
once). The whole slow tier stays `python -m pytest -q -m "slow and not serial" && python -m
pytest -q -m "slow and serial"` (docs/development.md); after it passes, record HEAD in
.ci/slow_base.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / ".ci" / "slow_base"
GROUPS = 5
DEFAULT_SECONDS = 20.0
# Seconds of the heavy slow tests (2026-12-07, the whole slow tier alone on the 2-core EPYC:
# two workers, then the serial ones; 19 minutes in all); the rest take under 20 s each.
SECONDS = {
    "tests/test_multihost.py::test_every_case_on_two_processes_and_a_2x2_mesh_equals_one_device":
        225,
    "tests/test_multi_turn_learning.py::test_grpo_learns_a_two_turn_plan_from_an_sft_start": 187,
    "tests/test_docs.py::test_the_blocks_run_in_order[quickstart.md]": 120,
    "tests/test_reproduce_multi_turn.py::"
    "test_tiny_multi_turn_suite_starts_from_sft_reports_baselines_and_resumes": 114,
    "tests/test_faults.py::test_kill_9_at_random_moments_loses_nothing[3-16-random]": 94,
    "tests/test_sft.py::test_sft_command_writes_a_workdir_and_resumes": 76,
    "tests/test_docs.py::test_the_blocks_run_in_order[README.md]": 72,
    "tests/test_sharded_memory.py::test_kv_cache_rows_split_over_devices": 64,
    "tests/test_faults.py::test_kill_9_at_random_moments_loses_nothing[1-12-mid-save]": 60,
    "tests/test_freetext_train.py::test_trains_by_name[sudoku_4x4-2-2]": 59,
    "tests/test_collapse.py::test_untrained_smollm2_retrieves_distinct_sokoban_levels": 57,
    "tests/test_train.py::test_phase_clock_marks_each_phase_in_order_and_changes_nothing": 50,
    "tests/test_train.py::test_sharded_pieces_equal_sharded_step": 42,
    "tests/test_multihost.py::test_two_processes_match_one": 41,
    "tests/test_train.py::test_grpo_learns_the_high_risk_arm": 40,
    "tests/test_autofit.py::"
    "test_chooses_on_an_injected_free_memory_and_equals_the_explicit_setting": 39,
    "tests/test_train.py::test_sharded_step_equals_single_device[grpo-advantage1-None]": 37,
    "tests/test_train.py::test_sharded_step_equals_single_device[grpo-advantage2-rollout2]": 33,
    "tests/test_sampling.py::test_embedded_smollm2_greedy_text_equals_transformers": 32,
    "tests/test_demonstrations_text.py::test_free_text_reply_tokens_are_the_tokenizers_own"
    "[nothink]": 28,
    "tests/test_train.py::test_same_key_same_metrics": 27,
    "tests/test_freetext_train.py::test_trains_by_name[countdown-1-1]": 27,
    "tests/test_install.py::test_pip_resolves_the_gpu_extra": 26,
}


def collect(expression: str) -> list[str]:
    """The node ids pytest selects with -m `expression`."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-m",
                           expression, "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    ids = [line for line in done.stdout.splitlines() if "::" in line and " " not in line]
    if done.returncode not in (0, 5):  # 5: nothing collected
        sys.exit(f"collecting -m {expression!r} failed:\n{done.stdout[-2000:]}{done.stderr}")
    return ids


def pack(ids: list[str], groups: int = GROUPS) -> list[list[str]]:
    """ids in `groups` groups of about equal seconds: heaviest first, each into the group with
    the fewest seconds so far (ties: the lower index), each group in collection order."""
    order = {node: i for i, node in enumerate(ids)}
    loads, packed = [0.0] * groups, [[] for _ in range(groups)]
    for node in sorted(ids, key=lambda n: (-SECONDS.get(n, DEFAULT_SECONDS), order[n])):
        k = min(range(groups), key=lambda i: (loads[i], i))
        loads[k] += SECONDS.get(node, DEFAULT_SECONDS)
        packed[k].append(node)
    return [sorted(group, key=order.__getitem__) for group in packed]


def head_group(groups: int = GROUPS) -> int:
    """The group of this commit: HEAD's hash mod `groups` (0 outside a git checkout)."""
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    return int(done.stdout.strip(), 16) % groups if done.returncode == 0 else 0


def changed_test_files() -> set[str]:
    """Test files changed between .ci/slow_base and HEAD (empty when the base is not in this
    clone's history)."""
    if not BASE.is_file():
        return set()
    base = BASE.read_text().strip()
    done = subprocess.run(["git", "diff", "--name-only", f"{base}..HEAD", "--", "tests"],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    return set(done.stdout.split()) if done.returncode == 0 else set()


def share(ids: list[str], group: int, changed: set[str], groups: int = GROUPS) -> list[str]:
    """The group's tests and every test of a changed file, in collection order."""
    chosen = set(pack(ids, groups)[group]) | {n for n in ids if n.split("::")[0] in changed}
    return [n for n in ids if n in chosen]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--parallel", action="store_true", help="the share's non-serial tests")
    what.add_argument("--serial", action="store_true", help="the share's serial tests")
    what.add_argument("--plan", action="store_true", help="every group with its seconds")
    args = parser.parse_args()
    if args.plan:
        ids = collect("slow")
        for k, group in enumerate(pack(ids)):
            seconds = sum(SECONDS.get(n, DEFAULT_SECONDS) for n in group)
            print(f"group {k}: {len(group)} tests, ~{seconds / 60:.0f} worker-minutes")
            print("".join(f"  {n}\n" for n in group), end="")
        return
    ids = collect("slow")
    serial = set(collect("slow and serial"))
    chosen = share(ids, head_group(), changed_test_files())
    print("\n".join(n for n in chosen if (n in serial) == args.serial))


if __name__ == "__main__":
    main()
