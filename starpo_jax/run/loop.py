"""Training a run: the loop experiments/run.py and sft.py hand their experiment to, and the
evaluation of a run's checkpoint (experiments/evaluate.py).

    from starpo_jax.run import experiment, loop as runner
    exp = experiment.build(config)
    with runner.stop_on_signals() as stop:
        runner.train(exp, Path("runs/x"), stop=stop)   # or runner.run(config, "runs/x")

`train` runs exp.config.steps iterations of an Experiment (experiment.build, sft.build), writing
everything under a workdir: config.json, metrics.jsonl (one JSON object per step: "step" and
the metric names), TensorBoard events (tensorboard/; with logging.wandb=True also a Weights &
Biases run, wandb/ and wandb_run_id) and orbax checkpoints (checkpoints/, every
`checkpoint_every` steps, the newest `keep_checkpoints` kept, and always at the end), and with
`eval_every` / `sample_every` evaluation metrics (val/, the same files) and sample conversations
(samples/step_<N>.txt). A resumed run (`resume=True`) continues from the newest checkpoint and
gives the same metrics as a run never stopped; the keys it may change are RESUMABLE_CHANGES.
Before step 1 a line gives the step-time estimate and the whole run's, pointing at a CPU-sized
config of the same game when the run would take far longer than a CPU session (it still runs);
then the step is compiled and sized against the free memory: memory knobs left unset are chosen
then (starpo_jax.sizing.autofit; one line says what and why, config.json's "auto_memory" records
it, and a resumed run takes it again), and a step that cannot fit stops with the settings that
shrink it. stop_on_signals answers SIGINT / SIGTERM at once, even inside a long compiled
step: the run saves after the current step and returns; a second one exits at once (status
128 + the signal), the newest complete checkpoint being the resume point. Before step 1 there is
nothing to save: `run` / `run_sft` (run.py, sft.py) then end the process at once, even inside a
compile (which JAX cannot interrupt), leaving no checkpoint and no config.json of a fresh run
(StopRequests); `train` ends before its first step. Each long phase says what it does as it
starts (starpo_jax.run.announce).
Faults (RunFault, FileExistsError, MemoryError: one line each, nothing half-written is ever
loaded): resuming a workdir that holds no run, a workdir path that is a file, a workdir in use
by another live run (run.lock; a killed run's lock is taken over), unwritable or without space
for a checkpoint, made by another config, or with a damaged checkpoint is refused before
training; a failed save stops the run with the previous checkpoint kept; `max_skipped_steps`
steps in a row that dropped updates as non-finite (train.apply_if) save and stop the run. A
kill at any moment (kill -9 included) leaves the newest complete checkpoint to resume from
(experiments/fault_kill.py tries it).
The collapse monitor (config monitor.*, starpo_jax.run.monitor) prints its alerts and appends them
to alerts.jsonl; its action "stop" or "raise_filter" saves and ends the run, as do
filter.empty_stop_steps steps in a row whose filter kept no group (monitor.EmptyFilterStop).
In a multi-process run every process steps and saves checkpoints (the workdir must be shared),
process 0 alone writes config.json, metrics, events, alerts, samples and the console lines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping

import jax

from starpo_jax.run import announce, experiment
from starpo_jax.run import sft as sft_lib
from starpo_jax.run.checkpoint import Checkpoints, checkpoint_bytes
from starpo_jax.run.cli import CONFIG_DIR, load_config
from starpo_jax.run.distributed import any_process, min_over_processes
from starpo_jax.run.evaluation import Evaluator, summary_table
from starpo_jax.run.writers import (METRICS_FILE, WandbWriter, Writers, human_duration,
                                    open_writers, process_age, read_history)
from starpo_jax.run.monitor import EmptyFilterStop, RunMonitor
from starpo_jax.run.stops import StopRequests, stop_on_signals
from starpo_jax.run.schema import (AUTO_MEMORY, RUN_CONFIG_FILE, check_start, evaluated_config,
                                   warm_start)
from starpo_jax.sizing import speed
from starpo_jax.train.step import SKIPPED_UPDATES
from starpo_jax.run.workdir import (LOCK_FILE, RunFault, WorkdirLock, check_config,
                                    check_free_space, check_resumable, write_atomically)

# Keys a resumed run may change: they do not alter the numbers of any step.
RESUMABLE_CHANGES = ("steps", "log_every", "checkpoint_every", "keep_checkpoints", "eval_every",
                     "sample_every", "eval", "check_memory", "progress_after", "max_skipped_steps")

# The collapse monitor's settings, and filter.keep_ratio so that a run stopped by its
# "raise_filter" action goes on with the suggested value (the steps after the resume change).
RESUMABLE_CHANGES += ("monitor", "filter.keep_ratio")
# When a run stops for steps that kept nothing, and whether (how often) the gradient analysis
# runs: neither changes a step's numbers.
RESUMABLE_CHANGES += ("filter.empty_stop_steps", "gradient_analysis")
# A host env's pool settings (threads / processes, timeout) change how it is stepped, not what.
RESUMABLE_CHANGES += ("host",)
# The starting weights matter only before the first checkpoint, which a resume starts from.
RESUMABLE_CHANGES += ("model.init_from", "model.require_init_from")
# config.json's record of the memory settings chosen for the knobs left unset (not a config
# key): a resumed run takes them again from there.
RESUMABLE_CHANGES += (AUTO_MEMORY,)
# Where metrics also go, and the module that registers the envs (env.name is compared).
RESUMABLE_CHANGES += ("logging", "env.module")
# Whether step 0 is evaluated: a run resumed past it never evaluates it (its initial weights
# may not be rebuildable: model.init_from may change).
RESUMABLE_CHANGES += ("val_before_train",)
# A run whose step-time estimate exceeds this is pointed at a CPU-sized config (it still runs).
CPU_SESSION_SECONDS = 3 * 3600


def train(exp: experiment.Experiment, workdir: Path, *, resume: bool = False,
          stop: threading.Event | None = None, started: float | None = None,
          before: Mapping[str, float] | None = None) -> int:
    """Runs exp.config.steps iterations of `exp` (resuming from workdir's newest checkpoint if
    `resume`), logging and checkpointing under `workdir`. Stops early, after saving, when `stop`
    is set or the collapse monitor's action asks it to (starpo_jax.run.monitor); a StopRequests
    `stop` is told each step's start and expected time and the newest checkpoint. `started`
    (a time.perf_counter() value): where the closing "done in" counts from (default: when
    logging begins). With val_before_train (and eval_every) a run at step 0 first evaluates its
    initial weights (after the compile, before step 1: a stop then ends it as a stop in the
    compile does), logged at step 0, unless its metrics.jsonl holds step 0's evaluation already
    (a resumed run); `before`: such an evaluation made already (sft.py's), logged instead.
    Returns the number of steps done. In a multi-process run only process 0
    writes logs and holds the workdir's lock; all save checkpoints. Raises RunFault on the
    faults of the module docstring."""
    primary = jax.process_index() == 0
    with WorkdirLock(workdir) if primary else contextlib.nullcontext():
        return _train(exp, workdir, resume, stop, primary, started, before)


def _train(exp: experiment.Experiment, workdir: Path, resume: bool, stop: threading.Event | None,
           primary: bool, started: float | None,
           before: Mapping[str, float] | None = None) -> int:
    c = exp.config
    config_path = workdir / RUN_CONFIG_FILE
    # Told what the loop does, for the stop message (a plain Event or None: nobody reads it).
    watch = stop if isinstance(stop, StopRequests) else StopRequests()
    watch.resumed, watch.stepped = resume, False  # one StopRequests may serve several runs
    existed = {p.name for p in workdir.iterdir()} if workdir.is_dir() else set()
    if primary and not resume:  # a stop before the start: nothing of this run is left
        watch.on_exit_before_start(lambda: _forget(workdir, existed))
    checkpoints = Checkpoints(workdir / "checkpoints", c.checkpoint_every, c.keep_checkpoints)
    check_config(config_path, c.to_dict(), resume,
                 has_checkpoints=checkpoints.latest_step is not None,
                 **sft_lib.resume_rules(c, RESUMABLE_CHANGES))
    if checkpoints.latest_step is not None and not resume:
        raise FileExistsError(f"{workdir} already holds checkpoints (newest: step "
                              f"{checkpoints.latest_step}); pass --resume or another --workdir")
    exp.state = exp.fresh_state() if exp.steps_done else exp.state
    if resume and checkpoints.latest_step is not None:
        with announce.phase(f"restoring step {checkpoints.latest_step}",
                            f" from {checkpoints.directory}"):
            exp.state = checkpoints.restore_latest(like=exp.state)
    watch.saved_step = checkpoints.latest_step if resume else None
    check_free_space(workdir, checkpoint_bytes(exp.state))
    # A stop heard already (api.train's: this process goes on) skips the compile: no step runs.
    record = None if stop is not None and stop.is_set() else \
        _check_memory(exp, workdir if resume else None, primary, c.steps - exp.steps_done)
    watch.step_seconds = exp.estimated_step_seconds()
    evaluator = exp.evaluator() if c.eval_every or c.sample_every else None
    if before is None and evaluator is not None and not (stop is not None and stop.is_set()) \
            and evaluates_step_0(c, exp.steps_done, workdir, resume):
        before = evaluate(evaluator, exp, workdir)  # a stop in it ends the run as in the compile
    watch.begin()  # the slow setup is over: from here a stop saves after the current step
    saved = json.loads(c.to_json())
    as_it_was = config_path.read_text() if resume and primary and config_path.is_file() else None
    if primary:
        if record:
            saved[AUTO_MEMORY] = record
        write_atomically(config_path, json.dumps(saved, indent=2) + "\n")
    first = exp.steps_done
    skipped = 0  # steps in a row that dropped updates
    if primary and not resume:  # an abandoned start's lines (its step 0 too) are not this run's
        (workdir / METRICS_FILE).unlink(missing_ok=True)
    more = (WandbWriter(workdir, c.logging.wandb_project, c.logging.wandb_name, saved),) \
        if c.logging.wandb and primary else ()
    writers = open_writers(workdir, c.steps, first, console_every=c.log_every, started=started,
                           more=more) if primary else Writers([])
    monitor = RunMonitor(workdir, c if primary else _silent_monitor(c), first)
    empty = EmptyFilterStop(workdir, c, first, say=primary)  # filter.empty_stop_steps
    if before:
        writers.write(0, before)  # JSONL, TensorBoard, W&B; no console line (the table was)
    try:
        while exp.steps_done < c.steps and not any_process(
                bool(stop and stop.is_set()) or monitor.stop_reason is not None
                or empty.stop_reason is not None):
            watch.step_started = start = time.perf_counter()
            watch.stepped = True
            with announce.phase(f"step {exp.steps_done + 1}", ": compiling the train step, "
                                "then running it") if exp.steps_done == first and \
                    not exp.sizes_its_step else contextlib.nullcontext():
                metrics = exp.step()
            watch.step_started = None
            watch.step_seconds = metrics["timing/step_seconds"] = time.perf_counter() - start
            if evaluator is not None:
                metrics.update(evaluate(evaluator, exp, workdir))
            metrics.update(monitor.observe(exp.steps_done, metrics))
            metrics.update(empty.observe(exp.steps_done, metrics))
            writers.write(exp.steps_done, metrics)
            if _save(checkpoints, exp.state, said=bool(stop and stop.is_set())):
                watch.saved_step = exp.steps_done
            skipped = skipped + 1 if any(metrics.get(k, 0) > 0 for k in SKIPPED_UPDATES) else 0
            if c.max_skipped_steps and skipped >= c.max_skipped_steps:
                _save(checkpoints, exp.state, force=True)
                raise RunFault(_skipped_message(exp.steps_done, skipped))
        if exp.steps_done > first:  # the end; a run that never stepped has nothing new to save
            _save(checkpoints, exp.state, force=True)
    finally:
        writers.close()
        checkpoints.close()
        monitor.close()
    if exp.steps_done == first and stop is not None and stop.is_set() and primary:
        if as_it_was is not None:
            write_atomically(config_path, as_it_was)
        elif not resume:
            _forget(workdir, existed, also=(RUN_CONFIG_FILE, METRICS_FILE))
        print(f"stopped before the first step: {watch.nothing_done()}", flush=True)
    return exp.steps_done


def _save(checkpoints: Checkpoints, state: Any, *, force: bool = False, said: bool = True,
          ) -> bool:
    """checkpoints.maybe_save(state, force=force), saying "saving step N ..." (and how long it
    took, when long) if it saves and `said`."""
    step = int(state.step)
    due = force or (checkpoints.every > 0 and step % checkpoints.every == 0)
    if not said or not due or step in checkpoints.steps:
        return checkpoints.maybe_save(state, force=force)
    with announce.phase(f"saving step {step}", f" in {checkpoints.directory}"):
        return checkpoints.maybe_save(state, force=force)


def _forget(workdir: Path, existed: set[str], also: tuple[str, ...] = ()) -> None:
    """Removes what a run that never stepped made in `workdir`: the entries not in `existed`
    (their names before it began) and those named in `also` (its run.lock stays: the lock's)."""
    if not workdir.is_dir():
        return
    for path in workdir.iterdir():
        if path.name == LOCK_FILE or (path.name in existed and path.name not in also):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def cost_lines(step_seconds: float, steps: int, env: str,
               rate: speed.MatmulRate | None = None, config: Any = None) -> list[str]:
    """What the run will cost by the step-time estimate `step_seconds` (Experiment.
    estimated_step_seconds at the f32 matmul rate `rate`; default: this process's measured
    speed.matmul_rate), as a range (speed.step_range), and, when that is far beyond a CPU
    session, the CPU-sized config of the same game (or the quickstart's), with the SFT warm
    start it needs first (its model.require_init_from); not for `config` (the run's) when it is
    an SFT run or already names that warm start: it is on the CPU path already."""
    rate = speed.matmul_rate() if rate is None else rate
    low, high = speed.step_range(step_seconds, rate)
    plural = "s" * (steps != 1)
    lines = [f"estimated time on this CPU: ~{_duration_range(low, high)} a step, "
             f"~{_duration_range(low * steps, high * steps)} for the {steps} step{plural} to "
             f"run (autofit's step-time model at this machine's f32 matmul rate, measured now: "
             f"{rate.describe()}; every reply at its full token budget; evaluations not "
             "included)"]
    if step_seconds * steps > CPU_SESSION_SECONDS:
        name = f"{env}_cpu.py" if (CONFIG_DIR / f"{env}_cpu.py").is_file() else "quickstart.py"
        game = "the same game" if name.startswith(env) else "a run"
        command = f"python experiments/run.py --config {name}"
        sft = load_config(name).model.require_init_from
        if config is not None and ("sft" in config or (
                sft and config.model.get("require_init_from") == sft)):
            return lines
        if sft:
            build, start = warm_start(sft)
            command = f"{build}, then {command} {start}"
        lines.append(f"that is far beyond a CPU session: experiments/configs/{name} is {game} "
                     f"sized for a CPU ({command} --workdir runs/{name[:-3]}); running what was "
                     "asked")
    return lines


def _duration_range(low: float, high: float) -> str:
    """A range of durations: "5.3-7.7 s", "50 s to 2 min", or one when both read the same."""
    a, b = human_duration(low), human_duration(high)
    if a == b:
        return a
    if a.split()[1] == b.split()[1]:
        return f"{a.split()[0]}-{b}"
    return f"{a} to {b}"


def _check_memory(exp: experiment.Experiment, workdir: Path | None, primary: bool,
                  steps: int) -> dict | None:
    """The cost lines of the `steps` to run, then the step compiled and sized against the free
    memory before step 1 (experiment.check_memory: MemoryError when it cannot fit), unless the
    Experiment does not size its step (Experiment.sizes_its_step: check_memory=False, a host
    env, a swapped-in step). The step-time estimate needs no compile, so its lines come before
    the compile: with memory knobs left unset, for the settings compiled first
    (experiment.expected_step_seconds), and once more after the choice if that changed it by
    over a tenth. Memory knobs left unset take the settings recorded in the config.json of
    `workdir` (a resumed run steps as before) or are chosen now. Returns the record for
    config.json."""
    previous = experiment.read_run_config(workdir)[1] if exp.sizes_its_step and \
        workdir is not None and (workdir / RUN_CONFIG_FILE).is_file() else None
    if previous and exp.auto and exp.memory is None:
        experiment.pin_memory(exp, previous["settings"])
    expected = experiment.expected_step_seconds(exp)
    if primary and expected is not None:
        print("\n".join(cost_lines(expected, steps, exp.config.env.name, config=exp.config)),
              flush=True)
    if not exp.sizes_its_step:
        return None
    plan = experiment.check_memory(exp, any_process, smallest=min_over_processes)
    if primary:
        chosen = exp.memory.line() if exp.memory else f"train step compiled: {plan}"
        print(chosen + (" (settings of the resumed run)" if previous else ""), flush=True)
        now = exp.estimated_step_seconds()
        if expected and now and abs(now / expected - 1) > 0.1:
            print(f"with these settings, {cost_lines(now, steps, exp.config.env.name)[0]}",
                  flush=True)
    return exp.memory.record() if exp.memory else previous


def _skipped_message(step: int, skipped: int) -> str:
    last_good = step - skipped
    return (f"steps {last_good + 1}-{step} dropped their updates: the loss or gradients were not "
            f"finite (actor/skipped_updates, alerts.jsonl); stopped at max_skipped_steps = "
            f"{skipped}. The checkpoint of step {step} holds the weights and optimiser state of "
            f"step {last_good}. Find the NaN's source (rewards, optim.actor_lr) and --resume, or "
            f"start again from a new --workdir")


def _silent_monitor(config: experiment.ConfigDict) -> experiment.ConfigDict:
    """`config` with the monitor off: a non-primary process neither prints nor writes alerts
    (process 0's stop decision reaches it through any_process)."""
    quiet = config.copy_and_resolve_references()
    quiet.monitor.enabled = False
    return quiet


def evaluates_step_0(config: experiment.ConfigDict, steps_done: int, workdir: Path,
                     resume: bool) -> bool:
    """Whether a run evaluates its initial weights before step 1: val_before_train and
    eval_every on, at step 0, and (a resumed run) no step-0 evaluation in its metrics.jsonl."""
    if not (config.val_before_train and config.eval_every > 0 and steps_done == 0):
        return False
    return not (resume and any(step == 0 and any(k.startswith("val/") for k in row)
                               for step, row in read_history(workdir / METRICS_FILE)))


def evaluate(evaluator: Evaluator, exp: experiment.Experiment, workdir: Path) -> dict[str, float]:
    """After a step: the val/ metrics when an evaluation is due (every eval_every steps and the
    last step; at step 0, before training: train's evaluates_step_0), and samples/step_<N>.txt
    when sample_every is, from the same eval rollouts (at a step with no evaluation due, only
    the first eval env's first eval.samples initial states are rolled out, and nothing
    logged)."""
    c, step = exp.config, exp.steps_done
    due_eval = c.eval_every > 0 and (step % c.eval_every == 0 or step == c.steps)
    due_samples = (c.sample_every > 0 and step % c.sample_every == 0
                   and evaluator.config.samples > 0)
    if not (due_eval or due_samples):
        return {}
    start = time.perf_counter()
    if due_eval:
        result = evaluator.evaluate(exp.state.actor)
    else:  # samples only: the conversations shown, not a whole evaluation's rollouts
        result = evaluator.evaluate(exp.state.actor, envs=evaluator.config.envs[:1],
                                    states=evaluator.config.samples)
    if due_samples and jax.process_index() == 0:
        path = workdir / "samples" / f"step_{step:06d}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(evaluator.samples_text(result))
    if not due_eval:
        return {}
    if jax.process_index() == 0:
        when = f"after step {step}" if step else "before training (step 0)"
        print(f"evaluation {when}:\n{summary_table(result.metrics)}", flush=True)
    return {**result.metrics, "timing/eval_seconds": time.perf_counter() - start}


def _may_exit() -> bool:
    """Whether a stop before step 1 may end the process at once: not in a Jupyter kernel (an
    interrupt there should leave the kernel and its state alive: the run ends before step 1)."""
    return "ipykernel" not in sys.modules


def run(config: experiment.ConfigDict, workdir: str | os.PathLike, *, resume: bool = False,
        config_file: str = "") -> int:
    """What `python experiments/run.py --config <config_file> --workdir <workdir>` does once its
    flags are parsed: checks `config` whole, takes the workdir's lock (a second run on it is
    refused at once), builds the experiment and trains it (SIGINT / SIGTERM: stop_on_signals;
    before step 1 one ends the process at once, but in a Jupyter kernel), printing its lines.
    Returns the steps done."""
    started = time.perf_counter() - (process_age() or 0.0)  # "done in" counts the whole process
    process, processes = jax.process_index(), jax.process_count()
    experiment.train_config(config)  # every key and value checked before anything loads or compiles
    check_start(config)  # a config that needs a warm start (model.require_init_from) has one
    say = print if process == 0 else lambda *_, **__: None
    if processes > 1:
        say(f"{processes} processes, {jax.device_count()} devices", flush=True)
    say(f"config {config_file} -> {workdir}", flush=True)
    path = Path(workdir)
    if resume:
        check_resumable(path)
    # Taken before the slow part, so that a second run on the workdir is refused at once.
    with WorkdirLock(path, say) if process == 0 else contextlib.nullcontext() as lock:
        # A stop before step 1 ends the process at once, compiling or not: nothing to save.
        with stop_on_signals(exit_before_start=_may_exit()) as stop:
            stop.resumed = resume
            if lock is not None:
                stop.on_exit_before_start(lock.release)
            exp = experiment.build(config)
            done = train(exp, path, resume=resume, stop=stop, started=started)
    say(f"{done}/{config.steps} steps; workdir {workdir}", flush=True)
    return done


def run_sft(config: experiment.ConfigDict, workdir: Path, *, resume: bool = False,
            config_file: str = "") -> int:
    """What `python experiments/sft.py` does once its flags are parsed: an SFT experiment
    (starpo_jax.run.sft.build: its step is a supervised step; its evaluations add
    val/sft/heldout/loss) trained by `train`. A fresh run first writes sft.write_demos
    demonstrations to <workdir>/demos.jsonl (if > 0) and, with eval_every and val_before_train,
    evaluates the initial policy (the "before" numbers: printed, written to before.json and
    logged at step 0). Returns the steps done."""
    sft_lib.split_config(config)  # every key and value checked before anything loads or compiles
    print(f"config {config_file} -> {workdir}", flush=True)
    # As run's: a stop before step 1 ends the process at once; the demonstrations and "before"
    # numbers of a fresh run then go with it.
    with WorkdirLock(workdir, print) as lock, \
            stop_on_signals(exit_before_start=_may_exit()) as stop:
        stop.resumed = resume
        stop.on_exit_before_start(lock.release)
        existed = {p.name for p in workdir.iterdir()}
        if not resume:
            stop.on_exit_before_start(lambda: _forget(workdir, existed))
        exp = sft_lib.build(config)
        fresh = not resume and not (workdir / RUN_CONFIG_FILE).exists()
        if config.sft.write_demos and fresh:
            workdir.mkdir(parents=True, exist_ok=True)
            with announce.phase(f"writing {config.sft.write_demos} demonstrations"):
                count = exp.write_demos(workdir / "demos.jsonl", config.sft.write_demos)
            print(f"{count} demonstrations -> {workdir / 'demos.jsonl'}", flush=True)
        before = None
        if fresh and config.eval_every and config.val_before_train:
            before = exp.evaluator().evaluate(exp.state.actor).metrics
            print(f"evaluation before SFT:\n{summary_table(before)}", flush=True)
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "before.json").write_text(json.dumps(before, indent=2) + "\n")
        done = train(exp, workdir, resume=resume, stop=stop, before=before)  # logged at step 0
        if stop.is_set() and not resume and done == 0:  # stopped before step 1 (train's line)
            _forget(workdir, existed)
    print(f"{done}/{config.steps} steps; workdir {workdir}", flush=True)
    return done


def evaluate_workdir(workdir: Path, step: int | None = None,
                     overrides: Mapping[str, Any] | None = None) -> tuple[int, dict[str, float]]:
    """Evaluates checkpoint `step` (default: the newest) of the run in `workdir`, prints the
    table and writes eval_step_<N>.json and samples/eval_step_<N>.txt. Returns (step, metrics)."""
    config = evaluated_config(workdir, overrides or {})
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
    return evaluate_experiment(experiment.build(config), workdir, step)


def evaluate_policy_workdir(workdir: Path, policy: str,
                            overrides: Mapping[str, Any] | None = None) -> dict[str, float]:
    """A scripted policy (rollout.policies.POLICY_NAMES: "random", "solver") evaluated on the
    held-out states of the run in `workdir` (the same states as its own evaluations: no
    checkpoint is read), as experiment.policy_baseline. Prints the table and writes
    eval_policy_<policy>.json. Envs the policy cannot play are left out."""
    config = evaluated_config(workdir, overrides or {})
    from starpo_jax.rollout.policies import POLICY_NAMES
    if policy not in POLICY_NAMES:
        raise ValueError(f"--policy {policy!r} is invalid; valid: one of {POLICY_NAMES}")
    exp = experiment.build(config)
    evaluation = experiment.eval_config(exp.config)
    episodes = evaluation.episodes
    with announce.phase(f"playing the {policy} policy on {episodes} held-out initial states"):
        metrics = experiment.policy_baseline(exp, policy)
    if not metrics:
        raise ValueError(f"--policy {policy!r}: it plays none of this run's eval envs")
    print(f"{workdir}, the {policy} policy: {episodes} held-out initial states per env\n"
          f"{summary_table(metrics)}", flush=True)
    out = {"policy": policy, "eval": dataclasses.asdict(evaluation), "metrics": metrics}
    (workdir / f"eval_policy_{policy}.json").write_text(json.dumps(out, indent=2) + "\n")
    return metrics


def evaluate_experiment(exp: experiment.Experiment, workdir: Path, step: int | None = None,
                        ) -> tuple[int, dict[str, float]]:
    """evaluate_workdir with the run's experiment already built (its config's eval section
    applies)."""
    directory = workdir / "checkpoints"
    checkpoints = Checkpoints(directory, 0, exp.config.keep_checkpoints)
    try:
        step = checkpoints.latest_step if step is None else step
        if step is None:
            raise FileNotFoundError(f"{directory} holds no checkpoint")
        with announce.phase(f"restoring step {step}", f" from {checkpoints.directory}"):
            state = checkpoints.restore(step, like=exp.state)
    finally:
        checkpoints.close()
    evaluator = experiment.build_evaluator(exp)
    result = evaluator.evaluate(state.actor)
    print(f"{workdir}, step {step}: {evaluator.config.episodes} held-out initial states per env\n"
          f"{summary_table(result.metrics)}", flush=True)
    out = {"step": step, "eval": dataclasses.asdict(evaluator.config), "metrics": result.metrics}
    (workdir / f"eval_step_{step}.json").write_text(json.dumps(out, indent=2) + "\n")
    samples = workdir / "samples" / f"eval_step_{step:06d}.txt"
    samples.parent.mkdir(exist_ok=True)
    samples.write_text(evaluator.samples_text(result))
    return step, result.metrics
