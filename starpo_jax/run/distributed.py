"""Multi-process (multi-host) start-up: one Python process per host, all running the same command.

    from starpo_jax.run.distributed import maybe_initialize
    process_index, process_count = maybe_initialize()
    from starpo_jax.run import experiment                          # only now: see below

jax.distributed must be initialised before any JAX computation, and importing some libraries
already computes (jumanji, hence envs_jax and starpo_jax.api, builds arrays at import time):
call maybe_initialize first thing, as experiments/run.py does (this module imports numpy, and
jax only when one of its functions needs it: distributed_arguments does not).

A run is multi-process when either
  * the three standard variables are set: JAX_COORDINATOR_ADDRESS (host:port of process 0),
    JAX_NUM_PROCESSES and JAX_PROCESS_ID (0 .. JAX_NUM_PROCESSES - 1); or
  * a cluster launcher that jax detects by itself started several tasks: SLURM (`srun`,
    SLURM_NTASKS > 1) or Open MPI (`mpirun`, OMPI_COMM_WORLD_SIZE > 1).
Otherwise nothing is initialised and the run is the usual single process (0, 1).

On CPU the processes exchange collectives through gloo (jax's config
`jax_cpu_collectives_implementation`), set here before the CPU backend starts, so a multi-process
CPU run works without further flags. Gloo pairs the processes' collectives in the order each
process issues them, and XLA:CPU orders a program's collectives only by a scheduling edge: the
next one may start on another thread of the intra-op pool before the previous one has, so two
processes can enter the same program's collectives in different orders. Where their sizes
differ gloo aborts ("Received data size doesn't match expected size": seen in the PPO update of
tests/test_multihost.py with 8 threads a process); where they agree the collectives would
exchange each other's data without a word. So a multi-process CPU run
gets one intra-op thread per process (PJRT_NPROC=1, set here before the CPU backend starts; a
user's other value is replaced, with a line saying so), which runs the collectives one after
the other in the program's order, and one CPU device per process (several would wait on each
other in a one-thread pool). GPUs issue collectives in order on their streams: unaffected.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

STANDARD_VARIABLES = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
CPU_COLLECTIVES = "gloo"
#: XLA:CPU's intra-op thread count in a multi-process run (see the module docstring).
CPU_THREADS = "1"


def _int(environ: Mapping[str, str], name: str, low: int) -> int:
    text = environ[name]
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise ValueError(f"{name}={text!r} is invalid; valid: an int >= {low}")
    return value


def _cluster_tasks(environ: Mapping[str, str]) -> int:
    """The number of tasks a SLURM or Open MPI launcher started (1 outside such a launcher).
    The variables are the ones jax's own cluster detection reads (jax._src.clusters)."""
    if "OMPI_MCA_orte_hnp_uri" in environ:
        return _int(environ, "OMPI_COMM_WORLD_SIZE", 1)
    slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
             "SLURM_LOCALID")
    if all(name in environ for name in slurm):
        return _int(environ, "SLURM_NTASKS", 1)
    return 1


def distributed_arguments(environ: Mapping[str, str]) -> dict[str, object] | None:
    """The jax.distributed.initialize keyword arguments `environ` asks for: the explicit ones of
    the standard variables, {} when a multi-task cluster launcher is detected (jax reads it
    itself), None for a single-process run. Raises ValueError when only some of the standard
    variables are set, naming the missing ones, or when a value is not a valid number."""
    given = [name for name in STANDARD_VARIABLES if environ.get(name)]
    if given:
        missing = [name for name in STANDARD_VARIABLES if name not in given]
        if missing:
            raise ValueError(f"{', '.join(given)} set but {', '.join(missing)} not: a "
                             f"multi-process run needs all of {', '.join(STANDARD_VARIABLES)}")
        count = _int(environ, "JAX_NUM_PROCESSES", 1)
        index = _int(environ, "JAX_PROCESS_ID", 0)
        if index >= count:
            raise ValueError(f"JAX_PROCESS_ID={index} is invalid; valid: 0 .. {count - 1} "
                             f"(JAX_NUM_PROCESSES={count})")
        return {"coordinator_address": environ["JAX_COORDINATOR_ADDRESS"],
                "num_processes": count, "process_id": index}
    return {} if _cluster_tasks(environ) > 1 else None


def maybe_initialize(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """Calls jax.distributed.initialize() when `environ` (default os.environ) describes a
    multi-process run (module docstring); returns (process_index, process_count). Must run
    before any JAX computation; a second call in the same process only reports."""
    import jax

    arguments = distributed_arguments(os.environ if environ is None else environ)
    if arguments is not None and not jax.distributed.is_initialized():
        # Before the backends start: the CPU client is built with the cross-process collectives
        # of this setting (without it, a CPU computation spanning processes cannot run), and
        # with one intra-op thread, which keeps every process's collectives in program order.
        jax.config.update("jax_cpu_collectives_implementation", CPU_COLLECTIVES)
        ordered_cpu_collectives(os.environ)
        jax.distributed.initialize(**arguments)
        cpu = [d for d in jax.local_devices() if d.platform == "cpu"]
        if jax.default_backend() == "cpu" and len(cpu) > 1:
            raise ValueError(f"{len(cpu)} CPU devices in this process (XLA_FLAGS "
                             "--xla_force_host_platform_device_count or jax_num_cpu_devices) is "
                             "invalid for a multi-process CPU run; valid: 1 (start one process "
                             "per device: starpo_jax.run.distributed's docstring says why)")
    return jax.process_index(), jax.process_count()


def ordered_cpu_collectives(environ: dict[str, str] | os._Environ) -> None:
    """Sets PJRT_NPROC (XLA:CPU's intra-op thread count, read when the CPU backend starts) to
    CPU_THREADS in `environ`, saying so when it replaces another value (module docstring)."""
    before = environ.get("PJRT_NPROC")
    if before is not None and before != CPU_THREADS:
        print(f"PJRT_NPROC={before} replaced by {CPU_THREADS}: a multi-process CPU run keeps "
              "each process's collectives in order with one intra-op thread "
              "(starpo_jax.run.distributed)", flush=True)
    environ["PJRT_NPROC"] = CPU_THREADS


def any_process(flag: bool) -> bool:
    """True if `flag` is True on any process (a collective: every process must call it, in the
    same order). Lets all processes agree to stop when only one got a signal or an alert,
    rather than the others waiting forever in the next step's collectives."""
    import jax

    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    return bool(multihost_utils.process_allgather(np.array(flag, np.int32)).any())


def min_over_processes(value: int) -> int:
    """The smallest of every process's `value` (a collective, like any_process): e.g. the free
    memory that all processes' memory settings are chosen against, so that they choose alike.
    Gathered as float32 (JAX's default width): exact to ~1e-7 of the value."""
    import jax

    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return int(multihost_utils.process_allgather(np.array(value, np.float32)).min())
