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
    env.pop("PJRT_NPROC", None)  # run.distributed sets it (1): what a user's run gets
    env.update(distributed, HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu",
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


# --- the pieces of one iteration, every case, in three layouts ----------------------------------

CASE_SCRIPT = ROOT / "tests" / "helpers" / "multihost_case.py"
CASES = "ppo_full,grpo_full,ppo_lora,grpo_lora"
PER_TOKEN = ("behaviour_logp", "advantages", "returns", "old_values", "old_logp")


def _case_run(out: Path, devices: int, tp: int = 1, **distributed: str) -> subprocess.Popen:
    """tests/helpers/multihost_case.py over CASES in a process of `devices` CPU devices (with
    `distributed`: one of several processes), with the environment a user's run.py gets."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_", "SLURM_", "OMPI_", "PJRT_"))}
    env.update(distributed, HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}"
                         " --xla_backend_optimization_level=1"
                         " --xla_cpu_collective_timeout_seconds=600",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), *sys.path]))
    return subprocess.Popen([sys.executable, str(CASE_SCRIPT), str(out), CASES, str(tp)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _assert_same_iteration(got: dict, want: dict, lr: float = 1e-3) -> None:
    """One iteration's pieces equal within float32 reduction-order rounding: the sampled tokens
    exactly; log-probs, values, advantages and returns at the reply tokens; every update
    metric (the grad norms, values_mean, vf_loss, ...); the gradients, as AdamW's moments after
    its first step hold them (mu = 0.1 g, nu = 0.001 g^2, g clipped by its global norm), within
    2e-4 of each tensor's largest (GRPO's entropy-only gradients here are sums that cancel to
    ~1e-9: seen 2e-5 of the largest apart); and the parameters after the update, within
    AdamW's step (~lr * g / |g|: where a gradient is rounding itself, its sign and so the step
    may flip)."""
    assert got.keys() == want.keys(), set(got) ^ set(want)
    for key in sorted(want):
        case, name = key.split(":", 1)
        a, b = got[key], want[key]
        if name in ("tokens", "loss_mask", "kept_mask"):
            np.testing.assert_array_equal(a, b, err_msg=key)
        elif name in PER_TOKEN:
            mask = want[f"{case}:{'loss_mask' if name == 'behaviour_logp' else 'kept_mask'}"]
            np.testing.assert_allclose(a[mask], b[mask], rtol=1e-5, atol=2e-6, err_msg=key)
        elif name.startswith("metric/"):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=key)
        elif name.startswith(("actor_opt", "critic_opt")):  # AdamW's count, mu and nu
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-4 * np.abs(b).max(),
                                       err_msg=key)
        else:  # a parameter after the update
            assert np.abs(a.astype(np.float64) - b).max() <= 2.5 * lr, key
    for case in CASES.split(","):
        # PPO's advantages (return - value) move the policy; GRPO's, all 0 at equal rewards,
        # leave its entropy bonus: a gradient of ~5e-6, not none.
        floor = 1e-3 if case.startswith("ppo") else 1e-7
        assert want[f"{case}:metric/actor/grad_norm"] > floor, "a real gradient"
        if case.startswith("ppo"):
            assert want[f"{case}:metric/critic/grad_norm"] > 1e-3


def _load(path: Path) -> tuple[str, dict]:
    with np.load(path) as data:
        return str(data["layout"]), {k: data[k] for k in data.files if k != "layout"}


@pytest.mark.serial
@pytest.mark.slow
def test_every_case_on_two_processes_and_a_2x2_mesh_equals_one_device(tmp_path):
    """PPO and GRPO, full fine-tuning and LoRA: values, advantages, returns, log-probs, both
    grad norms and the parameters after the update of 2 processes (1 CPU device each, gloo),
    and of a 2 x 2 (fsdp x tp) mesh in one process, equal one device's. Before the sampler
    drew by the Gumbel-max trick (rollout.sampling.sample_tokens), one device's rollout picked
    another token id in one row than the other layouts (an inverse CDF's float32 cumulative sum
    over 49152 tokens rounded differently) and every later number differed (the issue's table:
    critic/values_mean 0.0531 against -0.0212); before the processes ran one intra-op thread
    each (starpo_jax.run.distributed), the 2-process PPO update aborted in gloo ("Received data
    size doesn't match expected size")."""
    address = f"127.0.0.1:{_free_port()}"
    multi, single, mesh = tmp_path / "multi.npz", tmp_path / "single.npz", tmp_path / "mesh.npz"
    _finish([_case_run(multi, 1, JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES="2",
                       JAX_PROCESS_ID=str(index)) for index in range(2)]
            + [_case_run(single, 1)], timeout=1500)
    _finish([_case_run(mesh, 4, tp=2)], timeout=1500)
    layout, want = _load(single)
    assert layout == "1 processes, 1 devices, tp 1"
    for path, expected in ((multi, "2 processes, 2 devices, tp 1"),
                           (mesh, "1 processes, 4 devices, tp 2")):
        layout, got = _load(path)
        assert layout == expected
        _assert_same_iteration(got, want)


def test_a_multi_process_cpu_run_orders_its_collectives(monkeypatch, capsys):
    """maybe_initialize's thread setting, on a copy of the environment: PJRT_NPROC=1, a user's
    other value replaced with a line saying why."""
    from starpo_jax.run.distributed import ordered_cpu_collectives

    environ = {}
    ordered_cpu_collectives(environ)
    assert environ == {"PJRT_NPROC": "1"} and capsys.readouterr().out == ""
    environ = {"PJRT_NPROC": "8"}
    ordered_cpu_collectives(environ)
    assert environ == {"PJRT_NPROC": "1"}
    assert "PJRT_NPROC=8 replaced by 1" in capsys.readouterr().out
