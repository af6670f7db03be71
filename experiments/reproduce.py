"""The reproduction suite: train, compare StarPO with StarPO-S, and report (issue 15).

    python experiments/reproduce.py --suite cpu --workdir results/cpu [--dry-run]
    python experiments/reproduce.py --suite paper --workdir results/paper   # GPUs: the paper's
    python experiments/reproduce.py --suite cpu --workdir results/cpu --report-only

A suite is a fixed list of experiments (SUITES): 1. the Echo Trap on Bandit (vanilla StarPO
against StarPO-S), 2. multi-turn learning on FrozenLake and Sokoban (StarPO-S with PPO and
GRPO; success and valid actions before and after training on held-out and out-of-distribution
states), 3. the uncertainty filter's ablation (keep ratio 1.0 / 0.5 / 0.25 and std_rev). Each
experiment is a set of seeded runs of named settings; a setting shared by two experiments (the
StarPO-S run is experiment 3's keep 0.25) is trained once. Every run goes through run.py's
training loop (`run.train`: metrics.jsonl, checkpoints, evaluations, the collapse monitor) in
its own directory, workdir/runs/<setting>/seed_<s>/, with `done.json` once finished. The seeds
of a setting run one after another on the setting's one compiled step (a run's checkpoints,
resume and evaluations are run.py's, per run; on a 2-core CPU vmapped seeds are break-even per
step anyway, README "Seeded sweeps"). Runs that evaluate before training write
eval_step_0.json (the Table-4 "before" column) from the same evaluator run.train uses.

Resumable: a finished run is skipped, an unfinished one resumes from its newest checkpoint
(run.py --resume: the same numbers as a run never stopped); a finished run's checkpoints are
then deleted (GiBs per SmolLM2 run) unless --keep-checkpoints. `--set KEY=VALUE` overrides a
config key in every setting (e.g. model.source for the paper suite on GPUs). XLA's compilation cache is kept in
workdir/xla_cache (unless JAX_COMPILATION_CACHE_DIR is set), so a resumed suite does not
compile again. Console lines (run.py's per-step lines and the suite's own) are also written to
workdir/reproduce.log. At the end (and with --report-only, from the run directories alone)
starpo_jax.report writes workdir/report.md, results.csv and figures/.

`--dry-run` prints the plan (settings, seeds, steps, evaluations) and the estimated wall time
from per-step estimates (STEP_SECONDS: SmolLM2 on a quiet 2-core CPU, from the figures in the
README; not measured for this suite's shapes).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
from ml_collections import config_dict  # noqa: E402

from starpo_jax import api, report  # noqa: E402
from starpo_jax import sweep as sweep_lib  # noqa: E402
from starpo_jax.logging import METRICS_FILE, format_duration  # noqa: E402
from starpo_jax.workdir import check_config, write_atomically  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as run_py  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DONE, BEFORE = "done.json", "eval_step_0.json"
ConfigDict = config_dict.ConfigDict
# The tiny suite's prompt (tests/test_api.py's tiny_config: the same program as the tests').
SHORT_TURN = "Turn {turn}:\n{state}\nActions left: {actions_left}. Max {max_tokens} tokens."


@dataclasses.dataclass(frozen=True)
class Setting:
    """A config trained with several seeds. `name` names its run directories (unique in a
    suite); `overrides` (dotted keys) are applied to `base()` and shown in the report;
    `step_seconds` estimates one step's time (None: no estimate, e.g. GPU suites);
    `eval_before`: evaluate the untrained policy (step 0) before training."""

    name: str
    label: str
    base: Callable[[], ConfigDict]
    overrides: dict[str, Any]
    step_seconds: float | None = None
    eval_before: bool = False

    def config(self, seed: int = 0) -> ConfigDict:
        return sweep_lib.setting_config(self.base(), self.overrides, seed)


@dataclasses.dataclass(frozen=True)
class Spec:
    """An experiment: its settings (by name) and seeds, and how the report shows it
    (report.ExperimentResult.kind: "echo_trap", "table4" or "ablation")."""

    name: str
    title: str
    kind: str
    about: str
    settings: tuple[Setting, ...]
    seeds: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Suite:
    experiments: tuple[Spec, ...]
    build_seconds: float | None = None  # per setting: model load, step compile, memory sizing
    eval_seconds: float | None = None  # per env and evaluation, its compile amortised

    def with_overrides(self, overrides: dict[str, Any]) -> Suite:
        """The suite with `overrides` (dotted keys, e.g. model.source) in every setting."""
        def apply(spec: Spec) -> Spec:
            settings = tuple(dataclasses.replace(s, overrides={**s.overrides, **overrides})
                             for s in spec.settings)
            return dataclasses.replace(spec, settings=settings)
        return dataclasses.replace(self, experiments=tuple(map(apply, self.experiments)))

    def settings(self) -> list[tuple[Setting, tuple[int, ...]]]:
        """Every distinct setting once, with the union of the seeds its experiments ask."""
        seen: dict[str, tuple[Setting, list[int]]] = {}
        for spec in self.experiments:
            for setting in spec.settings:
                known, seeds = seen.setdefault(setting.name, (setting, []))
                # The same runs under another label (experiment 3's keep 0.25) are shared.
                if known.config().to_json() != setting.config().to_json():
                    raise ValueError(f"two settings with different configs are named "
                                     f"{setting.name!r}")
                seeds += [s for s in spec.seeds if s not in seeds]
        return [(setting, tuple(seeds)) for setting, seeds in seen.values()]


# --- the suites ------------------------------------------------------------------------------

# Seconds per step, SmolLM2-135M on a quiet 2-core CPU, 4 groups x 8 rollouts (README:
# quickstart 34 s/step on a shared machine and twice that with every group kept; countdown's
# 1-turn quickstart shape 10.2 s quiet; Sudoku 4x4's 5 turns 21.6 s). PPO adds the critic.
STEP_SECONDS = {"bandit_keep_0.25": 20.0, "bandit_keep_0.5": 27.0, "bandit_keep_1.0": 40.0,
                "grid_grpo": 30.0, "grid_ppo": 45.0}
CPU_LR = 1e-5  # README: at 1e-5 the quickstart's entropy and reward std collapse by step 10
GRID_LR = 5e-6  # quickstart.QUICK_LR: a 135M model moves visibly within a few steps


def _quickstart_bandit() -> ConfigDict:
    """experiments/configs/quickstart.py's shape (4 x 8 rollouts, 12-token NoThink replies),
    15 steps, no evaluation (success is train/success), a checkpoint every 5 steps."""
    c = api.config_for("bandit", "grpo", max_turns=1, groups=4, group_size=8, reply_tokens=12)
    c.nothink = True
    c.steps = 15
    c.optim.actor_lr = CPU_LR
    c.eval_every = c.sample_every = 0
    c.checkpoint_every, c.keep_checkpoints = 5, 1
    return c


def _grid(env: str, algo: str) -> Callable[[], ConfigDict]:
    def base() -> ConfigDict:
        """Quickstart-sized multi-turn: 4 x 8 rollouts, NoThink replies of up to 16 tokens,
        the env's 5 turns / 10 actions, 10 steps; greedy evaluation of 16 held-out states on
        the env and its OOD variants before training, after step 5 and after step 10."""
        c = api.config_for(env, algo, groups=4, group_size=8, reply_tokens=16)
        c.nothink = True
        c.steps = 10
        c.optim.actor_lr = GRID_LR
        c.eval_every, c.sample_every = 5, 5
        c.eval.update(episodes=16, modes="greedy")
        c.checkpoint_every, c.keep_checkpoints = 5, 1
        return c
    return base


def _paper(name: str) -> Callable[[], ConfigDict]:
    def base() -> ConfigDict:
        """A shipped paper-setting config file (experiments/configs/<name>.py)."""
        spec = importlib.util.spec_from_file_location(name, run_py.CONFIG_DIR / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.get_config()
    return base


def _echo_trap(bandit: Callable[[], ConfigDict], seeds: tuple[int, ...],
               estimate: dict[str, float | None], prefix: str) -> tuple[Spec, Setting]:
    starpo_s = Setting(f"{prefix}_starpo_s", "StarPO-S (filter 0.25, clip 0.2/0.28, no KL)",
                       bandit, {}, estimate["bandit_keep_0.25"])
    vanilla = Setting(f"{prefix}_vanilla", "StarPO (KL 0.001, clip 0.2, no filter)", bandit,
                      {"vanilla": True}, estimate["bandit_keep_1.0"])
    about = ("Vanilla StarPO (GRPO, KL 0.001, symmetric clip 0.2, no filter) against StarPO-S "
             "(keep the 25% most uncertain groups, clip 0.2 / 0.28, no KL) on Bandit, the same "
             "learning rate. RAGEN's Echo Trap: reward std and entropy collapse while the mean "
             "reward holds, then the policy locks into one answer.")
    return Spec("echo_trap", "1. Echo Trap on Bandit", "echo_trap", about, (vanilla, starpo_s),
                seeds), starpo_s


def _filter_ablation(bandit: Callable[[], ConfigDict], keep_quarter: Setting,
                     seeds: tuple[int, ...], estimate: dict[str, float | None],
                     prefix: str) -> Spec:
    settings = (Setting(f"{prefix}_keep_1.0", "keep 1.0 (no filter)", bandit,
                        {"filter.keep_ratio": 1.0}, estimate["bandit_keep_1.0"]),
                Setting(f"{prefix}_keep_0.5", "keep 0.5", bandit,
                        {"filter.keep_ratio": 0.5}, estimate["bandit_keep_0.5"]),
                dataclasses.replace(keep_quarter, label="keep 0.25 (StarPO-S)"),
                Setting(f"{prefix}_std_rev", "keep 0.25, least uncertain (std_rev)", bandit,
                        {"filter.mode": "std_rev"}, estimate["bandit_keep_0.25"]))
    about = ("StarPO-S's uncertainty filter: the share of groups (highest in-group reward std) "
             "kept for the update, and `std_rev`, which keeps the least uncertain groups "
             "instead. The keep 0.25 runs are experiment 1's StarPO-S runs.")
    return Spec("filter_ablation", "3. Filter ablation", "ablation", about, settings, seeds)


MULTI_TURN_ABOUT = (
    "StarPO-S with PPO (critic, GAE) and with GRPO on the multi-turn grid games, NoThink, up to "
    "5 turns and 10 actions. Success and valid-action rate of greedy rollouts on held-out "
    "initial states of the training env and its out-of-distribution variants (sokoban_large: "
    "8x8 with 2 boxes; sokoban_new_vocab: other symbols), before and after training. For "
    "scale: random play reaches ~22% on the original's FrozenLake maps (RAGEN).")


def cpu_suite() -> Suite:
    """SmolLM2, quickstart-sized shapes; about 3 hours on a 2-core CPU (--dry-run)."""
    echo, starpo_s = _echo_trap(_quickstart_bandit, (0, 1, 2), STEP_SECONDS, "bandit")
    grid = tuple(Setting(f"{env}_{algo}", f"{env} StarPO-S {algo.upper()}", _grid(env, algo), {},
                         STEP_SECONDS[f"grid_{algo}"], eval_before=True)
                 for env in ("frozen_lake", "sokoban") for algo in ("ppo", "grpo"))
    multi = Spec("multi_turn", "2. Multi-turn learning: FrozenLake and Sokoban", "table4",
                 MULTI_TURN_ABOUT, grid, (0, 1))
    ablation = _filter_ablation(_quickstart_bandit, starpo_s, (0, 1), STEP_SECONDS, "bandit")
    return Suite((echo, multi, ablation), build_seconds=90.0, eval_seconds=20.0)


def paper_suite() -> Suite:
    """The paper's settings, nothing scaled down (the shipped config files: 8 x 16 rollouts,
    thinking replies of up to 400 tokens, lr 1e-6, 200 steps, 256 held-out states every 10
    steps). For GPUs: no time estimate."""
    none = dict.fromkeys(STEP_SECONDS)
    echo, starpo_s = _echo_trap(_paper("bandit_grpo"), (0, 1, 2), none, "paper_bandit")
    grid = tuple(Setting(f"paper_{env}_{algo}", f"{env} StarPO-S {algo.upper()}",
                         _paper(f"{env}_{algo}"), {}, eval_before=True)
                 for env in ("frozen_lake", "sokoban") for algo in ("ppo", "grpo"))
    multi = Spec("multi_turn", "2. Multi-turn learning: FrozenLake and Sokoban", "table4",
                 MULTI_TURN_ABOUT.replace("NoThink, ", ""), grid, (0, 1, 2))
    ablation = _filter_ablation(_paper("bandit_grpo"), starpo_s, (0, 1, 2), none, "paper_bandit")
    return Suite((echo, multi, ablation))


def tiny_suite() -> Suite:
    """tiny-random, 2 steps, one setting and 2 seeds (one compile): what the tests run. The
    config is tests/test_api.py's tiny_config with 2 steps, whose step other tests compile."""
    def base() -> ConfigDict:
        c = api.config_for("bandit", "grpo", groups=2, group_size=2, max_turns=1, reply_tokens=4)
        c.model.source = "tiny-random"
        c.nothink = True
        c.prompt.update(system="", intro="", turn=SHORT_TURN, verify=20)
        c.optim.actor_lr = 1e-3
        c.checkpoint_every = 1
        c.steps, c.eval_every, c.sample_every = 2, 0, 0
        return c
    setting = Setting("tiny_starpo_s", "StarPO-S (tiny-random)", base, {}, step_seconds=0.5)
    spec = Spec("echo_trap", "Echo Trap (tiny smoke run)", "echo_trap",
                "A tiny-random smoke run of the suite's machinery.", (setting,), (0, 1))
    return Suite((spec,), build_seconds=30.0, eval_seconds=5.0)


SUITES = {"cpu": cpu_suite, "paper": paper_suite, "tiny": tiny_suite}


# --- the plan and its estimate ---------------------------------------------------------------

def evaluations(config: ConfigDict, eval_before: bool) -> int:
    """Evaluations of one run, each over every eval env: before training (if asked), every
    eval_every steps and after the last."""
    c = config
    if not c.eval_every:
        return int(eval_before)
    due = {t for t in range(1, c.steps + 1) if t % c.eval_every == 0} | {c.steps}
    return int(eval_before) + len(due)


def estimate_seconds(suite: Suite, setting: Setting, seeds: int) -> float | None:
    """The estimated wall time of a setting's `seeds` runs (build, steps, evaluations)."""
    if None in (setting.step_seconds, suite.build_seconds, suite.eval_seconds):
        return None
    config = setting.config()
    envs = len(api.eval_config(config).envs)
    per_run = (config.steps * setting.step_seconds
               + evaluations(config, setting.eval_before) * envs * suite.eval_seconds)
    return suite.build_seconds + seeds * per_run


def plan_text(suite: Suite, name: str) -> str:
    """The plan: a line per setting (seeds, steps, evaluations, estimate) and the total."""
    lines = [f"suite {name}: {len(suite.experiments)} experiments"]
    for spec in suite.experiments:
        lines.append(f"  {spec.title}: settings {', '.join(s.name for s in spec.settings)}; "
                     f"seeds {','.join(map(str, spec.seeds))}")
    total, known = 0.0, True
    runs = 0
    for setting, seeds in suite.settings():
        config = setting.config()
        est = estimate_seconds(suite, setting, len(seeds))
        evals = evaluations(config, setting.eval_before)
        envs = ",".join(api.eval_config(config).envs) if evals else "-"
        step = "?" if setting.step_seconds is None else f"{setting.step_seconds:g}s/step"
        lines.append(f"  {setting.name}: {config.env.name} {config.algo} {config.model.source} "
                     f"{config.rollout.groups}x{config.rollout.group_size} rollouts, seeds "
                     f"{','.join(map(str, seeds))}, {config.steps} steps at ~{step}, "
                     f"{evals} evaluations on {envs} -> "
                     f"{'?' if est is None else format_duration(est)}")
        runs += len(seeds)
        total += est or 0.0
        known = known and est is not None
    lines.append(f"{runs} runs; estimated wall time "
                 f"{format_duration(total) if known else 'not estimated (no per-step figures)'}")
    return "\n".join(lines) + "\n"


# --- running ---------------------------------------------------------------------------------

def run_dir(workdir: Path, setting: str, seed: int) -> Path:
    return workdir / "runs" / setting / f"seed_{seed}"


def for_seed(exp: api.Experiment, config: ConfigDict) -> api.Experiment:
    """`exp` (built for another seed of the same setting) for config.seed, stepping with the
    same compiled step: the run key, init key and step-0 state api.build derives from the
    seed. LoRA adapters (initialised at build from the seed) and multi-device runs: built
    again."""
    if exp.train.lora.rank or exp.mesh is not None:
        return api.build(config)
    init_key, key = jax.random.split(jax.random.PRNGKey(config.seed))
    seeded = dataclasses.replace(exp, config=config, key=key, init_key=init_key)
    seeded.state = seeded.fresh_state()
    return seeded


def _finished(path: Path) -> dict | None:
    return json.loads((path / DONE).read_text()) if (path / DONE).exists() else None


def _train_one(exp: api.Experiment, path: Path, setting: Setting, stop: threading.Event,
               say: Callable[[str], None], keep_checkpoints: bool) -> bool:
    """One run into `path`: the step-0 evaluation if asked and missing, then run.train
    (resuming from a checkpoint if there is one), then done.json with its wall time and,
    unless `keep_checkpoints`, its checkpoints deleted (a SmolLM2 run's are GiBs; a finished
    run is never resumed). Returns whether the run finished (not when `stop` was set or the
    collapse monitor stopped it)."""
    start = time.perf_counter()
    path.mkdir(parents=True, exist_ok=True)
    partial = path / "partial_seconds.json"  # wall time of earlier, interrupted attempts
    earlier = json.loads(partial.read_text()) if partial.exists() else 0.0
    if setting.eval_before and not (path / BEFORE).exists():
        result = api.build_evaluator(exp).evaluate(exp.state.actor)
        write_atomically(path / BEFORE, json.dumps(result.metrics, indent=1) + "\n")
        say("  before training: " + ", ".join(f"{k}={v:.3g}" for k, v in result.metrics.items()
                                               if k.endswith(("/success", "/action_is_valid"))))
    resume = (path / "checkpoints").exists() and any((path / "checkpoints").iterdir())
    done = run_py.train(exp, path, resume=resume, stop=stop)
    seconds = earlier + time.perf_counter() - start
    if done < exp.config.steps:
        write_atomically(partial, json.dumps(seconds))
        return False
    write_atomically(path / DONE, json.dumps({"steps": done, "seconds": seconds}) + "\n")
    if not keep_checkpoints:
        shutil.rmtree(path / "checkpoints", ignore_errors=True)
    return True


def run_suite(suite: Suite, workdir: Path, say: Callable[[str], None],
              stop: threading.Event | None = None, keep_checkpoints: bool = False) -> bool:
    """Trains every run of `suite` not finished in `workdir` (see the module docstring).
    Returns False when a run stopped early (`stop` set, SIGINT / SIGTERM in main, or the
    collapse monitor's action): the same command resumes it."""
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
            config = setting.config(seed)
            if _finished(path):
                # A finished run made with another config is refused, not reused.
                check_config(path / "config.json", config.to_dict(), True,
                             run_py.RESUMABLE_CHANGES, has_checkpoints=True)
                say(f"{tag}: finished earlier, skipped")
                continue
            say(f"{tag}: {'resuming' if (path / 'checkpoints').exists() else 'starting'} "
                f"-> {path}")
            run_start = time.perf_counter()
            exp = api.build(config) if exp is None else for_seed(exp, config)
            if not _train_one(exp, path, setting, stop, say, keep_checkpoints):
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
    """A run's metrics.jsonl lines, preceded by its step-0 evaluation (step 0) if any."""
    rows = [json.loads(line) for line in (path / METRICS_FILE).read_text().splitlines()
            if line.strip()]
    if (path / BEFORE).exists():
        rows.insert(0, {"step": 0, **json.loads((path / BEFORE).read_text())})
    return rows


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
            config={s.name: _shown_config(s) for s in spec.settings}, wall_seconds=wall))
    return out


def _shown_config(setting: Setting) -> dict[str, Any]:
    """The keys that describe a setting in the report: shape, algorithm, learning rate,
    filter, loss, and its own overrides."""
    c = setting.config()
    shown = {"env": c.env.name, "algo": c.algo, "model": c.model.source,
             "rollouts": f"{c.rollout.groups}x{c.rollout.group_size}",
             "reply_tokens": c.rollout.reply_tokens, "nothink": c.nothink, "steps": c.steps,
             "actor_lr": c.optim.actor_lr}
    return {**shown, **setting.overrides}


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "-uno"],
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


def main(argv: Sequence[str] | None = None, stream: TextIO | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES), required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the "
                        "estimated time; train nothing")
    parser.add_argument("--report-only", action="store_true", help="write the report from the "
                        "finished runs; train nothing")
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep a finished "
                        "run's checkpoints (deleted by default: GiBs per SmolLM2 run)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every setting, e.g. --set "
                        "model.source=/models/Qwen2.5-0.5B-Instruct (repeatable)")
    args = parser.parse_args(argv)
    suite = SUITES[args.suite]()
    if args.set:
        base = suite.experiments[0].settings[0].config()
        try:
            grid = sweep_lib.parse_grid(args.set, base)
        except ValueError as error:  # the sweep's parser names its own flag
            raise ValueError(str(error).replace("--grid", "--set")) from None
        for key, values in grid:
            if len(values) != 1:
                raise ValueError(f"--set {key}: one value, not {len(values)}")
        suite = suite.with_overrides({key: values[0] for key, values in grid})

    def say(line: str) -> None:
        print(line, file=stream or sys.stdout, flush=True)

    say(plan_text(suite, args.suite).rstrip())
    if args.dry_run:
        return
    workdir = args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
            jax.config.update("jax_compilation_cache_dir", str(workdir / "xla_cache"))
        from absl import logging
        logging.set_verbosity(logging.WARNING)  # orbax's INFO lines would bury the progress
        start = time.perf_counter()
        with tee_output(workdir / "reproduce.log"), run_py.stop_on_signals() as stop:
            try:
                finished = run_suite(suite, workdir, say, stop, args.keep_checkpoints)
            finally:
                _invocations(workdir, time.perf_counter() - start)
        if not finished:
            return
    paths = write_suite_report(suite, args.suite, workdir, _invocations(workdir))
    say(f"wrote {paths[0]}, {paths[1]} and {len(paths) - 2} figures in {workdir / 'figures'}")


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError, MemoryError, FileExistsError,
            run_py.RunFault) as error:
        sys.exit(f"error: {error}")
