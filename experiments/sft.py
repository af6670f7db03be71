"""The SFT warm start from a config file, writing everything under a workdir (starpo_jax.run.sft).

    python experiments/sft.py --config sokoban_sft.py --workdir runs/sokoban_sft
    python experiments/sft.py --config sokoban_sft.py --config.sft.policy=mix \
        --workdir runs/sokoban_sft_mix      # policies: random, solver, mix
    python experiments/sft.py --config sokoban_sft.py --config.sft.data=demos.jsonl \
        --workdir runs/sokoban_sft_file
    python experiments/run.py --config sokoban_grpo.py \
        --config.model.init_from=runs/sokoban_sft --workdir runs/sokoban_rl

A bare config name resolves to experiments/configs/; keys are api.default_config's plus the
`sft` section (starpo_jax.run.sft.sft_default_config). The loop, the workdir's files (config.json,
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

if __name__ == "__main__":
    reexec_with_huge_pages()  # first: huge pages for XLA's CPU buffers (starpo_jax/hostmem.py)
    use_compile_cache()  # before JAX loads: starpo_jax/compile_cache.py

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from starpo_jax.run import cli, loop as runner  # noqa: E402
from starpo_jax.run.cli import CONFIG_DIR  # noqa: E402
from starpo_jax.run.workdir import RunFault  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (a bare name resolves to "
                                          "experiments/configs/).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics, events and checkpoints.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue from the newest checkpoint in --workdir.")


def _main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required")
    if _CONFIG.value is None:
        raise app.UsageError("--config is required (a config file, e.g. sokoban_sft.py)")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    runner.run_sft(_CONFIG.value, Path(_WORKDIR.value), resume=_RESUME.value,
                   config_file=flags.FLAGS["config"].config_filename)


def main() -> None:
    cli.run_app(_main, cli.resolve_config_arg(sys.argv, CONFIG_DIR),
                errors=(ValueError, FileNotFoundError, MemoryError, RunFault, FileExistsError),
                config_dir=CONFIG_DIR)


if __name__ == "__main__":
    main()
