"""The SFT warm start from a config file, writing everything under a workdir (starpo_jax.sft).

    python experiments/sft.py --config sokoban_sft.py --workdir runs/sokoban_sft
    python experiments/sft.py --config sokoban_sft.py --config.sft.policy=solver \
        --workdir runs/sokoban_sft_solver
    python experiments/sft.py --config sokoban_sft.py --config.sft.data=demos.jsonl \
        --workdir runs/sokoban_sft_file
    python experiments/run.py --config sokoban_grpo.py \
        --config.model.init_from=runs/sokoban_sft --workdir runs/sokoban_rl

A bare config name resolves to experiments/configs/; keys are api.default_config's plus the
`sft` section (starpo_jax.sft.sft_default_config). The loop, the workdir's files (config.json,
metrics.jsonl, tensorboard/, checkpoints/, samples/), --resume, SIGINT / SIGTERM and the faults
are experiments/run.py's: this script only builds an SFT experiment (its step is a supervised
step; its evaluations add val/sft/heldout/loss) and hands it to run.py's `train`. An evaluation
of the initial policy is printed before step 1 (the "before" numbers), and with sft.write_demos > 0
that many demonstrations are written to <workdir>/demos.jsonl first.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from absl import app, flags, logging  # noqa: E402

import run  # noqa: E402  (experiments/run.py: the loop and its faults)
from starpo_jax import cli, sft  # noqa: E402
from starpo_jax.evaluation import summary_table  # noqa: E402
from starpo_jax.workdir import RunFault, WorkdirLock  # noqa: E402


def _main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not run._WORKDIR.value:
        raise app.UsageError("--workdir is required")
    if run._CONFIG.value is None:
        raise app.UsageError("--config is required (a config file, e.g. sokoban_sft.py)")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    config = run._CONFIG.value
    sft.split_config(config)  # every key and value checked before anything loads or compiles
    workdir = Path(run._WORKDIR.value)
    print(f"config {flags.FLAGS['config'].config_filename} -> {workdir}", flush=True)
    with WorkdirLock(workdir, print):
        exp = sft.build(config)
        fresh = not run._RESUME.value and not (workdir / "config.json").exists()
        if config.sft.write_demos and fresh:
            workdir.mkdir(parents=True, exist_ok=True)
            count = exp.write_demos(workdir / "demos.jsonl", config.sft.write_demos)
            print(f"{count} demonstrations -> {workdir / 'demos.jsonl'}", flush=True)
        if fresh and config.eval_every:
            before = exp.evaluator().evaluate(exp.state.actor).metrics
            print(f"evaluation before SFT:\n{summary_table(before)}", flush=True)
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "before.json").write_text(json.dumps(before, indent=2) + "\n")
        with run.stop_on_signals() as stop:
            done = run.train(exp, workdir, resume=run._RESUME.value, stop=stop)
    print(f"{done}/{config.steps} steps; workdir {workdir}", flush=True)


def main() -> None:
    cli.run_app(_main, run.resolve_config_arg(sys.argv),
                errors=(ValueError, FileNotFoundError, MemoryError, RunFault, FileExistsError),
                config_dir=run.CONFIG_DIR)


if __name__ == "__main__":
    main()
