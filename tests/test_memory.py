"""The memory check: XLA's plan of a compiled program, the free memory, and the run's verdict."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from jax._src import monitoring  # noqa: E402

from starpo_jax import api  # noqa: E402
from starpo_jax.sizing import memory  # noqa: E402
from helpers.tiny import tiny_config  # noqa: E402

N = 256


def test_host_available_bytes_reads_meminfo(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text("MemTotal:       24684132 kB\nMemFree:  1 kB\nMemAvailable:   16104428 kB\n")
    assert memory.host_available_bytes(path) == 16104428 * 1024
    path.write_text("MemTotal:       24684132 kB\n")
    assert memory.host_available_bytes(path) is None
    assert memory.host_available_bytes(tmp_path / "missing") is None


def test_plan_counts_arguments_outputs_and_temporaries_once():
    x = jnp.ones((N, N), jnp.float32)
    square = 4 * N * N
    plain = jax.jit(lambda a: jnp.tanh(a @ a) @ a).lower(x).compile()
    donated = jax.jit(lambda a: jnp.tanh(a @ a) @ a, donate_argnums=0).lower(x).compile()
    m = plain.memory_analysis()
    assert (m.argument_size_in_bytes, m.output_size_in_bytes) == (square, square)
    assert memory.plan_bytes(plain) == m.temp_size_in_bytes + 2 * square
    d = donated.memory_analysis()
    # A donated argument's buffer is the output's: counted once.
    assert memory.plan_bytes(donated) == d.temp_size_in_bytes + 2 * square - d.alias_size_in_bytes


def test_step_plan_scales_by_local_devices_and_reads_the_budget():
    f = jax.jit(lambda a: a @ a)
    x = jnp.ones((N, N), jnp.float32)
    plan = memory.step_plan(f, x, available=lambda: 123)
    assert plan.needed == memory.plan_bytes(f.lower(x).compile()) * jax.local_device_count()
    assert (plan.available, plan.where, plan.fits) == (123, "host RAM", False)
    assert memory.MemoryPlan(10, None, "host RAM").fits  # unknown budget: not checked
    assert str(memory.MemoryPlan(3 * 2**30, 2**31, "host RAM")) == \
        "3.0 GiB needed, 2.0 GiB host RAM available"


def _compiles_during(fn) -> list[str]:
    """The XLA compilations that happen while fn() runs."""
    events: list[str] = []

    def listen(name, _secs, **_):
        if name.endswith("backend_compile_duration"):
            events.append(name)

    monitoring.register_event_duration_secs_listener(listen)
    try:
        fn()
    finally:
        monitoring.unregister_event_duration_listener(listen)
    return events


def test_check_memory_stops_a_step_that_cannot_fit():
    config = tiny_config()
    config.rollout.group_size = 4  # a shape no other test compiles: this test sees the compile
    # Every memory knob set (none chosen: tests/test_autofit.py)
    config.optim.update(micro_batches=1, remat=False)
    config.rollout.update(cache_dtype="float32", chunks=1)
    exp = api.build(config)
    with pytest.raises(MemoryError) as error:
        api.check_memory(exp, available=lambda: 1024)
    message = str(error.value)
    assert "GiB needed, 0.0 GiB host RAM available" in message
    for knob in ("optim.micro_batches (now 1", "optim.remat=True", "rollout.cache_dtype",
                 "rollout.chunks", "check_memory=False"):
        assert knob in message
    # Another process short of memory stops this one too.
    with pytest.raises(MemoryError, match="on another process"):
        api.check_memory(exp, anywhere=lambda flag: True, available=lambda: 2**50)
    plan = api.check_memory(exp, available=lambda: 2**50)
    assert plan.fits and plan.needed > 0
    assert _compiles_during(exp.step) == []  # the step runs the executable the check compiled


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_release_freed_heap_hands_freed_pages_back():
    # 500 MB of 64 KiB blocks; every other one freed leaves 250 MB of holes between kept
    # blocks, which glibc keeps (none is at the heap's top, so nothing is trimmed on its own).
    blocks = [b"\1" * 65536 for _ in range(8000)]
    del blocks[::2]
    held = _rss()
    if not memory.release_freed_heap():
        pytest.skip("not glibc")
    assert held - _rss() > 200 * 2**20
    assert len(blocks) == 4000
