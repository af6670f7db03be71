"""Session-wide set-up: fixtures slow to build (made once for every test module), one XLA
compilation cache per test session, and the order in which xdist hands out test files."""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import pytest

# Test files in descending order of their measured time (per-file sums of the test times in a
# CI run's `--junitxml` report, the slow 2-core machine, 2026-11-28), handed to the xdist
# workers first (`--no-loadscope-reorder` in pyproject.toml keeps this order): the last file a
# worker takes is then a short one and the two workers end together. Files not listed follow
# in collection order.
HEAVY_FIRST = ("test_sft.py", "test_context_window.py", "test_first_hour.py",
               "test_notebooks.py", "test_demonstrations_text.py", "test_text_free.py",
               "test_sweep.py", "test_shared_prefix.py", "test_faults.py", "test_evaluation.py",
               "test_openenv.py",
               "test_faithful.py", "test_filtering.py", "test_credit.py", "test_run.py",
               "test_gradient_analysis.py", "test_ragen2_switches.py",
               "test_host_rollout.py", "test_gguf.py", "test_text_env_states.py", "test_train.py",
               "test_rollout.py",
               "test_parse_hostile.py", "test_text_parse.py", "test_api.py", "test_export.py",
               "test_autofit.py", "test_countdown.py", "test_sampling.py", "test_registry.py",
               "test_decoder.py", "test_bad_inputs.py", "test_memory.py",
               "test_sampler_weights.py", "test_lora.py", "test_text_render.py",
               "test_failures.py", "test_host_train.py")
_CACHE = pytest.StashKey[str]()

# The suite is compile-bound: tiny models, whose XLA CPU code generation is most of a test's
# time. So tests compile fast, the same HLO programs with less LLVM optimisation:
# - every test: LLVM level 0 (JAX's `jax_disable_most_optimizations`), ~2.2x less compile
#   time than XLA's default and code ~3x slower to run;
# - tests marked `optimized` (their time is running: the real SmolLM2, many steps, long
#   subprocess runs): LLVM level 1 with XLA's classic elemental emitters, a third less
#   compile time than the default and code as fast.
# Set before any test starts XLA; subprocesses inherit both. A user's own choice is kept.
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=1", "--xla_cpu_use_fusion_emitters=false")
_flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join(
    [f for f in FAST_COMPILE_FLAGS if f.split("=")[0] not in _flags] + [_flags]).strip()
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")


def pytest_configure(config: pytest.Config) -> None:
    """One persistent XLA compilation cache for the session, shared by the xdist workers and
    the subprocesses tests start (run.py, notebooks' kernels inherit the environment): a program
    compiled by one test is loaded, not compiled again, by the next (JAX's cache key is the
    program, its options and the versions, so results are unchanged). Steps with host
    callbacks (the phase clock) are never cached by JAX. A cache dir set by the user is kept."""
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        path = tempfile.mkdtemp(prefix="starpo-jax-tests-xla-")
        os.environ["JAX_COMPILATION_CACHE_DIR"] = path
        config.stash[_CACHE] = path  # the process that made it removes it
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # even tiny jits


def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.stash.get(_CACHE, None)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


# `-m "serial ..."` selects only tests marked serial (the README's second test command): a test
# file that marks none is then not imported (collecting all of them took ~20 s of that command).
_SERIAL_ONLY = re.compile(r"serial(\s+and\b.*)?")


def pytest_ignore_collect(collection_path, config: pytest.Config) -> bool | None:
    expr = (config.getoption("markexpr", "") or "").strip()
    if (_SERIAL_ONLY.fullmatch(expr) and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_")
            and "mark.serial" not in collection_path.read_text(encoding="utf-8")):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable within a file


@pytest.fixture(autouse=True)
def _optimized_when_marked(request, monkeypatch):
    """Tests marked `optimized`, `serial` or `slow` (their time is running real work, not
    compiling) compile with XLA's optimisations (see above)."""
    if not any(request.node.get_closest_marker(m) for m in ("optimized", "serial", "slow")):
        yield
        return
    import jax

    before = jax.config.values["jax_disable_most_optimizations"]
    monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "0")  # and their subprocesses
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


@pytest.fixture(scope="session")
def smollm2_tok():
    """The embedded SmolLM2 tokenizer (also tiny-random's)."""
    from helpers.text_testing import smollm2_tokenizer

    return smollm2_tokenizer()


@pytest.fixture(scope="session")
def qwen_style_tok():
    """A Qwen2-style byte-level BPE trained on the grids and instructions of every registered
    env."""
    import envs_jax
    from helpers.text_testing import qwen_style_tokenizer

    envs = [envs_jax.make(name) for name in envs_jax.names()]
    return qwen_style_tokenizer(
        tuple(e.symbol_strings for e in envs), tuple(e.instructions for e in envs)
    )
