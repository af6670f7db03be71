"""experiments/bench/step.py's side-by-side mode: the rows it prints are read back (also an older
commit's, printed by its own copy of the script), and --suite's matrix is issue 32's target 1."""

import pytest

from helpers.scripts import bench_module
from helpers.tiny import tiny_config


@pytest.fixture(scope="module")
def step():
    with bench_module("step") as module:
        yield module


def _row(**changes):
    row = dict(model="sokoban_cpu.py: smollm2-135m-instruct", env="sokoban", algo="grpo", B=32,
               L=1288, turns=5, reply=16, knobs="mb 4, remat False, float32 cache, 2 chunks",
               compile_step=30.87, rollout=48.84, old_logprobs=0.0, update=26.37, step=75.22,
               tok_s=318.27, gen_tok_s=50.16, mfu=0.29, peak_rss_gib=10.7)
    row.update(changes)
    return row


def test_printed_rows_read_back(step):
    rows = [_row(), _row(algo="ppo", old_logprobs=7.99, update=54.77, step=110.62)]
    stdout = "\n".join(["devices: [CpuDevice(id=0)]; f32 2048^3 matmul peak: 403.7 GFLOP/s",
                        " | ".join(step.COLUMNS), *map(step.format_row, rows), "",
                        "sokoban_cpu.py: smollm2-135m-instruct (sokoban, grpo, B=32, L=1288):",
                        "| phase | seconds | real tokens | tokens/s | useful GFLOP | MFU |"])
    parsed = step.parse_rows(stdout)
    assert [r["algo"] for r in parsed] == ["grpo", "ppo"]
    for got, want in zip(parsed, rows):
        for key in ("compile_step", "rollout", "old_logprobs", "update", "step", "mfu",
                    "peak_rss_gib"):
            assert got[key] == pytest.approx(want[key], abs=0.005)
        assert got["knobs"] == want["knobs"]  # commas inside a field do not split it


def test_an_older_commits_output_reads(step):
    # 4eb1311's experiments/bench_step.py printed this (results/cpu/bench/).
    stdout = (" | ".join(step.COLUMNS) + "\n"
              "sokoban_cpu.py: smollm2-135m-instruct | sokoban | grpo | 32 | 1288 | 5 | 16 | mb 4, "
              "remat False, float32 cache, 2 chunks | 20.36 | 47.72 | 0.00 | 47.58 | 95.30 | "
              "251.21 | 51.35 | 0.22 | 13.52\n\n")
    (row,) = step.parse_rows(stdout)
    assert (row["rollout"], row["update"], row["step"]) == (47.72, 47.58, 95.30)


def test_output_without_the_header_is_an_error(step):
    with pytest.raises(ValueError):
        step.parse_rows("Traceback (most recent call last):\n  ...\nMemoryError\n")


def test_suite_is_target_one_matrix(step):
    configs = [step._read_config(name, sets) for name, sets in step.SUITE]
    matrix = {(c.env.name, c.algo, c.lora.rank > 0) for c in configs}
    assert len(configs) == len(matrix) == 8
    assert {env for env, _, _ in matrix} == {"sokoban", "frozen_lake"}
    for c in configs:  # the suite's shape: 4 x 8 rollouts, 16-token NoThink replies
        assert (c.rollout.groups, c.rollout.group_size, c.rollout.reply_tokens, c.nothink) == (
            4, 8, 16, True)


def _auto_config():
    """The tiny run config with one memory knob, optim.micro_batches, left for autofit."""
    c = tiny_config()
    c.rollout.update(cache_dtype="float32", chunks=1)
    c.optim.update(remat=False, micro_batches=None)
    return c


def test_compile_only_of_a_config_reports_autofits_choice_and_its_plan(step):
    c = _auto_config()
    row = step.compile_config("tiny.py", c, available=lambda: 2**40)
    # Room for anything: the fastest setting (one micro-batch), one compile, its plan.
    assert row["knobs"] == "mb 1, remat False, float32 cache, 1 chunks"
    assert row["chosen"] == "optim.micro_batches" and row["compiled"] == 1
    assert 0 < row["needed_gib"] < row["available_gib"] == 1024
    assert (row["model"], row["B"]) == ("tiny.py: tiny-random",
                                        c.rollout.groups * c.rollout.group_size)
    # No room: fails as run.py would, naming the knob it tried and the settings that shrink it.
    with pytest.raises(MemoryError, match="optim.micro_batches="):
        step.compile_config("tiny.py", _auto_config(), available=lambda: 2**20)
