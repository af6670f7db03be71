"""Train StarPO / StarPO-S from a config file, writing everything under a workdir.

    python experiments/run.py --config quickstart          # writes under runs/quickstart
    python experiments/run.py --config sokoban_ppo.py --config.steps=50 \
        --config.rollout.group_size=8 --workdir runs/sokoban
    python experiments/run.py --config sokoban_ppo.py --workdir runs/sokoban --resume

`--help` prints the user's page (_help: the flags, the shipped configs, the most used keys).
A bare config name (`.py` optional) resolves to experiments/configs/; keys and switches are
documented in starpo_jax.api.default_config. --workdir defaults to runs/<config name>
(cli.default_workdir). The workdir (a file, --resume of nothing, checkpoints without --resume,
a live run's lock: workdir.check_workdir), the flags and the config are checked before JAX and
the envs are imported (run_config.check_config): a bad key, value or workdir is its one line in
a fraction of a second. Then starpo_jax.run.loop.run trains it (starpo_jax.run.loop's
docstring: the workdir's files, --resume, SIGINT / SIGTERM, the memory check and the faults,
each one line on stderr and exit 1). A host env (envs_host, named like any env; a user's own
module of envs by `--config.env.module=mypkg.envs`) trains through starpo_jax.run.host_train.
Multi-process
(multi-host) runs start with starpo_jax.run.distributed.maybe_initialize (the
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID variables, or SLURM / Open MPI).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from starpo_jax.compile_cache import use_compile_cache  # noqa: E402
from starpo_jax.hostmem import reexec_with_huge_pages  # noqa: E402
from starpo_jax.xla_log import hide_slow_compile_alarm  # noqa: E402

if __name__ == "__main__":
    reexec_with_huge_pages()  # first: huge pages for XLA's CPU buffers (starpo_jax/hostmem.py)
    use_compile_cache()  # before JAX loads: starpo_jax/compile_cache.py
    hide_slow_compile_alarm()  # XLA's "Very slow compile?" block: starpo_jax/xla_log.py

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from starpo_jax.run import cli, schema as run_config  # noqa: E402
from starpo_jax.run.cli import CONFIG_DIR  # noqa: E402
from starpo_jax.run.distributed import distributed_arguments, maybe_initialize  # noqa: E402
from starpo_jax.run.workdir import RunFault  # noqa: E402

ERRORS = (ValueError, FileNotFoundError, MemoryError, RunFault, FileExistsError)
NO_CONFIG = "--config is required: a config file or a shipped config's name, e.g. quickstart"
_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (a bare name resolves to "
                                          "experiments/configs/).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics, events and checkpoints "
                               "(default: runs/<config name>).")
_RESUME = flags.DEFINE_bool("resume", False, "Continue from the newest checkpoint in --workdir.")
_PARSED: list[str] | None = None  # the arguments left by cli.parse_first, run as a script


def _help() -> str:
    """The --help page."""
    return cli.help_page(
        "python experiments/run.py --config CONFIG [--workdir DIR] [--resume] "
        "[--config.KEY=VALUE ...]",
        "Trains an LLM agent with StarPO-S (PPO or GRPO) on an env, as the config file says,\n"
        "writing its metrics, checkpoints and sample conversations under the workdir.",
        ["python experiments/run.py --config quickstart        # writes under runs/quickstart",
         "python experiments/run.py --config sokoban_cpu "
         "--config.model.init_from=runs/sokoban_sft",
         "python experiments/run.py --config quickstart --config.steps=20 --resume"],
        cli.TRAIN_FLAGS,
        configs=cli.shipped_configs(CONFIG_DIR, sft=False), keys=cli.common_keys(),
        more="Every key, its default and what it does: docs/configuration.md. SFT warm starts:\n"
             "python experiments/sft.py --help. Evaluate or export a run: experiments/"
             "evaluate.py,\nexperiments/export.py (--help). Getting started: docs/quickstart.md.")

def _check() -> None:
    """The flags' config, checked before JAX loads (the estimator's checks wait for it)."""
    if _CONFIG.value is None:
        raise app.UsageError(NO_CONFIG)
    run_config.check_config(_CONFIG.value)


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
    # The help page and the workdir's checks (a file, --resume of nothing, checkpoints without
    # --resume, a live run's lock) come before the flags are parsed.
    _PARSED = cli.parse_first(_check, cli.resolve_config_arg(sys.argv, CONFIG_DIR), errors=ERRORS,
                              config_dir=CONFIG_DIR, usage=_help, workdir=True)

from starpo_jax.run import loop as runner  # noqa: E402


def _main(argv: list[str]) -> None:
    import jax  # loaded with the runner

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None:
        raise app.UsageError(NO_CONFIG)
    config_file = flags.FLAGS["config"].config_filename
    workdir = _WORKDIR.value or cli.default_workdir(config_file)  # "" was refused by workdir_arg
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax's INFO lines would bury the progress
    if not _WORKDIR.present and jax.process_index() == 0:
        print(f"--workdir not given: the run writes under {workdir} (the default, "
              f"{cli.RUNS_DIR}/<config name>)", flush=True)
    runner.run(_CONFIG.value, workdir, resume=_RESUME.value, config_file=config_file)


def main() -> None:
    cli.run_app(_main, cli.resolve_config_arg(sys.argv, CONFIG_DIR), errors=ERRORS,
                config_dir=CONFIG_DIR, parsed=_PARSED, usage=_help, workdir=True)


if __name__ == "__main__":
    main()
