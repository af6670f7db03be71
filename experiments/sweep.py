"""Seeded sweeps: every combination of a grid of config overrides, times seeds.

    python experiments/sweep.py --config bandit_grpo.py --grid 'filter.keep_ratio=0.25,1.0' \
        --grid 'loss.kl_coef=0,0.001' --seeds 0,1,2 --workdir sweeps/keep_ratio --config.steps=20

--config and --config.a.b=value work as in run.py (the config's own `seed` is replaced by each
of --seeds). Each setting is one compile; its seeds run in one vmapped program (--no-vmap, or a
setting whose step cannot be vmapped or would not fit in memory: one seed after another with
the same compiled step). The workdir gets:

    runs/<setting>/seed_<s>.json  one finished run: its config and metrics per step, written
                                  when the run completes; a re-run with the same workdir skips
                                  it (and refuses it if the config it was run with differs)
    results.csv                   one row per (setting, seed, step): the swept keys, seed, step
                                  and every metric; the same command gives the same bytes
    plots/<metric>.png            reward mean and std, entropy, grad norm, success over steps:
                                  per setting the mean over seeds and a min-max band
    summary.txt                   per setting, mean +- std over seeds of the final-steps mean
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

from starpo_jax.run import cli  # noqa: E402
from starpo_jax.run.cli import CONFIG_DIR  # noqa: E402


def _help() -> str:
    """The --help page."""
    return cli.help_page(
        "python experiments/sweep.py --config CONFIG --workdir DIR [--grid KEY=V1,V2 ...] "
        "[--seeds S,S ...]",
        "Runs every combination of a grid of config values, each for every seed, and writes\n"
        "results.csv, plots/ and summary.txt under the workdir (a re-run skips finished runs).",
        ["python experiments/sweep.py --config quickstart --grid filter.keep_ratio=0.25,1.0 \\",
         "    --seeds 0,1 --workdir sweeps/keep_ratio"],
        [("--config CONFIG", "a config file, or a shipped config's name (below; .py optional)"),
         ("--workdir DIR", "where the sweep writes (required)"),
         ("--grid KEY=V1,V2", "a config key and its values; repeat for more keys"),
         ("--seeds 0,1,2", "the seeds each setting runs with (default: 0)"),
         ("--no-vmap", "run a setting's seeds one after another, not in one program"),
         ("--final_steps N", "steps averaged at the end for summary.txt (default: 5)"),
         ("--config.KEY=VALUE", "set a config key for every run (as in run.py)"),
         ("--help, --helpshort", "this page")],
        configs=cli.shipped_configs(CONFIG_DIR, sft=False),
        more="Sweeps and the reproduction suite: docs/experiments.md; the keys: "
             "docs/configuration.md.")


if __name__ == "__main__":
    cli.show_help(sys.argv, _help)  # before the sweep's imports (seconds)

from starpo_jax.analysis import sweep as lib  # noqa: E402
from starpo_jax.analysis.sweep_run import resolve_config_arg, sweep  # noqa: E402


def main() -> None:
    from absl import app, flags, logging
    from ml_collections import config_flags

    config = config_flags.DEFINE_config_file("config", None, "Config file (a bare name resolves "
                                             "to experiments/configs/).", lock_config=True)
    workdir = flags.DEFINE_string("workdir", None, "Directory for runs, results.csv and plots.")
    grid = flags.DEFINE_multi_string("grid", [], "KEY=V1,V2,...: a config key and its values; "
                                     "repeat for more keys (every combination is run).")
    seeds = flags.DEFINE_string("seeds", "0", "Comma-separated seeds, e.g. 0,1,2.")
    vmap = flags.DEFINE_bool("vmap", True, "Run a setting's seeds in one vmapped program "
                             "(--no-vmap: one after another).")
    final = flags.DEFINE_integer("final_steps", 5, "Steps averaged at the end for the summary.")

    def _main(argv: list[str]) -> None:
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        if not workdir.value:
            raise app.UsageError("--workdir is required")
        if config.value is None:
            raise app.UsageError("--config is required (a config file, e.g. bandit_grpo.py)")
        if final.value < 1:
            raise app.UsageError(f"--final_steps={final.value}: must be >= 1")
        if not flags.FLAGS["verbosity"].present:
            logging.set_verbosity(logging.WARNING)
        sweep(config.value, grid.value, lib.parse_seeds(seeds.value), Path(workdir.value),
              vmap=vmap.value, final_steps=final.value)

    # A grid, config or model mistake: one line.
    cli.run_app(_main, resolve_config_arg(sys.argv), config_dir=CONFIG_DIR, usage=_help)


if __name__ == "__main__":
    main()
