"""The sharded step splits the work: over 4 fake CPU devices ("fsdp" = 4) each device holds a
quarter of the rows' KV cache and activations (XLA's memory plan of the compiled step, and the
per-device cache shape in its optimised HLO), and the step still gives the single-device numbers.

The measurement is experiments/bench/sharding.py's, run in a subprocess that starts JAX with 4
fake devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
ROWS, DEVICES = 64, 4


@pytest.fixture(scope="module")
def measured() -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "JAX_PLATFORMS": "cpu", "PJRT_NPROC": "8",
           "JAX_DISABLE_MOST_OPTIMIZATIONS": "0",  # conftest's fast-compile mode: these run long
           # As in test_train's sharded test: a loaded machine can delay a collective past
           # XLA's default timeout without a bug.
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES}"
                        " --xla_cpu_collective_call_terminate_timeout_seconds=600"
                        " --xla_cpu_collective_timeout_seconds=600",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    # Two mini-batches of 32 rows, each in two micro-batches of 16: the update's mini-batch and
    # micro-batch splits are both exercised. Temperature 0.03: every draw robust to rounding
    # (the random model is nearly uniform; see bench/sharding's docstring), the policy not so
    # sharp that its gradients vanish.
    script = ROOT / "experiments" / "bench" / "sharding.py"
    command = [sys.executable, str(script), "--json", "--run", "--rows", str(ROWS),
               "--devices", str(DEVICES), "--minibatch-rows", "32", "--micro-batches", "2",
               "--temperature", "0.03"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT", 1)[1])


@pytest.mark.serial
@pytest.mark.slow  # the slow tier (README)
def test_kv_cache_rows_split_over_devices(measured):
    # Per-device shapes in the optimised HLO: the group cache (P rows) and the rows' cache (B).
    groups = ROWS // 4
    assert measured["single"]["cache_rows"] == [groups, ROWS]
    assert max(measured["sharded"]["cache_rows"]) == ROWS // DEVICES
    assert measured["sharded"]["cache_rows"] == [groups // DEVICES, ROWS // DEVICES]


@pytest.mark.serial
@pytest.mark.slow  # the slow tier (README)
def test_per_device_memory_is_about_a_quarter(measured):
    single, sharded = measured["single"], measured["sharded"]
    # Temporaries (KV cache, activations, logits) dominate at this shape; each device keeps its
    # quarter plus the weights gathered for compute.
    assert sharded["temp_bytes"] < 0.4 * single["temp_bytes"], (sharded, single)
    # Weights and optimiser state are stored sharded (FSDP on "embed").
    assert sharded["argument_bytes"] < 0.3 * single["argument_bytes"], (sharded, single)
    assert sharded["cache_bytes"] * DEVICES == single["cache_bytes"]


@pytest.mark.serial
@pytest.mark.slow  # the slow tier (README)
def test_sharded_step_equals_single_device(measured):
    metrics = measured["metrics"]
    for key, (single, sharded) in metrics.items():
        np.testing.assert_allclose(sharded, single, rtol=2e-3, atol=2e-4, err_msg=key)
    # Adam moves each weight by ~lr whatever its gradient's size, so a gradient component near 0
    # whose sign rounding flips ends 2 lr apart per update (two updates here); a real difference
    # (other rows, a lost shard) would move most weights.
    for name in ("actor", "critic"):
        assert metrics[f"{name}/skipped_updates"] == [0.0, 0.0], name
        assert measured[f"{name}_max_step"] > measured[f"{name}_lr"] / 2, f"{name} did not learn"
        assert measured[f"{name}_max_abs_diff"] <= 4.01 * measured[f"{name}_lr"], name
        assert measured[f"{name}_share_diff_over_1e-7"] < 0.01, name
