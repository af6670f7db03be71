"""starpo_jax.compile_cache: which cache directory the commands give JAX, and that a second
process loads the program the first compiled instead of compiling it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from starpo_jax import compile_cache as cc


def test_default_dir_is_under_the_projects_cache(tmp_path):
    environ = {"STARPO_JAX_CACHE": str(tmp_path)}
    assert cc.use_compile_cache(environ) == tmp_path / "xla"
    assert environ[cc.DIR_VARIABLE] == str(tmp_path / "xla")
    assert environ[cc.SIZE_VARIABLE] == str(cc.MAX_BYTES)  # filelock comes with transformers


def test_home_cache_without_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    environ: dict[str, str] = {}
    assert cc.use_compile_cache(environ) == tmp_path / ".cache" / "starpo_jax" / "xla"


@pytest.mark.parametrize("environ", [
    {cc.DIR_VARIABLE: "/somewhere/else"},  # the user's (the test suite's) directory is kept
    {cc.OPT_OUT: "0"},
])
def test_a_users_choice_is_kept(environ):
    before = dict(environ)
    assert cc.use_compile_cache(environ) is None
    assert environ == before


def test_a_users_size_bound_is_kept(tmp_path):
    environ = {"STARPO_JAX_CACHE": str(tmp_path), cc.SIZE_VARIABLE: "1000"}
    cc.use_compile_cache(environ)
    assert environ[cc.SIZE_VARIABLE] == "1000"


PROGRAM = """
import sys
from starpo_jax.compile_cache import use_compile_cache
use_compile_cache()
import jax, jax.numpy as jnp
hits = []
jax.monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name.endswith("/cache_hits") else None)
x = jax.jit(lambda x: jnp.cumsum(jnp.sin(x) * 3.0) @ x)(jnp.arange(64.0))
print(len(hits), float(x))
"""


def test_a_second_process_loads_the_first_ones_program(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in (cc.DIR_VARIABLE, cc.OPT_OUT)}
    env.update(STARPO_JAX_CACHE=str(tmp_path), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))

    def run() -> tuple[int, str]:
        out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                             text=True, timeout=120, check=True).stdout.split()
        return int(out[0]), out[1]

    hits, first = run()
    assert hits == 0
    assert any(p.name.endswith("-cache") for p in (tmp_path / "xla").iterdir())
    hits, second = run()
    assert hits >= 1  # the function, and any small program jnp ran for it
    assert second == first  # the loaded program computes what the compiled one did
