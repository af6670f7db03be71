"""XLA CPU settings starpo-jax adds to XLA_FLAGS when it is imported.

YNNPACK kernels for XLA's elementwise fusions: `--xla_cpu_experimental_ynn_fusion_type=
individual_dot,eltwise` (JAX 0.10's default is `individual_dot`, YNNPACK for single dots
only). The teacher-forced forward and backward of SmolLM2 is mostly matmuls, but what XLA's
own loops compute between them (norms, SiLU, softmax, residuals and their gradients) ran
slower than YNNPACK's kernels do it on the 2-core x86 CPUs measured here
(docs/performance.md, "XLA CPU flags"); the results differ by float rounding (the functions'
errors are within a few ulp either way, measured against float64).

The flag is set when `starpo_jax` is imported, before JAX creates its CPU backend (XLA reads
XLA_FLAGS once, as the first computation starts it): a process that ran a JAX computation
before importing starpo_jax keeps the settings it started with. A user's own value of the
flag is kept, `STARPO_JAX_XLA_FLAGS=0` adds nothing, and a jaxlib outside the versions it
was measured on (where the flag might not exist: XLA stops at an unknown flag) is left alone,
and so is a process set up for several CPU devices or processes (below: XLA 0.10 fails to
compile some partitioned programs with these fusions). Only computations on the CPU read these
flags; GPU programs are unchanged.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from collections.abc import Mapping, MutableMapping

OPT_OUT = "STARPO_JAX_XLA_FLAGS"
#: Set beside XLA_FLAGS to what add_cpu_flags added there (child processes inherit both).
ADDED = "STARPO_JAX_XLA_FLAGS_ADDED"
YNN_FUSION = "--xla_cpu_experimental_ynn_fusion_type"
YNN_TYPES = "individual_dot,eltwise"
#: jaxlib (major, minor) versions whose XLA has the flag and was measured with it.
MEASURED_ON = ((0, 10), (0, 11))


def _jaxlib_version() -> tuple[int, int] | None:
    try:
        major, minor = importlib.metadata.version("jaxlib").split(".")[:2]
        return int(major), int(minor)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def _several_devices(environ: Mapping[str, str]) -> bool:
    """Whether the process is set up for more than one CPU device or process: forced host
    devices (`--xla_force_host_platform_device_count=N`, N > 1) or a multi-process launch
    (run/distributed.py's variables). XLA 0.10 fails to compile some partitioned programs with
    YNNPACK elementwise fusions ("Instruction with unsupported layout in YNN fusion", a
    parameter in column-major layout), so those keep XLA's defaults."""
    flags = environ.get("XLA_FLAGS", "")
    count = re.search(r"--xla_force_host_platform_device_count=(\d+)", flags)
    if count and int(count.group(1)) > 1:
        return True
    tasks = ("JAX_NUM_PROCESSES", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")
    return bool(environ.get("JAX_COORDINATOR_ADDRESS")) or any(
        environ.get(name, "1").strip().isdigit() and int(environ[name]) > 1
        for name in tasks if name in environ)


def add_cpu_flags(environ: MutableMapping[str, str] | None = None,
                  jaxlib: tuple[int, int] | None = None) -> bool:
    """Append the YNNPACK fusion flag to XLA_FLAGS unless the user set it, opted out or runs
    another jaxlib; -> whether it was added. `jaxlib`: (major, minor), default the installed
    one."""
    environ = os.environ if environ is None else environ
    flags = environ.get("XLA_FLAGS", "")
    if environ.get(OPT_OUT, "1") == "0" or YNN_FUSION in flags or _several_devices(environ):
        return False
    if (jaxlib or _jaxlib_version()) not in MEASURED_ON:
        return False
    environ["XLA_FLAGS"] = f"{flags} {YNN_FUSION}={YNN_TYPES}".strip()
    environ[ADDED] = f"{YNN_FUSION}={YNN_TYPES}"
    return True


def environ_without_added_flags(environ: MutableMapping[str, str]) -> dict[str, str]:
    """A copy of `environ` without what add_cpu_flags added to XLA_FLAGS: for a process that
    should start with the flags it would have had without starpo_jax's (an older commit's
    benchmark run side by side; its own import may add its own)."""
    env = dict(environ)
    added = env.pop(ADDED, None)
    if added:
        env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if f != added)
    return env
