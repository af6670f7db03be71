"""kill -9 a real training run at random moments, --resume it each time, and check that nothing
was lost: the killed-and-resumed run's metrics equal an uninterrupted run's, step for step.

    python experiments/fault_kill.py --kills 20            # prints a table, exit 1 on a failure

The run: experiments/run.py on tiny-random Bandit, a checkpoint every step, the newest 2 kept (so
old checkpoints are deleted every step too). Kills alternate between a random moment after the
run has logged a step and the moment a checkpoint's temporary directory appears (mid-save).
While the first run lives, a second run on the same workdir must be refused at once; each
relaunch must take over the killed run's lock, and its first step must follow the newest
complete checkpoint (a step directory orbax renamed into place), never a partial one.
Launches share a persistent JAX compilation cache, so only the first one compiles.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = ("--config.model.source=tiny-random", "--config.nothink=True",
             "--config.rollout.groups=2", "--config.rollout.group_size=2",
             "--config.rollout.reply_tokens=4", "--config.prompt.verify=0",
             "--config.checkpoint_every=1", "--config.keep_checkpoints=2",
             "--config.eval_every=0", "--config.sample_every=0", "--config.progress_after=0",
             "--config.check_memory=False", "--config.optim.actor_lr=0.001")
TMP_SUFFIX = ".orbax-checkpoint-tmp"
MOMENTS = ("random", "mid-save")  # when a kill lands: any time, or while a checkpoint is written


@dataclasses.dataclass
class Kill:
    """One kill -9 and the relaunch after it."""

    moment: str  # one of MOMENTS
    logged: int  # metrics.jsonl lines when killed
    partial: bool  # a checkpoint's temporary directory was left behind
    newest: int | None  # newest complete checkpoint after the kill
    resumed_at: int | None = None  # first step the relaunch logged
    took_over: bool = False  # the relaunch said it took over the dead run's lock


def command(workdir: Path, steps: int, resume: bool) -> list[str]:
    return [sys.executable, str(ROOT / "experiments" / "run.py"), "--config", "bandit_grpo.py",
            *OVERRIDES, f"--config.steps={steps}", "--workdir", str(workdir),
            *(["--resume"] if resume else [])]


def environment(cache: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1",
               JAX_COMPILATION_CACHE_DIR=str(cache),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return env


def metric_rows(workdir: Path) -> list[dict]:
    """metrics.jsonl without wall-clock timings (a last line cut short by a kill is skipped)."""
    path = workdir / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        rows.append({k: v for k, v in row.items() if not k.startswith("timing/")})
    return rows


def complete_steps(workdir: Path) -> list[int]:
    """Step directories in their final place (orbax renames a save there when it is whole)."""
    directory = workdir / "checkpoints"
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) \
        if directory.exists() else []


def partial_saves(workdir: Path) -> list[str]:
    directory = workdir / "checkpoints"
    return [p.name for p in directory.iterdir() if TMP_SUFFIX in p.name] \
        if directory.exists() else []


def first_logged_step(log: Path) -> int | None:
    match = re.search(r"^step (\d+)/", log.read_text(), re.M)
    return int(match.group(1)) if match else None


def wait_for(predicate, process: subprocess.Popen, timeout: float, poll: float = 0.005) -> bool:
    """Polls predicate() until true (True) or the process ends or time runs out (False)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and process.poll() is None:
        if predicate():
            return True
        time.sleep(poll)
    return False


def reference_run(workdir: Path, steps: int, env: dict[str, str]) -> list[dict]:
    done = subprocess.run(command(workdir, steps, resume=False), env=env, capture_output=True,
                          text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the uninterrupted run failed:\n{done.stderr[-3000:]}")
    return metric_rows(workdir)


def killed_run(workdir: Path, steps: int, kills: int, env: dict[str, str], rng: random.Random,
               first: str = "random") -> tuple[list[Kill], str, list[dict]]:
    """Runs `steps` steps under `kills` kill -9s, relaunching with --resume after each; the
    kills alternate between the two moments, starting with `first` ("random" or "mid-save").
    Returns the kills, the refused second run's stderr and the final metrics."""
    if first not in MOMENTS:
        raise ValueError(f"first = {first!r} is invalid; valid: {', '.join(map(repr, MOMENTS))}")
    order = MOMENTS if first == MOMENTS[0] else MOMENTS[::-1]
    records: list[Kill] = []
    refused = ""
    for launch in range(kills + 1):
        log = workdir.parent / f"{workdir.name}.launch{launch}.log"
        with log.open("w") as out:
            process = subprocess.Popen(command(workdir, steps, resume=launch > 0), env=env,
                                       stdout=out, stderr=subprocess.STDOUT)
        try:
            if launch == kills:
                process.wait(timeout=1800)
                if process.returncode != 0:
                    raise RuntimeError(f"the last relaunch failed:\n{log.read_text()[-3000:]}")
            else:
                # A new step logged (past the compile), then the kill.
                start = len(metric_rows(workdir))
                if not wait_for(lambda: len(metric_rows(workdir)) > start, process, 1800):
                    raise RuntimeError(f"launch {launch} logged no step:\n"
                                       f"{log.read_text()[-3000:]}")
                if launch == 0:
                    second = subprocess.run(command(workdir, steps, resume=False), env=env,
                                            capture_output=True, text=True, timeout=600)
                    refused = f"exit {second.returncode}: {second.stderr.strip()}"
                moment = order[launch % 2]
                if moment == "mid-save":
                    wait_for(lambda: bool(partial_saves(workdir)), process, 60, poll=0.001)
                else:
                    time.sleep(rng.uniform(0.0, 1.0))
                if process.poll() is not None:
                    raise RuntimeError(f"launch {launch} ended before its kill (raise --steps)")
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
                newest = complete_steps(workdir)
                records.append(Kill(moment, len(metric_rows(workdir)),
                                    bool(partial_saves(workdir)), newest[-1] if newest else None))
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        if launch > 0:
            text = log.read_text()
            records[launch - 1].resumed_at = first_logged_step(log)
            records[launch - 1].took_over = "taking over the lock of run pid" in text
    return records, refused, metric_rows(workdir)


def check(records: list[Kill], refused: str, rows: list[dict], reference: list[dict]) -> list[str]:
    """The failures (empty when everything held)."""
    failures = []
    if not (refused.startswith("exit 1") and "is in use by run pid" in refused):
        failures.append(f"the second run on the workdir was not refused: {refused[-500:]}")
    for i, k in enumerate(records, 1):
        expected = (k.newest or 0) + 1
        if k.resumed_at != expected:
            failures.append(f"kill {i}: relaunch began at step {k.resumed_at}, not {expected} "
                            "(after the newest complete checkpoint)")
        if not k.took_over:
            failures.append(f"kill {i}: the relaunch did not report taking over the lock")
    if rows != reference:
        diff = next((r["step"] for r, s in zip(rows, reference) if r != s), len(rows))
        failures.append(f"metrics differ from the uninterrupted run (first at step {diff}; "
                        f"{len(rows)} vs {len(reference)} rows)")
    return failures


def table(records: list[Kill]) -> str:
    lines = ["| kill | moment | steps logged | partial save left | newest complete | "
             "resumed at step | lock taken over |", "|---|---|---|---|---|---|---|"]
    for i, k in enumerate(records, 1):
        lines.append(f"| {i} | {k.moment} | {k.logged} | {'yes' if k.partial else 'no'} | "
                     f"{k.newest} | {k.resumed_at} | {'yes' if k.took_over else 'no'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--steps", type=int, default=0, help="default: 6 per kill + 4")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", choices=MOMENTS, default="random",
                        help="the moment of the first kill (they alternate)")
    parser.add_argument("--dir", type=Path, default=None, help="default: a temporary directory")
    args = parser.parse_args()
    steps = args.steps or 6 * args.kills + 4
    base = args.dir or Path(tempfile.mkdtemp(prefix="fault_kill_"))
    env = environment(base / "jax_cache")
    start = time.perf_counter()
    reference = reference_run(base / "uninterrupted", steps, env)
    records, refused, rows = killed_run(base / "killed", steps, args.kills, env,
                                        random.Random(args.seed), args.first)
    failures = check(records, refused, rows, reference)
    print(table(records))
    print(f"\nsecond run while the first was alive: {refused}")
    print(f"{len(records)} kills ({sum(k.partial for k in records)} left a partial save), "
          f"{len(records)} resumes, {len(rows)} steps compared with the uninterrupted run: "
          f"{'all equal' if rows == reference else 'DIFFERENT'}; "
          f"{time.perf_counter() - start:.0f} s; files in {base}")
    if failures:
        sys.exit("FAILED:\n" + "\n".join(failures))


if __name__ == "__main__":
    main()
