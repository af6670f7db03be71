"""The SFT warm start from a config file, writing everything under a workdir (starpo_jax.run.sft).

    python experiments/sft.py --config sokoban_sft.py --workdir runs/sokoban_sft
    python experiments/sft.py --config sokoban_sft.py --config.sft.policy=mix \
        --workdir runs/sokoban_sft_mix      # policies: random, solver, mix
    python experiments/sft.py --config sokoban_sft.py --config.sft.data=demos.jsonl \
        --workdir runs/sokoban_sft_file
    python experiments/run.py --config sokoban_grpo.py \
        --config.model.init_from=runs/sokoban_sft --workdir runs/sokoban_rl

A bare config name (`.py` optional) resolves to experiments/configs/; --workdir defaults to
runs/<config name> (cli.default_workdir) and is checked before the config file loads; --help
prints the user's page (_help). Keys are api.default_config's plus the `sft` section
(starpo_jax.run.sft.sft_default_config). The loop, the workdir's files (config.json,
metrics.jsonl, tensorboard/, checkpoints/, samples/), --resume, SIGINT / SIGTERM and the faults
are run.py's (starpo_jax.run.loop.train): this script only parses the flags and calls
starpo_jax.run.loop.run_sft, which builds an SFT experiment (its step is a supervised step; its
evaluations add val/sft/heldout/loss). An evaluation of the initial policy is printed before
step 1 (the "before" numbers), and with sft.write_demos > 0 that many demonstrations are
written to <workdir>/demos.jsonl first.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

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

from starpo_jax.run import cli  # noqa: E402
from starpo_jax.run.cli import CONFIG_DIR  # noqa: E402
from starpo_jax.run.workdir import RunFault  # noqa: E402

ERRORS = (ValueError, FileNotFoundError, MemoryError, RunFault, FileExistsError)
NO_CONFIG = "--config is required: a config file or a shipped config's name, e.g. sokoban_sft"
_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (a bare name resolves to "
                                          "experiments/configs/).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics, events and checkpoints "
                               "(default: runs/<config name>).")
_RESUME = flags.DEFINE_bool("resume", False, "Continue from the newest checkpoint in --workdir.")
_PARSED: list[str] | None = None  # the arguments left by cli.parse_first, run as a script
# The `sft` section's keys for the help page: (key, default, meaning); the defaults are
# starpo_jax.run.sft.SFT_DEFAULTS' (tests/test_help.py checks them).
SFT_KEYS = (
    ("sft.policy", "random", "the demonstrations' policy: random, solver or mix"),
    ("sft.solver_share", "0.5", "the share of solver turns under policy mix"),
    ("sft.data", '""', "a JSONL file of conversations to train on instead"),
    ("sft.heldout", "0.1", "the share of sft.data held out for val/sft/heldout/loss"),
    ("sft.write_demos", "0", "demonstrations written to <workdir>/demos.jsonl first"),
    ("sft.reply_format", "answer", "the replies: answer, or world_model (SPA's blocks)"),
)


def _help() -> str:
    """The --help page."""
    shared = ("steps", "seed", "env.name", "model.source", "rollout.groups",
              "rollout.reply_tokens", "optim.actor_lr", "lora.rank", "eval_every")
    return cli.help_page(
        "python experiments/sft.py --config CONFIG [--workdir DIR] [--resume] "
        "[--config.KEY=VALUE ...]",
        "The SFT warm start: trains the model on an env's demonstrations (or a JSONL file of\n"
        "conversations), so that RL starts from a model that answers in format.",
        ["python experiments/sft.py --config sokoban_sft          # writes under runs/sokoban_sft",
         "python experiments/run.py --config sokoban_cpu --config.model.init_from=runs/sokoban_sft"
         ],
        cli.TRAIN_FLAGS,
        configs=cli.shipped_configs(CONFIG_DIR, sft=True),
        keys=[row for row in cli.common_keys() if row[0] in shared] + list(SFT_KEYS),
        more="Every key, its default and what it does: docs/configuration.md; SFT: "
             "docs/models.md#sft-warm-start.\nRL runs: python experiments/run.py --help.")


def _check() -> None:
    if _CONFIG.value is None:
        raise app.UsageError(NO_CONFIG)


if __name__ == "__main__":
    # The help page and the workdir's checks come before the flags are parsed: parsing them
    # loads the config file, and an SFT config's module imports JAX.
    _PARSED = cli.parse_first(_check, cli.resolve_config_arg(sys.argv, CONFIG_DIR),
                              errors=ERRORS, config_dir=CONFIG_DIR, usage=_help, workdir=True)

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
        logging.set_verbosity(logging.WARNING)
    if not _WORKDIR.present and jax.process_index() == 0:
        print(f"--workdir not given: the run writes under {workdir} (the default, "
              f"{cli.RUNS_DIR}/<config name>)", flush=True)
    runner.run_sft(_CONFIG.value, Path(workdir), resume=_RESUME.value, config_file=config_file)


def main() -> None:
    cli.run_app(_main, cli.resolve_config_arg(sys.argv, CONFIG_DIR), errors=ERRORS,
                config_dir=CONFIG_DIR, parsed=_PARSED, usage=_help, workdir=True)


if __name__ == "__main__":
    main()
