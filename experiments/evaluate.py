"""Evaluate a run's checkpoint on held-out initial states and the out-of-distribution envs.

    python experiments/evaluate.py --workdir runs/bandit
    python experiments/evaluate.py --workdir runs/sokoban --step 20 \
        --config.eval.episodes=64 --config.eval.envs=sokoban,sokoban_large

The run's config.json gives the model, env, prompt, rollout settings and seed (hence the same
held-out initial states as the run's own evaluations); `--config.eval.<key>=value` overrides
its eval section (keys: starpo_jax.api.default_config), nothing else. Restores the newest
checkpoint (or `--step`), prints a table, and writes in the workdir eval_step_<N>.json
({"step", "eval": the eval settings, "metrics": {"val/<env>/<mode>/<name>": value}}) and
samples/eval_step_<N>.txt (conversations of the first eval.samples initial states).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Mapping

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from starpo_jax import cli  # noqa: E402
from starpo_jax.run_config import (ConfigDict, check_config, default_config,  # noqa: E402
                                   read_run_config)


def run_config(workdir: Path, overrides: Mapping[str, Any]) -> ConfigDict:
    """The run's config (read_run_config) with `overrides` ({"eval.episodes": 32, ...})
    applied and checked (check_config: without JAX; api.build checks it whole)."""
    foreign = sorted(k for k in overrides if not k.startswith("eval."))
    if foreign:
        raise ValueError(f"only eval.* keys may be overridden when evaluating a run; got {foreign}")
    config, _ = read_run_config(workdir)
    config.eval.update({key.split(".", 1)[1]: value for key, value in overrides.items()})
    check_config(config)
    return config


def _define_flags() -> None:
    # Defined at run time, not on import: tests import this module next to run.py, which has
    # its own flags. config_flags applies the --config.* overrides as it defines the flag.
    config_flags.DEFINE_config_dict(
        "config", default_config(), "Overrides of the run's eval section: "
        "--config.eval.<key>=...")
    flags.DEFINE_string("workdir", None, "The run's workdir (experiments/run.py --workdir).")
    flags.DEFINE_integer("step", None, "Checkpoint step to evaluate (default: the newest).")


_PARSED: list[str] | None = None  # the arguments left by cli.parse_first, run as a script

if __name__ == "__main__":
    # The workdir's config and the overrides are checked before JAX and the envs load
    # (seconds): a mistake is its one line at once.
    _PARSED = cli.parse_first(
        lambda: flags.FLAGS.workdir is None or run_config(
            Path(flags.FLAGS.workdir), config_flags.get_override_values(flags.FLAGS["config"])),
        define_flags=_define_flags)

from starpo_jax import api  # noqa: E402
from starpo_jax.checkpoint import Checkpoints  # noqa: E402
from starpo_jax.evaluation import summary_table  # noqa: E402


def evaluate_workdir(workdir: Path, step: int | None = None,
                     overrides: Mapping[str, Any] | None = None) -> tuple[int, dict[str, float]]:
    """Evaluates checkpoint `step` (default: the newest) of the run in `workdir`, prints the
    table and writes eval_step_<N>.json and samples/eval_step_<N>.txt. Returns (step, metrics)."""
    config = run_config(workdir, overrides or {})
    directory = workdir / "checkpoints"
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} does not exist: no checkpoint saved")
    checkpoints = Checkpoints(directory, 0, 1)  # only listed: nothing is saved here
    try:  # before the model loads: a missing step is known from the directory alone
        if checkpoints.latest_step is None:
            raise FileNotFoundError(f"{directory} holds no checkpoint")
        if step is not None and step not in checkpoints.steps:
            raise ValueError(f"--step {step}: no checkpoint of that step in {directory}; valid: "
                             f"{checkpoints.steps}")
    finally:
        checkpoints.close()
    return evaluate_experiment(api.build(config), workdir, step)


def evaluate_experiment(exp: api.Experiment, workdir: Path, step: int | None = None,
                        ) -> tuple[int, dict[str, float]]:
    """evaluate_workdir with the run's experiment already built (its config's eval section
    applies)."""
    directory = workdir / "checkpoints"
    checkpoints = Checkpoints(directory, 0, exp.config.keep_checkpoints)
    try:
        step = checkpoints.latest_step if step is None else step
        if step is None:
            raise FileNotFoundError(f"{directory} holds no checkpoint")
        state = checkpoints.restore(step, like=exp.state)
    finally:
        checkpoints.close()
    evaluator = api.build_evaluator(exp)
    result = evaluator.evaluate(state.actor)
    print(f"{workdir}, step {step}: {evaluator.config.episodes} held-out initial states per env\n"
          f"{summary_table(result.metrics)}", flush=True)
    out = {"step": step, "eval": dataclasses.asdict(evaluator.config), "metrics": result.metrics}
    (workdir / f"eval_step_{step}.json").write_text(json.dumps(out, indent=2) + "\n")
    samples = workdir / "samples" / f"eval_step_{step:06d}.txt"
    samples.parent.mkdir(exist_ok=True)
    samples.write_text(evaluator.samples_text(result))
    return step, result.metrics


def _main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS.workdir:
        raise app.UsageError("--workdir is required")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    overrides = config_flags.get_override_values(flags.FLAGS["config"])
    evaluate_workdir(Path(flags.FLAGS.workdir), flags.FLAGS.step, overrides)


def main() -> None:
    cli.run_app(_main, errors=(ValueError, FileNotFoundError), define_flags=_define_flags,
                parsed=_PARSED)


if __name__ == "__main__":
    main()
