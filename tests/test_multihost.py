"""Multi-process runs: starpo_jax.run.distributed's reading of the environment, and
experiments/run.py started as 2 local CPU processes (1 device each, gloo collectives, a shared
workdir) giving the
metrics of a plain single-device run of the same tiny config."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from starpo_jax import api  # noqa: E402
from starpo_jax.run import loop as runner  # noqa: E402
from starpo_jax.run.distributed import distributed_arguments  # noqa: E402
from helpers.tiny import tiny_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STEPS = 2
# The tiny config of helpers.tiny (bandit, tiny-random, groups=2 x group_size=2), 2 steps, with
# PPO: the tiny-random model answers no bandit prompt validly, so every reward is 0 and GRPO's
# advantages (and its gradient, ~1e-6 of rounding) are 0; PPO's critic makes the advantages
# (return - value) nonzero, so the gradient compared below is a real one.
CONFIG = f"""
from helpers.tiny import tiny_config  # tests/ is on the run's PYTHONPATH


def get_config():
    config = tiny_config()
    config.steps, config.algo = {STEPS}, "ppo"
    return config
"""
STANDARD = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4",
            "JAX_PROCESS_ID": "3"}
SLURM = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_PROCID": "0",
         "SLURM_LOCALID": "0"}


@pytest.mark.parametrize("environ, expected", [
    ({}, None),
    (STANDARD, {"coordinator_address": "10.0.0.1:1234", "num_processes": 4, "process_id": 3}),
    ({**SLURM, "SLURM_NTASKS": "2"}, {}),
    ({**SLURM, "SLURM_NTASKS": "1"}, None),
    ({"OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:5", "OMPI_COMM_WORLD_SIZE": "2"}, {}),
    ({"SLURM_JOB_ID": "7"}, None),  # an allocation, not a multi-task step
])
def test_distributed_arguments(environ, expected):
    assert distributed_arguments(environ) == expected


@pytest.mark.parametrize("environ, message", [
    ({"JAX_COORDINATOR_ADDRESS": "h:1"},
     "JAX_COORDINATOR_ADDRESS set but JAX_NUM_PROCESSES, JAX_PROCESS_ID not"),
    ({**STANDARD, "JAX_NUM_PROCESSES": "two"}, "JAX_NUM_PROCESSES='two' is invalid; valid: an int"),
    ({**STANDARD, "JAX_PROCESS_ID": "4"}, r"JAX_PROCESS_ID=4 is invalid; valid: 0 \.\. 3"),
    ({**SLURM, "SLURM_NTASKS": "-1"}, "SLURM_NTASKS='-1' is invalid; valid: an int >= 1"),
])
def test_distributed_arguments_reject(environ, message):
    with pytest.raises(ValueError, match=message):
        distributed_arguments(environ)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(config: Path, workdir: Path, devices: int, **distributed: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "SLURM_", "OMPI_"))}
    env.update(distributed, HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu",
               # XLA's CPU thread pool is sized by the core count: on a 2-core machine a device
               # blocked in a collective can starve the others; 8 threads avoid the deadlock.
               PJRT_NPROC="8",
               # A real hang fails in minutes instead of the default (much longer) waits.
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}"
                         " --xla_cpu_collective_timeout_seconds=600",
               PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    command = [sys.executable, str(ROOT / "experiments" / "run.py"), "--config", str(config),
               "--workdir", str(workdir)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _finish(processes: list[subprocess.Popen], timeout: float) -> list[str]:
    """Waits for every process (all are killed if one fails or the time runs out: the others
    would wait for it in a collective); returns their stdouts."""
    outputs = []
    try:
        for process in processes:
            stdout, stderr = process.communicate(timeout=timeout)
            assert process.returncode == 0, stderr[-3000:]
            outputs.append(stdout)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    return outputs


def _metrics(workdir: Path) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("timing/")}
            for line in lines]


@pytest.mark.serial  # cross-process collectives: alone after the parallel suite, as in test_train
@pytest.mark.slow  # the slow tier (README)
def test_two_processes_match_one(tmp_path):
    config = tmp_path / "tiny.py"
    config.write_text(CONFIG)
    single, multi = tmp_path / "single", tmp_path / "multi"
    address = f"127.0.0.1:{_free_port()}"
    processes = [_start(config, multi, devices=1, JAX_COORDINATOR_ADDRESS=address,
                        JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(index)) for index in range(2)]
    # Meanwhile the reference: the same config in this process, on one device (the
    # unsharded step), through the same runner.train.
    try:
        reference = tiny_config()
        reference.steps, reference.algo = STEPS, "ppo"
        runner.train(api.build(reference), single)
    finally:
        outputs = _finish(processes, timeout=600)

    assert "2 processes, 2 devices" in outputs[0]
    assert "step 2/2" in outputs[0] and "step" not in outputs[1], "only process 0 prints"
    one, two = _metrics(single), _metrics(multi)
    assert [row["step"] for row in two] == list(range(1, STEPS + 1)), "process 0 alone writes"
    assert one[0].keys() == two[0].keys()
    for a, b in zip(one, two):
        differ = {key: (b[key], a[key]) for key in a
                  if not np.allclose(b[key], a[key], rtol=2e-3, atol=2e-4)}
        assert not differ, f"step {a['step']}: 2 processes' vs 1 device's metrics {differ}"
        # Compared relatively too: the update (its gradients reduced across the processes) is
        # the single-device one.
        assert a["actor/grad_norm"] > 1e-3, "a real gradient, not rounding"
        np.testing.assert_allclose(b["actor/grad_norm"], a["actor/grad_norm"], rtol=2e-3)
    assert sorted(int(p.name) for p in (multi / "checkpoints").iterdir()
                  if p.name.isdigit()) == [1, 2], "both processes took part in each save"
