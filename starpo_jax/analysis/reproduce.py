"""The reproduction suite: train, compare StarPO with StarPO-S, and report (issue 15):
experiments/reproduce.py calls `reproduce`.

    python experiments/reproduce.py --suite cpu --workdir results/cpu [--dry-run]
    python experiments/reproduce.py --suite paper --workdir results/paper   # GPUs: the paper's
    python experiments/reproduce.py --suite cpu --workdir results/cpu --report-only
    python experiments/reproduce.py --suite cpu --workdir results/cpu --only filter_ablation

A suite is a fixed list of experiments (starpo_jax.analysis.suite): 1. the Echo Trap on Bandit
(vanilla StarPO against StarPO-S), 2. multi-turn learning on FrozenLake and Sokoban from an SFT
start
(StarPO-S with PPO and GRPO, vanilla StarPO; success and valid actions before and after training
on held-out and out-of-distribution states, next to the random policy, the solver and the SFT
start), 2b. its Echo Trap on Sokoban, 3. the uncertainty filter's ablation (keep ratio 1.0 / 0.5
/ 0.25 and std_rev), 4. GiGPO against GRPO on Sokoban. Each
experiment is a set of seeded runs of named settings; a setting shared by two experiments (the
StarPO-S run is experiment 3's keep 0.25) is trained once. Every run goes through run.py's training
loop (`runner.train`: metrics.jsonl, checkpoints, evaluations, the collapse monitor) in its own
directory, workdir/runs/<setting>/seed_<s>/, with `done.json` once finished. The seeds of a setting
run one after another on the setting's one compiled step (a run's checkpoints, resume and
evaluations are run.py's, per run; on a 2-core CPU vmapped seeds are break-even per step anyway,
README "Seeded sweeps"). Runs that evaluate before training write eval_step_0.json (the Table-4
"before" column) from the same evaluator runner.train uses.

SFT stage: a setting with a `start` starts every seed from the newest checkpoint of its start's
SFT run (starpo_jax.run.sft, seed 0, trained first; model.init_from), and its eval_step_0.json is a
copy of that run's last evaluation (the same weights and held-out states: eval.seed). An SFT
run's checkpoints are kept when it finishes (its config keeps only the newest), and before it
trains its baselines.json holds the random policy's and the solver's evaluation on the same held-out
states (experiment.policy_baseline). A setting's `final_eval` evaluates the final weights once
more (eval_final.json, merged into the run's last row), on the (env, mode) pairs its own
evaluations did not cover.

Resumable: a finished run is skipped, an unfinished one resumes from its newest checkpoint (run.py
--resume: the same numbers as a run never stopped); a finished run's checkpoints are then deleted
(GiBs per SmolLM2 run) unless --keep-checkpoints. `--set KEY=VALUE` overrides a config key in every
setting (e.g. model.source for the paper suite on GPUs). XLA's compilation cache is kept in
workdir/xla_cache (unless JAX_COMPILATION_CACHE_DIR is set), so a resumed suite does not compile
again. Console lines (run.py's per-step lines and the suite's own) are also written to
workdir/reproduce.log. At the end (and with --report-only, from the run directories alone)
starpo_jax.analysis.report writes workdir/report.md, results.csv and figures/.

`--dry-run` prints the plan (settings, seeds, steps, evaluations) and the estimated wall time
from per-step estimates (suites.STEP_SECONDS: SmolLM2 on a quiet 2-core CPU, measured on Bandit,
scaled from a measured FrozenLake step for the grids).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TextIO

import jax
from ml_collections import config_dict

from starpo_jax.analysis import report
from starpo_jax.run import experiment, loop as runner
from starpo_jax.run import sft as sft_lib
from starpo_jax.analysis import sweep as sweep_lib
from starpo_jax.run.writers import METRICS_FILE, format_duration, human_duration
from starpo_jax.analysis.suite import (SFT_SEED, Setting, Suite, estimate_seconds, final_pairs,
                                       plan_text)
from starpo_jax.run.workdir import check_config, write_atomically

ROOT = Path(__file__).resolve().parents[2]
DONE, BEFORE, FINAL = "done.json", "eval_step_0.json", "eval_final.json"
BASELINES = "baselines.json"  # an SFT run's: the random policy and the solver, same states
POLICIES = ("random", "solver")
# A run whose step does not fit the memory free at its start waits this long for it, in all
# (--memory-wait), trying again every MEMORY_POLL_SECONDS: a night's suite outlives a
# neighbour's job instead of stopping at the first run that finds too little.
MEMORY_WAIT_SECONDS = 2 * 3600.0
MEMORY_POLL_SECONDS = 60.0
SFT_METRICS = "val/sft/"  # an SFT run's own evaluation metrics (its held-out loss)
ConfigDict = config_dict.ConfigDict

# --- running ---------------------------------------------------------------------------------

def run_dir(workdir: Path, setting: str, seed: int) -> Path:
    return workdir / "runs" / setting / f"seed_{seed}"


def for_seed(exp: experiment.Experiment, config: ConfigDict) -> experiment.Experiment:
    """`exp` (built for another seed of the same setting) for config.seed, stepping with the
    same compiled step: the run key, init key and step-0 state experiment.build derives from the
    seed. LoRA adapters (initialised at build from the seed) and multi-device runs: built
    again."""
    if exp.train.lora.rank or exp.mesh is not None:
        return experiment.build(config)
    init_key, key = experiment.run_keys(config.seed)
    seeded = dataclasses.replace(exp, config=config, key=key, init_key=init_key)
    seeded.state = seeded.fresh_state()
    return seeded


def run_config(setting: Setting, seed: int, workdir: Path) -> ConfigDict:
    """The setting's config for `seed`, starting from its start's SFT run if it has one."""
    config = setting.config(seed)
    if setting.start is not None:
        config.model.init_from = str(run_dir(workdir, setting.start.name, SFT_SEED))
    return config


def _without_sft(config: ConfigDict) -> ConfigDict:
    return sft_lib.split_config(config)[0] if "sft" in config else config


def final_evaluation(exp: experiment.Experiment, setting: Setting,
                     say: Callable[[str], None] = lambda line: None) -> dict[str, float]:
    """The setting's final evaluation of exp's current policy: the (env, mode) pairs of
    final_eval its own evaluations do not cover, on the same held-out states. Says each
    pair's success and time as it ends (a pair of 64 five-turn rollouts takes minutes)."""
    config = _without_sft(exp.config)
    metrics = {}
    pairs = final_pairs(setting, config)
    for mode in dict.fromkeys(mode for _, mode in pairs):
        envs = tuple(env for env, m in pairs if m == mode)
        c = setting.final_config(config)
        c.eval.update(envs=",".join(envs), modes=mode)
        evaluator = experiment.build_evaluator(dataclasses.replace(exp, config=c))
        for env in envs:
            start = time.perf_counter()
            found = evaluator.evaluate(exp.state.actor, envs=(env,)).metrics
            metrics.update(found)
            success = found.get(f"val/{env}/{mode}/success", float("nan"))
            say(f"  final evaluation {env}/{mode}: success={success:.3g} "
                f"({format_duration(time.perf_counter() - start)})")
    return metrics


def baselines(exp: experiment.Experiment, setting: Setting) -> dict[str, dict[str, float]]:
    """policy -> experiment.policy_baseline on the held-out states of the setting's final evaluation
    (its envs and modes)."""
    config = _without_sft(exp.config)
    final = dataclasses.replace(exp, config=setting.final_config(config) or config)
    return {policy: experiment.policy_baseline(final, policy) for policy in POLICIES}


def _finished(path: Path) -> dict | None:
    return json.loads((path / DONE).read_text()) if (path / DONE).exists() else None


def delete_checkpoints(checkpoints: Path) -> None:
    """Deletes a finished run's checkpoint directory; where it is a symlink (checkpoints kept
    on another disk), the directory it points to, then the link (rmtree refuses a link, and
    ignoring that left GiBs behind)."""
    target = checkpoints.resolve()
    shutil.rmtree(target, ignore_errors=True)
    if checkpoints.is_symlink():
        checkpoints.unlink()


def _headline(metrics: dict[str, float], ends: tuple[str, ...]) -> str:
    """The metrics named with one of `ends`, but not the failure classes (failure/success
    repeats success)."""
    return ", ".join(f"{k}={v:.3g}" for k, v in metrics.items()
                     if k.endswith(ends) and "/failure/" not in k)


def waiting_for_memory(train: Callable[[], int], stop: threading.Event,
                       say: Callable[[str], None], wait_seconds: float,
                       poll_seconds: float = MEMORY_POLL_SECONDS,
                       clock: Callable[[], float] = time.monotonic) -> int | None:
    """train() (-> steps done), tried again every `poll_seconds` while it raises MemoryError
    (the step does not fit the memory free now: a neighbour's job may hold it), for up to
    `wait_seconds` in all, each wait said in one line; then the MemoryError is raised, saying
    how long it waited. Returns None when `stop` is set during a wait (the same command resumes
    the suite)."""
    began = clock()
    while True:
        try:
            return train()
        except MemoryError as error:
            waited = clock() - began
            if waited + poll_seconds > wait_seconds:
                if not wait_seconds:
                    raise
                raise MemoryError(f"{error} (waited {human_duration(waited)} for free memory, "
                                  f"--memory-wait {human_duration(wait_seconds)})") from None
            say(f"  not enough free memory now ({str(error).split('. ')[0]}); waiting "
                f"{human_duration(poll_seconds)} and trying again (waited "
                f"{human_duration(waited)} of up to {human_duration(wait_seconds)})")
            if stop.wait(poll_seconds):
                return None


def _train_one(exp: experiment.Experiment, path: Path, setting: Setting, stop: threading.Event,
               say: Callable[[str], None], keep_checkpoints: bool,
               memory_wait: float = 0.0) -> bool:
    """One run into `path`: the step-0 evaluation if asked and missing, then runner.train
    (resuming from a checkpoint if there is one; waiting up to `memory_wait` seconds while its
    step does not fit the free memory: waiting_for_memory), then done.json with its wall time
    and, unless `keep_checkpoints`, its checkpoints deleted (a SmolLM2 run's are GiBs; a
    finished run is never resumed). Returns whether the run finished (not when `stop` was set
    or the collapse monitor stopped it)."""
    start = time.perf_counter()
    path.mkdir(parents=True, exist_ok=True)
    partial = path / "partial_seconds.json"  # wall time of earlier, interrupted attempts
    earlier = json.loads(partial.read_text()) if partial.exists() else 0.0
    if setting.sft and setting.final_eval and not (path / BASELINES).exists():
        write_atomically(path / BASELINES, json.dumps(baselines(exp, setting), indent=1) + "\n")
    if setting.eval_before and not (path / BEFORE).exists():
        if setting.start is not None:  # the start's weights and held-out states: its numbers
            metrics = last_evaluation(run_dir(path.parents[2], setting.start.name, SFT_SEED))
        else:
            metrics = experiment.build_evaluator(exp).evaluate(exp.state.actor).metrics
        write_atomically(path / BEFORE, json.dumps(metrics, indent=1) + "\n")
        say("  before training: " + _headline(metrics, ("/success", "/action_is_valid")))
    def train() -> int:
        resume = (path / "checkpoints").exists() and any((path / "checkpoints").iterdir())
        return runner.train(exp, path, resume=resume, stop=stop)

    done = waiting_for_memory(train, stop, say, memory_wait)
    seconds = earlier + time.perf_counter() - start
    if done is None or done < exp.config.steps:
        write_atomically(partial, json.dumps(seconds))
        return False
    if setting.final_eval and not (path / FINAL).exists():
        metrics = final_evaluation(exp, setting, say)
        write_atomically(path / FINAL, json.dumps(metrics, indent=1) + "\n")
        say("  final evaluation: " + _headline(metrics, ("/success",)))
        seconds = earlier + time.perf_counter() - start
    write_atomically(path / DONE, json.dumps({"steps": done, "seconds": seconds}) + "\n")
    # An SFT run's newest checkpoint is the start of the runs after it: kept.
    if not keep_checkpoints and not setting.sft:
        delete_checkpoints(path / "checkpoints")
    return True


def run_suite(suite: Suite, workdir: Path, say: Callable[[str], None],
              stop: threading.Event | None = None, keep_checkpoints: bool = False,
              memory_wait: float = MEMORY_WAIT_SECONDS) -> bool:
    """Trains every run of `suite` not finished in `workdir` (see the module docstring).
    Returns False when a run stopped early (`stop` set, SIGINT / SIGTERM in main, or the
    collapse monitor's action): the same command resumes it. A run whose step does not fit the
    free memory waits for it, up to `memory_wait` seconds (waiting_for_memory)."""
    stop = stop or threading.Event()
    todo = [(s.name, seed) for s, seeds in suite.settings() for seed in seeds]
    estimate = {s.name: estimate_seconds(suite, s, 1) or 0.0 for s, _ in suite.settings()}
    start, measured, estimated = time.perf_counter(), 0.0, 0.0
    left = sum(estimate[name] for name, seed in todo
               if not _finished(run_dir(workdir, name, seed)))
    for setting, seeds in suite.settings():
        exp = None
        for seed in seeds:
            tag = f"[run {todo.index((setting.name, seed)) + 1}/{len(todo)}] {setting.name} " \
                  f"seed {seed}"
            path = run_dir(workdir, setting.name, seed)
            config = run_config(setting, seed, workdir)
            if _finished(path):
                # A finished run made with another config is refused, not reused.
                check_config(path / "config.json", config.to_dict(), True,
                             has_checkpoints=True,
                             **sft_lib.resume_rules(config, runner.RESUMABLE_CHANGES))
                say(f"{tag}: finished earlier, skipped")
                continue
            say(f"{tag}: {'resuming' if (path / 'checkpoints').exists() else 'starting'} "
                f"-> {path}")
            run_start = time.perf_counter()
            if setting.sft:
                exp = sft_lib.build(config)
            else:
                exp = experiment.build(config) if exp is None else for_seed(exp, config)
            if not _train_one(exp, path, setting, stop, say, keep_checkpoints, memory_wait):
                say(f"{tag}: stopped at step {exp.steps_done}/{config.steps}; the same command "
                    "resumes it")
                return False
            took = time.perf_counter() - run_start
            left -= estimate[setting.name]
            measured += took
            estimated += estimate[setting.name]
            # The estimate of what is left, scaled by how the finished runs compared with theirs.
            eta = format_duration(left * measured / estimated) if estimated else "?"
            say(f"{tag}: done in {format_duration(took)} (estimated "
                f"{format_duration(estimate[setting.name])}); suite "
                f"{format_duration(time.perf_counter() - start)} so far, ETA {eta}")
    return True


# --- the report ------------------------------------------------------------------------------

def load_rows(path: Path) -> list[dict]:
    """A run's metrics.jsonl lines, preceded by its step-0 evaluation (step 0) if any, its
    final evaluation (if any) merged into its last line."""
    rows = [json.loads(line) for line in (path / METRICS_FILE).read_text().splitlines()
            if line.strip()]
    if (path / FINAL).exists():
        rows[-1] = {**rows[-1], **json.loads((path / FINAL).read_text())}
    if (path / BEFORE).exists():
        rows.insert(0, {"step": 0, **json.loads((path / BEFORE).read_text())})
    return rows


def last_evaluation(path: Path) -> dict[str, float]:
    """The val/ metrics of a run's last evaluation (its final evaluation's included; an SFT
    run's held-out loss val/sft/... left out: it is no env's)."""
    evaluations = report.evaluations(load_rows(path))
    last = evaluations[max(evaluations)] if evaluations else {}
    return {k: v for k, v in last.items() if not k.startswith(SFT_METRICS)}


def references(spec_settings: Sequence[Setting], workdir: Path) -> dict[str, dict[str, float]]:
    """Table-4 reference rows of the settings' starts that finished: label -> val/ metrics of
    the random policy, the solver and the SFT start (one evaluation each)."""
    out = {}
    starts = {s.start.name: s.start for s in spec_settings if s.start is not None}
    for start in starts.values():
        path = run_dir(workdir, start.name, SFT_SEED)
        if not _finished(path):
            continue
        env = start.config().env.name
        if (path / BASELINES).exists():
            for policy, metrics in json.loads((path / BASELINES).read_text()).items():
                out[f"{policy} policy ({env})" if policy == "random" else f"{policy} ({env})"] = \
                    metrics
        out[f"SFT start ({env})"] = last_evaluation(path)
    return out


def results(suite: Suite, workdir: Path) -> list[report.ExperimentResult]:
    """The finished runs of every experiment as report.ExperimentResults (runs not finished
    are left out; a setting with none is left out)."""
    out = []
    for spec in suite.experiments:
        runs, wall = {}, {}
        for setting in spec.settings:
            paths = {seed: run_dir(workdir, setting.name, seed) for seed in spec.seeds}
            done = {seed: _finished(p) for seed, p in paths.items() if _finished(p)}
            if done:
                runs[setting.name] = {seed: load_rows(paths[seed]) for seed in done}
                wall[setting.name] = {seed: d["seconds"] for seed, d in done.items()}
        out.append(report.ExperimentResult(
            spec.name, spec.title, spec.kind, spec.about, runs,
            labels={s.name: s.label for s in spec.settings},
            config={s.name: _shown_config(s) for s in spec.settings}, wall_seconds=wall,
            references=references(spec.settings, workdir)))
    return out


def _shown_config(setting: Setting) -> dict[str, Any]:
    """The keys that describe a setting in the report: shape, algorithm, learning rate,
    filter, loss, and its own overrides."""
    c = setting.config()
    shown = {"env": c.env.name, "algo": c.algo, "model": c.model.source,
             "rollouts": f"{c.rollout.groups}x{c.rollout.group_size}",
             "reply_tokens": c.rollout.reply_tokens, "nothink": c.nothink, "steps": c.steps,
             "actor_lr": c.optim.actor_lr}
    if setting.start is not None:
        shown["start"] = setting.start.name
    return {**shown, **setting.overrides}


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        # The suite's own outputs (results/, rewritten by the run being reported) are not
        # changes to the code that produced them.
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "-uno", "--",
                                ".", ":(exclude)results"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return out + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def machine() -> str:
    devices = jax.devices()
    return (f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPU cores, "
            f"{len(devices)} {devices[0].platform} device(s) ({devices[0].device_kind}), "
            f"Python {platform.python_version()}, jax {jax.__version__}")


def write_suite_report(suite: Suite, name: str, workdir: Path,
                       invocations: Sequence[float]) -> list[Path]:
    meta = {"command": f"python experiments/reproduce.py --suite {name} --workdir {workdir}",
            "commit": _commit(), "machine": machine(),
            "suite wall time": f"{format_duration(sum(invocations))} over {len(invocations)} "
                               "invocation(s) of the command"}
    return report.write_report(workdir, results(suite, workdir), meta)


# --- the command -----------------------------------------------------------------------------

@contextlib.contextmanager
def tee_output(path: Path) -> Iterator[None]:
    """Everything written to file descriptors 1 and 2 (run.py's lines, the suite's, XLA's) is
    also appended to `path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    read, write = os.pipe()
    saved = os.dup(1), os.dup(2)

    def pump() -> None:
        with open(path, "ab") as log:
            while chunk := os.read(read, 65536):
                os.write(saved[0], chunk)
                log.write(chunk)
                log.flush()

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    os.dup2(write, 1)
    os.dup2(write, 2)
    os.close(write)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)  # the pipe's last writer closed: the pump ends
        thread.join()
        os.close(read)
        os.close(saved[0])
        os.close(saved[1])


def _invocations(workdir: Path, seconds: float | None = None) -> list[float]:
    """The wall times of every invocation that trained in `workdir` (appending `seconds`)."""
    path = workdir / "invocations.json"
    times = json.loads(path.read_text()) if path.exists() else []
    if seconds is not None:
        times.append(seconds)
        write_atomically(path, json.dumps(times) + "\n")
    return times


def reproduce(suite: Suite, name: str, workdir: Path, *, dry_run: bool = False,
              report_only: bool = False, keep_checkpoints: bool = False,
              overrides: Sequence[str] = (), only: Sequence[str] = (),
              stream: TextIO | None = None, memory_wait: float = MEMORY_WAIT_SECONDS) -> None:
    """What `experiments/reproduce.py --suite <name>` does with `suite` (SUITES[name]()): prints
    the plan; unless `dry_run`, trains its runs not finished in `workdir` (unless
    `report_only`; `only`: the experiments named, by Spec.name) and writes the report.
    `overrides`: KEY=VALUE config overrides for every setting (--set). `memory_wait`: how
    long a run waits for free memory (--memory-wait; run_suite)."""
    if overrides:
        base = suite.experiments[0].settings[0].config()
        suite = suite.with_overrides(sweep_lib.parse_overrides(overrides, base))
    try:  # after --set: the runs trained carry its overrides
        trained = suite.only(list(only)) if only else suite
    except ValueError as error:
        raise ValueError(f"--only: {error}") from None

    def say(line: str) -> None:
        print(line, file=stream or sys.stdout, flush=True)

    def finished(setting: str, seed: int) -> bool:
        return _finished(run_dir(workdir, setting, seed)) is not None

    say(plan_text(suite, name, finished).rstrip())
    if dry_run:
        return
    workdir.mkdir(parents=True, exist_ok=True)
    if not report_only:
        if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
            jax.config.update("jax_compilation_cache_dir", str(workdir / "xla_cache"))
        from absl import logging
        logging.set_verbosity(logging.WARNING)  # orbax's INFO lines would bury the progress
        start = time.perf_counter()
        with tee_output(workdir / "reproduce.log"), runner.stop_on_signals() as stop:
            try:
                finished = run_suite(trained, workdir, say, stop, keep_checkpoints,
                                     memory_wait)
            finally:
                _invocations(workdir, time.perf_counter() - start)
        if not finished:
            return
    paths = write_suite_report(suite, name, workdir, _invocations(workdir))
    say(f"wrote {paths[0]}, {paths[1]} and {len(paths) - 2} figures in {workdir / 'figures'}")
