"""The reproduction suites' experiments (issue 15): named settings, seeds, and the plan with its
time estimate. experiments/reproduce.py runs them and writes the report; a suite here is data.

A suite is a fixed list of experiments. Each experiment is a set of seeded runs of named
settings; a setting shared by two experiments (the StarPO-S run is experiment 3's keep 0.25)
is trained once. STEP_SECONDS estimate a step's time (SmolLM2 on a quiet 2-core CPU; see their
comment for where each comes from): `reproduce.py --dry-run` shows the plan and its total.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any, Callable

from ml_collections import config_dict

from starpo_jax import api
from starpo_jax import sweep as sweep_lib
from starpo_jax.logging import format_duration

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
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

    def only(self, names: list[str]) -> Suite:
        """The suite with only the experiments named `names` (Spec.name), in suite order;
        ValueError naming the valid names for a name it does not have."""
        known = [spec.name for spec in self.experiments]
        unknown = [name for name in names if name not in known]
        if unknown:
            raise ValueError(f"no experiment {unknown[0]!r} in this suite; valid: "
                             f"{', '.join(known)}")
        return dataclasses.replace(self, experiments=tuple(
            spec for spec in self.experiments if spec.name in names))

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

# Seconds per step, SmolLM2-135M on a quiet 2-core CPU, checkpoints and logging included.
# Bandit (4 x 8 rollouts, one turn): the suite's own runs (keep 1.0 28-37 s, keep 0.25 13-16 s).
# Grid (4 x 4 rollouts, 5 turns of ~200 tokens): from a 4 x 8 FrozenLake PPO step measured at
# 255-265 s (rollout ~110 s, old log-probs ~15 s, the update ~140 s), halved rows; GRPO has no
# critic to train.
STEP_SECONDS = {"bandit_keep_0.25": 15.0, "bandit_keep_0.5": 20.0, "bandit_keep_1.0": 32.0,
                "grid_grpo": 120.0, "grid_ppo": 160.0}
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
        """Multi-turn at CPU scale: 4 x 4 rollouts, NoThink replies of up to 16 tokens, the
        env's 5 turns / 10 actions, 3 steps; greedy evaluation of 16 held-out states on the env
        and its OOD variants before training and after step 3. Few steps: a 5-turn step of
        SmolLM2 costs minutes here (its update is a backward pass over ~1,000-token rows)."""
        c = api.config_for(env, algo, groups=4, group_size=4, reply_tokens=16)
        c.nothink = True
        c.steps = 3
        c.optim.actor_lr = GRID_LR
        c.eval_every, c.sample_every = 3, 3
        c.eval.update(episodes=16, modes="greedy")
        c.checkpoint_every, c.keep_checkpoints = 1, 1
        return c
    return base


def load_config(name: str) -> ConfigDict:
    """get_config() of a shipped config file: experiments/configs/<name> (".py" optional)."""
    path = CONFIG_DIR / (name if name.endswith(".py") else f"{name}.py")
    if not path.is_file():
        shipped = ", ".join(sorted(p.name for p in CONFIG_DIR.glob("*.py")))
        raise FileNotFoundError(f"no config file {path}; the shipped ones: {shipped}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def _paper(name: str) -> Callable[[], ConfigDict]:
    def base() -> ConfigDict:
        """A shipped paper-setting config file (experiments/configs/<name>.py)."""
        return load_config(name)
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
    return Suite((echo, multi, ablation), build_seconds=90.0, eval_seconds=60.0)


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

