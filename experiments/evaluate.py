"""Evaluate a run's checkpoint on held-out initial states and the out-of-distribution envs.

    python experiments/evaluate.py --workdir runs/bandit
    python experiments/evaluate.py --workdir runs/sokoban --step 20 \
        --config.eval.episodes=64 --config.eval.envs=sokoban,sokoban_large
    python experiments/evaluate.py --workdir runs/sokoban --policy random   # or solver

The run's config.json gives the model, env, prompt, rollout settings and seed (hence the same
held-out initial states as the run's own evaluations); `--config.eval.<key>=value` overrides
its eval section (keys: starpo_jax.api.default_config), nothing else
(run_config.evaluated_config). starpo_jax.run.loop.evaluate_workdir restores the newest checkpoint
(or `--step`), prints a table, and writes in the workdir eval_step_<N>.json
({"step", "eval": the eval settings, "metrics": {"val/<env>/<mode>/<name>": value}}) and
samples/eval_step_<N>.txt (conversations of the first eval.samples initial states).
`--policy random|solver` plays that scripted policy on the same held-out states instead (no
checkpoint read; the rows beside a run's: loop.evaluate_policy_workdir), writing
eval_policy_<name>.json.
"""

from __future__ import annotations

import os
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
from starpo_jax.run.schema import default_config, evaluated_config  # noqa: E402


def _define_flags() -> None:
    # Defined inside cli's guard: config_flags applies the --config.* overrides as it
    # defines the flag, and a bad one is then its one line.
    config_flags.DEFINE_config_dict(
        "config", default_config(), "Overrides of the run's eval section: "
        "--config.eval.<key>=...")
    flags.DEFINE_string("workdir", None, "The run's workdir (experiments/run.py --workdir).")
    flags.DEFINE_integer("step", None, "Checkpoint step to evaluate (default: the newest).")
    flags.DEFINE_string("policy", None, "Evaluate this scripted policy (random, solver) on the "
                        "run's held-out states instead of a checkpoint.")


_PARSED: list[str] | None = None  # the arguments left by cli.parse_first, run as a script
# The eval section's keys for the help page, with what they mean (their values: the run's).
EVAL_KEYS = (
    ("eval.episodes", "held-out initial states per env"),
    ("eval.envs", "comma-separated envs (\"\": the run's env and its variants)"),
    ("eval.modes", "greedy and / or sampled, comma-separated"),
    ("eval.temperature", "the sampled mode's temperature"),
    ("eval.pass_k", "sampled rollouts per state (pass@k)"),
    ("eval.samples", "conversations written to samples/eval_step_<N>.txt"),
    ("eval.seed", "evaluate on the held-out states of this seed's run"),
    ("eval.batch", "rows rolled out at once (the numbers do not change)"),
)


def _help() -> str:
    """The --help page."""
    return cli.help_page(
        "python experiments/evaluate.py --workdir DIR [--step N] [--config.eval.KEY=VALUE ...]",
        "Evaluates a run's checkpoint on held-out initial states and the out-of-distribution\n"
        "envs; prints a table and writes eval_step_<N>.json and samples/eval_step_<N>.txt\n"
        "in the workdir.",
        ["python experiments/evaluate.py --workdir runs/quickstart",
         "python experiments/evaluate.py --workdir runs/quickstart --step 16 "
         "--config.eval.episodes=64"],
        [("--workdir DIR", "the run's workdir (run.py's or sft.py's; required)"),
         ("--step N", "the checkpoint to evaluate (default: the newest)"),
         ("--policy NAME", "instead: a scripted policy (random, solver) on the same states, "
                           "-> eval_policy_<NAME>.json"),
         ("--config.eval.KEY=VALUE", "change an eval setting (only eval.* keys; below)"),
         ("--help, --helpshort", "this page")],
        keys=list(EVAL_KEYS), keys_title="eval keys (--config.eval.KEY=VALUE; unset: the "
                                          "run's own values, from its config.json):",
        more="Evaluation and its metrics: docs/evaluation-and-monitoring.md.")


def _check() -> None:
    """Before JAX and the envs load: --workdir given, the run's config and the overrides."""
    if not flags.FLAGS.workdir:
        raise app.UsageError("--workdir is required: the run's workdir, e.g. runs/quickstart")
    evaluated_config(Path(flags.FLAGS.workdir),
                     config_flags.get_override_values(flags.FLAGS["config"]))


if __name__ == "__main__":
    # The workdir's config and the overrides are checked before JAX and the envs load
    # (seconds): a mistake is its one line at once.
    _PARSED = cli.parse_first(_check, define_flags=_define_flags, usage=_help)

from starpo_jax.run import loop as runner  # noqa: E402


def _main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS.workdir:
        raise app.UsageError("--workdir is required: the run's workdir, e.g. runs/quickstart")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    overrides = config_flags.get_override_values(flags.FLAGS["config"])
    if flags.FLAGS.policy:
        if flags.FLAGS.step is not None:
            raise app.UsageError("--step and --policy do not go together: a policy has no "
                                 "checkpoint")
        runner.evaluate_policy_workdir(Path(flags.FLAGS.workdir), flags.FLAGS.policy, overrides)
        return
    runner.evaluate_workdir(Path(flags.FLAGS.workdir), flags.FLAGS.step, overrides)


def main() -> None:
    cli.run_app(_main, errors=(ValueError, FileNotFoundError), define_flags=_define_flags,
                parsed=_PARSED, usage=_help)


if __name__ == "__main__":
    main()
