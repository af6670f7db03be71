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
Before step 1 the step is compiled and sized against the free memory: memory knobs left unset
are chosen then (starpo_jax.sizing.autofit; one line says what and why, config.json's "auto_memory"
records it, and a resumed run takes it again), and a step that cannot fit stops with the
settings that shrink it; then a line gives the step-time estimate and the whole run's, pointing
at a CPU-sized config of the same game when the run would take far longer than a CPU session
(it still runs). stop_on_signals answers SIGINT / SIGTERM at once, even inside a long compiled
step: the run saves after the current step and returns; a second one exits at once (status
128 + the signal), the newest complete checkpoint being the resume point.
Faults (RunFault, FileExistsError, MemoryError: one line each, nothing half-written is ever
loaded): resuming a workdir that holds no run, a workdir path that is a file, a workdir in use
by another live run (run.lock; a killed run's lock is taken over), unwritable or without space
for a checkpoint, made by another config, or with a damaged checkpoint is refused before
training; a failed save stops the run with the previous checkpoint kept; `max_skipped_steps`
steps in a row that dropped updates as non-finite (train.apply_if) save and stop the run. A
kill at any moment (kill -9 included) leaves the newest complete checkpoint to resume from
(experiments/fault_kill.py tries it).
The collapse monitor (config monitor.*, starpo_jax.run.monitor) prints its alerts and appends them
to alerts.jsonl; its action "stop" or "raise_filter" saves and ends the run.
In a multi-process run every process steps and saves checkpoints (the workdir must be shared),
process 0 alone writes config.json, metrics, events, alerts, samples and the console lines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import jax

from starpo_jax.run import experiment
from starpo_jax.run import sft as sft_lib
from starpo_jax.run.checkpoint import Checkpoints
from starpo_jax.run.cli import CONFIG_DIR
from starpo_jax.run.distributed import any_process, min_over_processes
from starpo_jax.run.evaluation import Evaluator, summary_table
from starpo_jax.run.writers import WandbWriter, Writers, human_duration, open_writers, process_age
from starpo_jax.run.monitor import RunMonitor
from starpo_jax.run.schema import AUTO_MEMORY, RUN_CONFIG_FILE, evaluated_config
from starpo_jax.train.step import SKIPPED_UPDATES
from starpo_jax.run.workdir import (RunFault, WorkdirLock, check_config, check_free_space,
                                    check_resumable, write_atomically)

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
RESUMABLE_CHANGES += (AUTO_MEMORY,)
# Where metrics also go, and the module that registers the envs (env.name is compared).
RESUMABLE_CHANGES += ("logging", "env.module")
# A run whose step-time estimate exceeds this is pointed at a CPU-sized config (it still runs).
CPU_SESSION_SECONDS = 3 * 3600


class StopRequests(threading.Event):
    """Set by the first SIGINT / SIGTERM (the loop saves after its current step and stops).

    The signals are heard at once, even while the main thread is inside the compiled step (a
    Python signal handler runs only between the main thread's bytecodes, so it would wait
    for the step, hours at the paper's shape on a CPU): Python's C-level handler writes each
    signal's number to a pipe (signal.set_wakeup_fd), which a watcher thread reads. The first
    prints that the stop was heard and about how long the step has left (`step_started`,
    `step_seconds`: set by the loop); a later SIGINT (Ctrl-C again) ends the process at once
    with status 128 + SIGINT, the newest complete checkpoint (`saved_step`) left as the resume
    point (saves are atomic; the lock file keeps this run's name and the next run takes it
    over). A later SIGTERM does not: one kill often arrives twice (`timeout` signals the
    process and then its process group; a scheduler may signal every process of the job),
    and the save it asked for is kept; a supervisor that will not wait sends SIGKILL.
    """

    def __init__(self, exit: Callable[[int], None] = os._exit):
        super().__init__()
        self.step_started: float | None = None  # time.perf_counter() when the step began
        self.step_seconds: float | None = None  # what a step is expected to take
        self.saved_step: int | None = None  # newest complete checkpoint
        self._exit = exit

    def heard(self, signum: int) -> None:
        """One SIGINT / SIGTERM (called on the watcher thread)."""
        name = signal.Signals(signum).name
        if self.is_set() and signum == signal.SIGTERM:
            print(f"\n{name} again: still saving after this step (Ctrl-C stops at once)",
                  flush=True)
            return
        if self.is_set():
            saved = (f"the newest complete checkpoint, step {self.saved_step}, is where --resume "
                     "continues" if self.saved_step is not None else
                     "no checkpoint was saved yet: --resume starts again from step 0")
            print(f"\n{name} again: stopping now without saving; {saved}", flush=True)
            self._exit(128 + signum)
            return
        self.set()
        print(f"\n{name}: stop requested: saving after this step{self._left()}; press Ctrl-C "
              "again to stop now", flush=True)

    def _left(self) -> str:
        if self.step_started is None or self.step_seconds is None:
            return ""
        left = self.step_seconds - (time.perf_counter() - self.step_started)
        if left <= 0:
            return " (it has run past the step-time estimate)"
        return f" (about {human_duration(left)} left by the step-time estimate)"


@contextmanager
def stop_on_signals(exit: Callable[[int], None] = os._exit) -> Iterator[StopRequests]:
    """StopRequests answering SIGINT / SIGTERM while the context is open (from the main
    thread; a SIGINT after the first signal calls `exit(128 + SIGINT)`); the previous handlers
    and wakeup fd come back on exit."""
    stop = StopRequests(exit)
    read, write = os.pipe()
    os.set_blocking(write, False)  # set_wakeup_fd's contract: the C handler must never block

    def watch() -> None:
        while data := os.read(read, 64):
            for signum in data:
                if signum in (signal.SIGINT, signal.SIGTERM):
                    stop.heard(signum)
        os.close(read)

    previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)}
    previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    threading.Thread(target=watch, name="stop-watcher", daemon=True).start()
    try:
        yield stop
    finally:
        signal.set_wakeup_fd(previous_fd)
        for s, h in previous.items():
            signal.signal(s, h)
        os.close(write)  # the watcher reads the end of the pipe and ends


def train(exp: experiment.Experiment, workdir: Path, *, resume: bool = False,
          stop: threading.Event | None = None, started: float | None = None) -> int:
    """Runs exp.config.steps iterations of `exp` (resuming from workdir's newest checkpoint if
    `resume`), logging and checkpointing under `workdir`. Stops early, after saving, when `stop`
    is set or the collapse monitor's action asks it to (starpo_jax.run.monitor); a StopRequests
    `stop` is told each step's start and expected time and the newest checkpoint. `started`
    (a time.perf_counter() value): where the closing "done in" counts from (default: when
    logging begins). Returns the number of steps done. In a multi-process run only process 0
    writes logs and holds the workdir's lock; all save checkpoints. Raises RunFault on the
    faults of the module docstring."""
    primary = jax.process_index() == 0
    with WorkdirLock(workdir) if primary else contextlib.nullcontext():
        return _train(exp, workdir, resume, stop, primary, started)


def _train(exp: experiment.Experiment, workdir: Path, resume: bool, stop: threading.Event | None,
           primary: bool, started: float | None) -> int:
    c = exp.config
    config_path = workdir / RUN_CONFIG_FILE
    # Told what the loop does, for the stop message (a plain Event or None: nobody reads it).
    watch = stop if isinstance(stop, StopRequests) else StopRequests()
    checkpoints = Checkpoints(workdir / "checkpoints", c.checkpoint_every, c.keep_checkpoints)
    check_config(config_path, c.to_dict(), resume,
                 has_checkpoints=checkpoints.latest_step is not None,
                 **sft_lib.resume_rules(c, RESUMABLE_CHANGES))
    if checkpoints.latest_step is not None and not resume:
        raise FileExistsError(f"{workdir} already holds checkpoints (newest: step "
                              f"{checkpoints.latest_step}); pass --resume or another --workdir")
    exp.state = exp.fresh_state() if exp.steps_done else exp.state
    if resume:
        exp.state = checkpoints.restore_latest(like=exp.state) or exp.state
    watch.saved_step = checkpoints.latest_step if resume else None
    check_free_space(workdir, sum(x.nbytes for x in jax.tree.leaves(exp.state)))
    record = _check_memory(exp, workdir if resume else None, primary)
    watch.step_seconds = exp.estimated_step_seconds()
    if primary and watch.step_seconds is not None:
        print("\n".join(cost_lines(watch.step_seconds, c.steps - exp.steps_done, c.env.name)),
              flush=True)
    saved = json.loads(c.to_json())
    if primary:
        if record:
            saved[AUTO_MEMORY] = record
        write_atomically(config_path, json.dumps(saved, indent=2) + "\n")
    first = exp.steps_done
    skipped = 0  # steps in a row that dropped updates
    more = (WandbWriter(workdir, c.logging.wandb_project, c.logging.wandb_name, saved),) \
        if c.logging.wandb and primary else ()
    writers = open_writers(workdir, c.steps, first, console_every=c.log_every, started=started,
                           more=more) if primary else Writers([])
    monitor = RunMonitor(workdir, c if primary else _silent_monitor(c), first)
    evaluator = exp.evaluator() if c.eval_every or c.sample_every else None
    try:
        while exp.steps_done < c.steps and not any_process(
                bool(stop and stop.is_set()) or monitor.stop_reason is not None):
            watch.step_started = start = time.perf_counter()
            metrics = exp.step()
            watch.step_started = None
            watch.step_seconds = metrics["timing/step_seconds"] = time.perf_counter() - start
            if evaluator is not None:
                metrics.update(evaluate(evaluator, exp, workdir))
            metrics.update(monitor.observe(exp.steps_done, metrics))
            writers.write(exp.steps_done, metrics)
            if checkpoints.maybe_save(exp.state):
                watch.saved_step = exp.steps_done
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


def cost_lines(step_seconds: float, steps: int, env: str) -> list[str]:
    """What the run will cost by the step-time estimate, and, when that is far beyond a CPU
    session, the CPU-sized config of the same game (or the quickstart's)."""
    total = step_seconds * steps
    plural = "s" * (steps != 1)
    lines = [f"estimated time on this CPU: ~{human_duration(step_seconds)} a step, "
             f"~{human_duration(total)} for the {steps} step{plural} to run (autofit's step-time "
             "model of a 2-core CPU, every reply at its full token budget; evaluations not "
             "included)"]
    if total > CPU_SESSION_SECONDS:
        name = f"{env}_cpu.py" if (CONFIG_DIR / f"{env}_cpu.py").is_file() else "quickstart.py"
        game = "the same game" if name.startswith(env) else "a run"
        lines.append(f"that is far beyond a CPU session: experiments/configs/{name} is {game} "
                     f"sized for a CPU (python experiments/run.py --config {name} --workdir "
                     f"runs/{name[:-3]}); running what was asked")
    return lines


def _check_memory(exp: experiment.Experiment, workdir: Path | None, primary: bool) -> dict | None:
    """The step compiled and sized against the free memory before step 1 (experiment.check_memory:
    MemoryError when it cannot fit), unless the Experiment does not size its step
    (Experiment.sizes_its_step: check_memory=False, a host env, a swapped-in step). Memory
    knobs left unset take the settings recorded in the config.json of `workdir` (a resumed run
    steps as before) or are chosen now. Returns the record for config.json."""
    if not exp.sizes_its_step:
        return None
    previous = experiment.read_run_config(workdir)[1] if workdir is not None and \
        (workdir / RUN_CONFIG_FILE).is_file() else None
    if previous and exp.auto and exp.memory is None:
        experiment.pin_memory(exp, previous["settings"])
    plan = experiment.check_memory(exp, any_process, smallest=min_over_processes)
    if primary:
        chosen = exp.memory.line() if exp.memory else f"train step compiled: {plan}"
        print(chosen + (" (settings of the resumed run)" if previous else ""), flush=True)
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


def evaluate(evaluator: Evaluator, exp: experiment.Experiment, workdir: Path) -> dict[str, float]:
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


def run(config: experiment.ConfigDict, workdir: str | os.PathLike, *, resume: bool = False,
        config_file: str = "") -> int:
    """What `python experiments/run.py --config <config_file> --workdir <workdir>` does once its
    flags are parsed: checks `config` whole, takes the workdir's lock (a second run on it is
    refused at once), builds the experiment and trains it (SIGINT / SIGTERM: stop_on_signals),
    printing its lines. Returns the steps done."""
    started = time.perf_counter() - (process_age() or 0.0)  # "done in" counts the whole process
    process, processes = jax.process_index(), jax.process_count()
    experiment.train_config(config)  # every key and value checked before anything loads or compiles
    say = print if process == 0 else lambda *_, **__: None
    if processes > 1:
        say(f"{processes} processes, {jax.device_count()} devices", flush=True)
    say(f"config {config_file} -> {workdir}", flush=True)
    path = Path(workdir)
    if resume:
        check_resumable(path)
    # Taken before the slow part, so that a second run on the workdir is refused at once.
    with WorkdirLock(path, say) if process == 0 else contextlib.nullcontext():
        with stop_on_signals() as stop:
            exp = experiment.build(config)
            done = train(exp, path, resume=resume, stop=stop, started=started)
    say(f"{done}/{config.steps} steps; workdir {workdir}", flush=True)
    return done


def run_sft(config: experiment.ConfigDict, workdir: Path, *, resume: bool = False,
            config_file: str = "") -> int:
    """What `python experiments/sft.py` does once its flags are parsed: an SFT experiment
    (starpo_jax.run.sft.build: its step is a supervised step; its evaluations add
    val/sft/heldout/loss) trained by `train`. A fresh run first writes sft.write_demos
    demonstrations to <workdir>/demos.jsonl (if > 0) and, with eval_every, evaluates the initial
    policy (the "before" numbers: printed and written to before.json). Returns the steps done."""
    sft_lib.split_config(config)  # every key and value checked before anything loads or compiles
    print(f"config {config_file} -> {workdir}", flush=True)
    with WorkdirLock(workdir, print):
        exp = sft_lib.build(config)
        fresh = not resume and not (workdir / RUN_CONFIG_FILE).exists()
        if config.sft.write_demos and fresh:
            workdir.mkdir(parents=True, exist_ok=True)
            count = exp.write_demos(workdir / "demos.jsonl", config.sft.write_demos)
            print(f"{count} demonstrations -> {workdir / 'demos.jsonl'}", flush=True)
        if fresh and config.eval_every:
            before = exp.evaluator().evaluate(exp.state.actor).metrics
            print(f"evaluation before SFT:\n{summary_table(before)}", flush=True)
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "before.json").write_text(json.dumps(before, indent=2) + "\n")
        with stop_on_signals() as stop:
            done = train(exp, workdir, resume=resume, stop=stop)
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
