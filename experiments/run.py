"""Train StarPO / StarPO-S from a config file, writing everything under a workdir.

    python experiments/run.py --config bandit_grpo.py --workdir runs/bandit
    python experiments/run.py --config sokoban_ppo.py --config.steps=50 \
        --config.rollout.group_size=8 --workdir runs/sokoban
    python experiments/run.py --config sokoban_ppo.py --workdir runs/sokoban --resume

A bare config name resolves to experiments/configs/; keys and switches are documented in
starpo_jax.api.default_config. The flags and the config are checked before JAX and the envs are
imported (run_config.check_config): a bad key or value is its one line in a fraction of a
second. Then starpo_jax.run.loop.run trains it (starpo_jax.run.loop's docstring: the workdir's
files, --resume, SIGINT / SIGTERM, the memory check and the faults, each one line on stderr and
exit 1). A host env (envs_host, named like any env; a user's own module of envs by
`--config.env.module=mypkg.envs`) trains through starpo_jax.run.host_train. Multi-process
(multi-host) runs start with starpo_jax.run.distributed.maybe_initialize (the
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID variables, or SLURM / Open MPI).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from starpo_jax.compile_cache import use_compile_cache  # noqa: E402
from starpo_jax.hostmem import reexec_with_huge_pages  # noqa: E402

if __name__ == "__main__":
    reexec_with_huge_pages()  # first: huge pages for XLA's CPU buffers (starpo_jax/hostmem.py)
    use_compile_cache()  # before JAX loads: starpo_jax/compile_cache.py

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from starpo_jax.run import cli, schema as run_config  # noqa: E402
from starpo_jax.run.cli import CONFIG_DIR  # noqa: E402
from starpo_jax.run.distributed import distributed_arguments, maybe_initialize  # noqa: E402
from starpo_jax.run.workdir import RunFault  # noqa: E402

ERRORS = (ValueError, FileNotFoundError, MemoryError, RunFault, FileExistsError)
_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (a bare name resolves to "
                                          "experiments/configs/).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics, events and checkpoints.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue from the newest checkpoint in --workdir.")
_PARSED: list[str] | None = None  # the arguments left by cli.parse_first, run as a script

if __name__ == "__main__":
    # First, in a multi-process run: jax.distributed must be initialised before any JAX
    # computation, and some imports compute (jumanji's; a user's env module, which the config
    # check imports, may use it). A single process imports nothing heavy here.
    try:
        if distributed_arguments(os.environ) is not None:
            maybe_initialize()
    except ValueError as error:  # a bad JAX_* variable: the message names it
        sys.exit(f"error: {error}")
    # Then the flags and the config are checked before JAX and the envs load (seconds): a bad
    # key or value is its one line at once (the estimator's checks come with api.train_config).
    _PARSED = cli.parse_first(
        lambda: _CONFIG.value is None or run_config.check_config(_CONFIG.value),
        cli.resolve_config_arg(sys.argv, CONFIG_DIR), errors=ERRORS, config_dir=CONFIG_DIR)

from starpo_jax.run import loop as runner  # noqa: E402


def _main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required")
    if _CONFIG.value is None:
        raise app.UsageError("--config is required (a config file, e.g. bandit_grpo.py)")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax's INFO lines would bury the progress
    runner.run(_CONFIG.value, _WORKDIR.value, resume=_RESUME.value,
               config_file=flags.FLAGS["config"].config_filename)


def main() -> None:
    cli.run_app(_main, cli.resolve_config_arg(sys.argv, CONFIG_DIR), errors=ERRORS,
                config_dir=CONFIG_DIR, parsed=_PARSED)


if __name__ == "__main__":
    main()
