"""starpo_jax/xla_cpu.py: the YNNPACK elementwise-fusion flag is added to XLA_FLAGS at import,
keeps a user's choice, and really reaches XLA (a fresh process's compiled program)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from starpo_jax import xla_cpu

ROOT = Path(__file__).resolve().parents[1]
FLAG = f"{xla_cpu.YNN_FUSION}={xla_cpu.YNN_TYPES}"


def test_the_flag_is_appended_once_and_a_users_own_is_kept():
    env = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}
    assert xla_cpu.add_cpu_flags(env, jaxlib=(0, 10))
    assert env["XLA_FLAGS"] == f"--xla_cpu_enable_fast_math=false {FLAG}"
    assert not xla_cpu.add_cpu_flags(env, jaxlib=(0, 10))  # no second copy
    assert env["XLA_FLAGS"].count(xla_cpu.YNN_FUSION) == 1
    empty = {}
    assert xla_cpu.add_cpu_flags(empty, jaxlib=(0, 11)) and empty["XLA_FLAGS"] == FLAG
    own = {"XLA_FLAGS": f"{xla_cpu.YNN_FUSION}="}  # the user's: YNNPACK off
    assert not xla_cpu.add_cpu_flags(own, jaxlib=(0, 10))
    assert own["XLA_FLAGS"] == f"{xla_cpu.YNN_FUSION}="
    off = {xla_cpu.OPT_OUT: "0"}
    assert not xla_cpu.add_cpu_flags(off, jaxlib=(0, 10)) and "XLA_FLAGS" not in off
    other = {}  # a jaxlib it was not measured on, where XLA might not know the flag
    assert not xla_cpu.add_cpu_flags(other, jaxlib=(0, 12)) and "XLA_FLAGS" not in other
    # several devices or processes: XLA 0.10 cannot compile some partitioned programs with it
    for several in ({"XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
                    {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, {"SLURM_NTASKS": "2"},
                    {"OMPI_COMM_WORLD_SIZE": "8"}):
        before = dict(several)
        assert not xla_cpu.add_cpu_flags(several, jaxlib=(0, 10)) and several == before
    one = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1", "SLURM_NTASKS": "1"}
    assert xla_cpu.add_cpu_flags(one, jaxlib=(0, 10))


def test_a_process_can_start_without_the_added_flag():
    """bench/step.py --against runs an older commit's code with the flags it had: the user's
    own stay, the added one goes (also from a child's inherited copy)."""
    env = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false", "HOME": "/h"}
    xla_cpu.add_cpu_flags(env, jaxlib=(0, 10))
    inherited = dict(env)  # what a re-executed child sees: the flag and its marker
    assert not xla_cpu.add_cpu_flags(inherited, jaxlib=(0, 10))
    for start in (env, inherited):
        assert xla_cpu.environ_without_added_flags(start) == {
            "XLA_FLAGS": "--xla_cpu_enable_fast_math=false", "HOME": "/h"}
    own = {"XLA_FLAGS": FLAG}  # the same value set by the user: not ours to remove
    assert xla_cpu.environ_without_added_flags(own) == own


_PROBE = """
import starpo_jax, jax, jax.numpy as jnp
text = jax.jit(lambda a: jnp.exp(a) * 2.0 + 1.0).lower(jnp.ones((64, 64))).compile().as_text()
print("ynn" if "__ynn_fusion" in text else "xla")
"""


@pytest.mark.parametrize("opt_out,expected", [(None, "ynn"), ("0", "xla")])
def test_importing_the_package_reaches_xla(opt_out, expected):
    """In a fresh process (XLA reads XLA_FLAGS once): an elementwise program compiles to a
    YNNPACK fusion after `import starpo_jax`, and to XLA's own loop with the opt-out."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", xla_cpu.OPT_OUT)}
    if opt_out is not None:
        env[xla_cpu.OPT_OUT] = opt_out
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == expected
