"""Train StarPO / StarPO-S from a config file, writing everything under a workdir.

    python experiments/run.py --config bandit_grpo.py --workdir runs/bandit
    python experiments/run.py --config sokoban_ppo.py --config.steps=50 \
        --config.rollout.group_size=8 --workdir runs/sokoban
    python experiments/run.py --config sokoban_ppo.py --workdir runs/sokoban --resume

A bare config name resolves to experiments/configs/; keys and switches are documented in
starpo_jax.api.default_config. The workdir gets config.json, metrics.jsonl (one JSON object
per step: "step" and the metric names), TensorBoard events (tensorboard/) and orbax
checkpoints (checkpoints/, every `checkpoint_every` steps, the newest `keep_checkpoints` kept,
and always at the end), and with `eval_every` / `sample_every` evaluation metrics (val/, the
same files) and sample conversations (samples/step_<N>.txt). A host env (envs_host, named like
any env) trains through starpo_jax.host_train: its rollout steps the env on the host, the
update is compiled (no evaluation). `--resume` continues from the newest checkpoint and gives
the same metrics as a run never stopped. Before step 1 the step is compiled and sized against
the free memory: memory knobs left unset are chosen then (starpo_jax.autofit; one line says
what and why, config.json's "auto_memory" records it, and a resumed run takes it again), and
a step that cannot fit stops with the settings that shrink it. SIGINT / SIGTERM finish
the current step, save and exit 0.
Faults (each one line on stderr and exit 1, nothing half-written is ever loaded): a workdir in
use by another live run (run.lock; a killed run's lock is taken over), unwritable or without
space for a checkpoint, made by another config, or with a damaged checkpoint is refused before
training; a failed save stops the run with the previous checkpoint kept; `max_skipped_steps`
steps in a row that dropped updates as non-finite (train.apply_if) save and stop the
run. A kill at any moment (kill -9 included) leaves the newest complete checkpoint to
--resume from (experiments/fault_kill.py tries it).
The collapse monitor (config monitor.*, starpo_jax.monitor) prints its alerts and appends them
to alerts.jsonl; its action "stop" or "raise_filter" saves and ends the run (exit 0).
Multi-process (multi-host) runs start with starpo_jax.distributed.maybe_initialize (the
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID variables, or SLURM / Open MPI):
every process steps and saves checkpoints (the workdir must be shared), process 0 alone writes
config.json, metrics, events, alerts, samples and the console lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from starpo_jax.distributed import (any_process, maybe_initialize,  # noqa: E402
                                    min_over_processes)

if __name__ == "__main__":
    # Before any other import: some (jumanji's) already compute with JAX, which fixes the
    # backend; jax.distributed must be initialised before that.
    try:
        maybe_initialize()
    except ValueError as error:  # a bad JAX_* variable: the message names it
        sys.exit(f"error: {error}")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

import jax  # noqa: E402

from starpo_jax import api, cli  # noqa: E402
from starpo_jax.checkpoint import Checkpoints  # noqa: E402
from starpo_jax.evaluation import Evaluator, summary_table  # noqa: E402
from starpo_jax.logging import Writers, open_writers  # noqa: E402
from starpo_jax.monitor import RunMonitor  # noqa: E402
from starpo_jax.train import SKIPPED_UPDATES  # noqa: E402
from starpo_jax.workdir import (RunFault, WorkdirLock, check_config, check_free_space,  # noqa: E402
                                write_atomically)

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
# Keys a resumed run may change: they do not alter the numbers of any step.
RESUMABLE_CHANGES = ("steps", "log_every", "checkpoint_every", "keep_checkpoints", "eval_every",
                     "sample_every", "eval", "check_memory", "progress_after", "max_skipped_steps")

# The collapse monitor's settings, and filter.keep_ratio so that a run stopped by its
# "raise_filter" action goes on with the suggested value (the steps after the resume change).
RESUMABLE_CHANGES += ("monitor", "filter.keep_ratio")
# A host env's pool settings (threads / processes, timeout) change how it is stepped, not what.
RESUMABLE_CHANGES += ("host",)
# The starting weights matter only before the first checkpoint, which a resume starts from.
RESUMABLE_CHANGES += ("model.init_from",)
# config.json's record of the memory settings chosen for the knobs left unset (not a config
# key): a resumed run takes them again from there.
AUTO_MEMORY = "auto_memory"
RESUMABLE_CHANGES += (AUTO_MEMORY,)

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (a bare name resolves to "
                                          "experiments/configs/).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics, events and checkpoints.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue from the newest checkpoint in --workdir.")


def resolve_config_arg(argv: list[str]) -> list[str]:
    """`--config NAME`: a bare file name that does not exist here points into configs/."""
    return cli.resolve_config_arg(argv, CONFIG_DIR)


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT / SIGTERM (the loop stops after its current step); the previous
    handlers come back on exit."""
    stop = threading.Event()

    def handler(signum, _frame):
        print(f"\n{signal.Signals(signum).name}: saving after this step, then exiting",
              flush=True)
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def train(exp: api.Experiment, workdir: Path, *, resume: bool = False,
          stop: threading.Event | None = None) -> int:
    """Runs exp.config.steps iterations of `exp` (resuming from workdir's newest checkpoint if
    `resume`), logging and checkpointing under `workdir`. Stops early, after saving, when `stop`
    is set or the collapse monitor's action asks it to (starpo_jax.monitor). Returns the number
    of steps done. In a multi-process run only process 0 writes logs and holds the workdir's
    lock; all save checkpoints. Raises RunFault on the faults of the module docstring."""
    primary = jax.process_index() == 0
    with WorkdirLock(workdir) if primary else contextlib.nullcontext():
        return _train(exp, workdir, resume, stop, primary)


def _train(exp: api.Experiment, workdir: Path, resume: bool, stop: threading.Event | None,
           primary: bool) -> int:
    c = exp.config
    config_path = workdir / "config.json"
    checkpoints = Checkpoints(workdir / "checkpoints", c.checkpoint_every, c.keep_checkpoints)
    check_config(config_path, c.to_dict(), resume, RESUMABLE_CHANGES,
                 has_checkpoints=checkpoints.latest_step is not None)
    if checkpoints.latest_step is not None and not resume:
        raise FileExistsError(f"{workdir} already holds checkpoints (newest: step "
                              f"{checkpoints.latest_step}); pass --resume or another --workdir")
    exp.state = exp.fresh_state() if exp.steps_done else exp.state
    if resume:
        exp.state = checkpoints.restore_latest(like=exp.state) or exp.state
    check_free_space(workdir, sum(x.nbytes for x in jax.tree.leaves(exp.state)))
    record = _check_memory(exp, config_path if resume else None, primary)
    if primary:
        saved = json.loads(c.to_json())
        if record:
            saved[AUTO_MEMORY] = record
        write_atomically(config_path, json.dumps(saved, indent=2) + "\n")
    first = exp.steps_done
    skipped = 0  # steps in a row that dropped updates
    writers = open_writers(workdir, c.steps, first, console_every=c.log_every) if primary \
        else Writers([])
    monitor = RunMonitor(workdir, c if primary else _silent_monitor(c), first)
    evaluator = exp.evaluator() if c.eval_every or c.sample_every else None
    try:
        while exp.steps_done < c.steps and not any_process(
                bool(stop and stop.is_set()) or monitor.stop_reason is not None):
            start = time.perf_counter()
            metrics = exp.step()
            metrics["timing/step_seconds"] = time.perf_counter() - start
            if evaluator is not None:
                metrics.update(evaluate(evaluator, exp, workdir))
            metrics.update(monitor.observe(exp.steps_done, metrics))
            writers.write(exp.steps_done, metrics)
            checkpoints.maybe_save(exp.state)
            skipped = skipped + 1 if any(metrics.get(k, 0) > 0 for k in SKIPPED_UPDATES) else 0
            if c.max_skipped_steps and skipped >= c.max_skipped_steps:
                checkpoints.maybe_save(exp.state, force=True)
                raise RunFault(_skipped_message(exp.steps_done, skipped))
        checkpoints.maybe_save(exp.state, force=True)
    finally:
        writers.close()
        checkpoints.close()
        monitor.close()
    return exp.steps_done


def _check_memory(exp: api.Experiment, saved: Path | None, primary: bool) -> dict | None:
    """The step compiled and sized against the free memory before step 1 (api.check_memory:
    MemoryError when it cannot fit), unless the Experiment does not size its step
    (Experiment.sizes_its_step: check_memory=False, a host env, a swapped-in step). Memory
    knobs left unset take the settings of `saved` config.json's record (a resumed run steps as
    before) or are chosen now. Returns the record for config.json."""
    if not exp.sizes_its_step:
        return None
    previous = _saved_memory(saved)
    if previous and exp.auto and exp.memory is None:
        api.pin_memory(exp, previous["settings"])
    plan = api.check_memory(exp, any_process, smallest=min_over_processes)
    if primary:
        chosen = exp.memory.line() if exp.memory else f"train step compiled: {plan}"
        print(chosen + (" (settings of the resumed run)" if previous else ""), flush=True)
    return exp.memory.record() if exp.memory else previous


def _saved_memory(path: Path | None) -> dict | None:
    """The memory-settings record of a workdir's config.json, None when there is none."""
    if path is None or not path.exists():
        return None
    saved = json.loads(path.read_text())  # check_config has read it: it is a JSON object
    return saved.get(AUTO_MEMORY)


def _skipped_message(step: int, skipped: int) -> str:
    last_good = step - skipped
    return (f"steps {last_good + 1}-{step} dropped their updates: the loss or gradients were not "
            f"finite (actor/skipped_updates, alerts.jsonl); stopped at max_skipped_steps = "
            f"{skipped}. The checkpoint of step {step} holds the weights and optimiser state of "
            f"step {last_good}. Find the NaN's source (rewards, optim.actor_lr) and --resume, or "
            f"start again from a new --workdir")


def _silent_monitor(config: api.ConfigDict) -> api.ConfigDict:
    """`config` with the monitor off: a non-primary process neither prints nor writes alerts
    (process 0's stop decision reaches it through any_process)."""
    quiet = config.copy_and_resolve_references()
    quiet.monitor.enabled = False
    return quiet


def evaluate(evaluator: Evaluator, exp: api.Experiment, workdir: Path) -> dict[str, float]:
    """After a step: the val/ metrics when an evaluation is due (every eval_every steps and the
    last step), and samples/step_<N>.txt when sample_every is, from the same eval rollouts (at
    a step with no evaluation due, only the first eval env is rolled out, and nothing logged)."""
    c, step = exp.config, exp.steps_done
    due_eval = c.eval_every > 0 and (step % c.eval_every == 0 or step == c.steps)
    due_samples = c.sample_every > 0 and step % c.sample_every == 0
    if not (due_eval or due_samples):
        return {}
    start = time.perf_counter()
    envs = None if due_eval else evaluator.config.envs[:1]
    result = evaluator.evaluate(exp.state.actor, envs=envs)
    if due_samples and jax.process_index() == 0:
        path = workdir / "samples" / f"step_{step:06d}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(evaluator.samples_text(result))
    if not due_eval:
        return {}
    if jax.process_index() == 0:
        print(f"evaluation after step {step}:\n{summary_table(result.metrics)}", flush=True)
    return {**result.metrics, "timing/eval_seconds": time.perf_counter() - start}


def _main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required")
    if _CONFIG.value is None:
        raise app.UsageError("--config is required (a config file, e.g. bandit_grpo.py)")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax's INFO lines would bury the progress
    process, processes = jax.process_index(), jax.process_count()
    config = _CONFIG.value
    api.train_config(config)  # every key and value checked before anything loads or compiles
    say = print if process == 0 else lambda *_, **__: None
    if processes > 1:
        say(f"{processes} processes, {jax.device_count()} devices", flush=True)
    say(f"config {flags.FLAGS['config'].config_filename} -> {_WORKDIR.value}", flush=True)
    workdir = Path(_WORKDIR.value)
    # Taken before the slow part, so that a second run on the workdir is refused at once.
    with WorkdirLock(workdir, say) if process == 0 else contextlib.nullcontext():
        exp = api.build(config)
        with stop_on_signals() as stop:
            done = train(exp, workdir, resume=_RESUME.value, stop=stop)
    say(f"{done}/{config.steps} steps; workdir {_WORKDIR.value}", flush=True)


def main() -> None:
    cli.run_app(_main, resolve_config_arg(sys.argv),
                errors=(ValueError, FileNotFoundError, MemoryError, RunFault, FileExistsError),
                config_dir=CONFIG_DIR)


if __name__ == "__main__":
    main()
