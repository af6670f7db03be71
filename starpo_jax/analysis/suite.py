"""The reproduction suites' experiments (issue 15): named settings, seeds, and the plan with its
time estimate. starpo_jax.analysis.reproduce runs them and writes the report; a suite here is data
(the tests' tiny suites: tests/helpers/tiny.py).

A suite is a fixed list of experiments. Each experiment is a set of seeded runs of named
settings; a setting shared by two experiments (the StarPO-S run is experiment 3's keep 0.25)
is trained once. STEP_SECONDS estimate a step's time (SmolLM2 on a quiet 2-core CPU; see their
comment for where each comes from): `reproduce.py --dry-run` shows the plan and its total.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ml_collections import config_dict

from starpo_jax.run import experiment
from starpo_jax.run import sft as sft_lib
from starpo_jax.analysis import sweep as sweep_lib
from starpo_jax.run.cli import load_config
from starpo_jax.run.writers import format_duration

ConfigDict = config_dict.ConfigDict
SFT_SEED = 0  # an SFT setting runs once, with this seed; every seed of its RL settings starts there

@dataclasses.dataclass(frozen=True)
class Setting:
    """A config trained with several seeds. `name` names its run directories (unique in a
    suite); `overrides` (dotted keys) are applied to `base()` and shown in the report;
    `step_seconds` estimates one step's time (None: no estimate, e.g. GPU suites);
    `eval_before`: evaluate the untrained policy (step 0) before training (a run with a
    `start` copies its start's last evaluation instead: the same weights and held-out states).
    `sft`: an SFT run (starpo_jax.run.sft; its base has the `sft` section); `start`: the SFT
    setting whose seed-0 run (SFT_SEED) every seed of this one starts from (model.init_from,
    set by starpo_jax.analysis.reproduce); `final_eval`: eval keys (e.g. envs, modes) of one more
    evaluation of
    the final weights, of the (env, mode) pairs the run's own evaluations did not cover."""

    name: str
    label: str
    base: Callable[[], ConfigDict]
    overrides: dict[str, Any]
    step_seconds: float | None = None
    eval_before: bool = False
    sft: bool = False
    start: Setting | None = None
    final_eval: dict[str, Any] = dataclasses.field(default_factory=dict)

    def config(self, seed: int = 0) -> ConfigDict:
        base = self.base()
        # The suite evaluates step 0 itself (eval_before: reproduce.BEFORE), not the run loop.
        base.val_before_train = False
        if self.sft:
            return sweep_lib.setting_config(base, self.overrides, seed,
                                            check=sft_lib.split_config)
        return sweep_lib.setting_config(base, self.overrides, seed)

    def final_config(self, config: ConfigDict) -> ConfigDict | None:
        """`config` with the final evaluation's eval keys (None when there is none)."""
        if not self.final_eval:
            return None
        final = config.copy_and_resolve_references()
        final.eval.update(self.final_eval)
        return final


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
    eval_row_seconds: float | None = None  # per held-out rollout, its compile amortised

    def with_overrides(self, overrides: dict[str, Any]) -> Suite:
        """The suite with `overrides` (dotted keys, e.g. model.source) in every setting (and
        the SFT settings they start from)."""
        def setting(s: Setting) -> Setting:
            start = None if s.start is None else setting(s.start)
            return dataclasses.replace(s, overrides={**s.overrides, **overrides}, start=start)

        def apply(spec: Spec) -> Spec:
            return dataclasses.replace(spec, settings=tuple(map(setting, spec.settings)))
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
        """Every distinct setting once, with the union of the seeds its experiments ask; the
        SFT settings the others start from first (their seed SFT_SEED only)."""
        seen: dict[str, tuple[Setting, list[int]]] = {}

        def add(setting: Setting, seeds: tuple[int, ...]) -> None:
            known, have = seen.setdefault(setting.name, (setting, []))
            # The same runs under another label (experiment 3's keep 0.25) are shared.
            if known.config().to_json() != setting.config().to_json() or \
                    known.final_eval != setting.final_eval:
                raise ValueError(f"two settings with different configs are named "
                                 f"{setting.name!r}")
            have += [s for s in seeds if s not in have]

        for spec in self.experiments:
            for setting in spec.settings:
                if setting.start is not None:
                    add(setting.start, (SFT_SEED,))
        for spec in self.experiments:
            for setting in spec.settings:
                add(setting, spec.seeds)
        return [(setting, tuple(seeds)) for setting, seeds in seen.values()]


# --- the suites ------------------------------------------------------------------------------

# Seconds per step, SmolLM2-135M on a quiet 2-core CPU, checkpoints and logging included: the
# medians of the suite's own runs (results/cpu/runs/*/metrics.jsonl, timing/step_seconds).
# Bandit (4 x 8 rollouts, one turn): StarPO-S (keep 0.25) 11-14 s, keep 0.5 13 s, keep 1.0
# 22 s, vanilla (keep 1.0 and a reference forward for its KL) 25-37 s. Grid (4 x 4 rollouts,
# 5 turns, 24-token NoThink replies, from the SFT start): StarPO-S GRPO 35-44 s (GiGPO 28-34),
# PPO 38-45 s (the critic's update too), vanilla 75 s (all 16 rows, 8 micro-batches); an SFT
# step (8 demonstration rows, no sampling) 31 s on FrozenLake, 63 s on Sokoban's longer
# buffer. A held-out rollout (5 turns, 64 rows at a time) ~1.8 s, its compile amortised
# (64-state greedy evaluations took 37-197 s).
STEP_SECONDS = {"bandit_keep_0.25": 12.0, "bandit_keep_0.5": 13.5, "bandit_keep_1.0": 22.0,
                "bandit_vanilla": 28.0, "grid_grpo": 38.0, "grid_ppo": 42.0,
                "grid_vanilla": 75.0, "grid_sft": 47.0}
GRID_EVAL_ROW_SECONDS = 1.8
CPU_LR = 1e-5  # README: at 1e-5 the quickstart's entropy and reward std collapse by step 10
GRID_LR = 1e-5  # twice quickstart.QUICK_LR: sparse multi-turn rewards, few steps


def _quickstart_bandit() -> ConfigDict:
    """experiments/configs/quickstart.py's shape (4 x 8 rollouts, 12-token NoThink replies),
    15 steps, no evaluation (success is train/success), a checkpoint every 5 steps."""
    c = experiment.config_for("bandit", "grpo", max_turns=1, groups=4, group_size=8,
                              reply_tokens=12)
    c.nothink = True
    c.steps = 15
    c.optim.actor_lr = CPU_LR
    c.eval_every = c.sample_every = 0
    c.checkpoint_every, c.keep_checkpoints = 5, 1
    return c


# Experiment 2's shape (issue 31; the sizing in cpu_suite's docstring).
GRID_STEPS, GRID_EVAL_EVERY, GRID_EPISODES, GRID_REPLY_TOKENS = 10, 5, 64, 24
# Rollout knobs the SFT run and the runs started from it share, so that their evaluations are
# the same program on the same held-out states (eval.seed = SFT_SEED).
GRID_ROLLOUT = {"cache_dtype": "float32", "chunks": 1}


def _grid_eval(c: ConfigDict, env: str) -> None:
    """The runs' own evaluations: the training env, greedy, GRID_EPISODES held-out states of
    seed SFT_SEED's run, every GRID_EVAL_EVERY steps and after the last."""
    c.eval_every = c.sample_every = GRID_EVAL_EVERY
    c.eval.update(envs=env, modes="greedy", episodes=GRID_EPISODES, pass_k=1, seed=SFT_SEED)


def grid_base(env: str, algo: str) -> Callable[[], ConfigDict]:
    def base() -> ConfigDict:
        """Multi-turn at CPU scale from the SFT start: 4 x 4 rollouts, NoThink replies of up
        to 24 tokens (the SFT run's), the env's 5 turns / 10 actions, GRID_STEPS steps at
        GRID_LR; greedy held-out evaluations every GRID_EVAL_EVERY steps (_grid_eval)."""
        c = experiment.config_for(env, algo, groups=4, group_size=4, reply_tokens=GRID_REPLY_TOKENS)
        c.nothink = True
        c.steps = GRID_STEPS
        c.optim.actor_lr = GRID_LR
        c.rollout.update(GRID_ROLLOUT)
        _grid_eval(c, env)
        c.checkpoint_every, c.keep_checkpoints = 1, 1
        return c
    return base


def grid_sft_base(env: str) -> Callable[[], ConfigDict]:
    def base() -> ConfigDict:
        """The shipped <env>_sft.py (`random` demonstrations, 8 rows a step, 10 steps at lr
        1e-4, 24-token replies) with the RL runs' rollout knobs and evaluations: its last
        evaluation (and final_eval) is the SFT start."""
        c = load_config(f"{env}_sft")
        c.rollout.update(GRID_ROLLOUT)
        _grid_eval(c, env)
        c.eval_every = c.steps  # the SFT start only: SFT curves are not the experiment's
        c.keep_checkpoints = 1  # the newest: the RL runs' start (analysis/reproduce.py keeps it)
        return c
    return base


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
                      {"vanilla": True}, estimate["bandit_vanilla"])
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
SFT_ABOUT = (
    "SmolLM2 does not answer the grid games in format untrained, so every run starts from an "
    "SFT warm start on `random` demonstrations (the format, not the task: experiments/configs/"
    "<env>_sft.py, seed 0, shared by every seed). StarPO-S with GRPO and with PPO (critic, "
    "GAE), and vanilla StarPO (GRPO, KL 0.001, clip 0.2, no filter), NoThink, 5 turns and 10 "
    "actions. Held-out initial states (the same for every run, seed and baseline) of the "
    "training env and, for StarPO-S GRPO, Sokoban's out-of-distribution variants "
    "(sokoban_large: 8x8 with 2 boxes; sokoban_new_vocab: other symbols), greedy and sampled "
    "(temperature 0.5, one rollout each): the random policy, the solver (no solver for two "
    "boxes), the SFT start, and each run's start -> end. Goal (issue 31): on Sokoban, held-out "
    "greedy success at least 15 points above the SFT start in every seed.")


def _multi_turn_specs(seeds: tuple[int, ...], estimate: dict[str, float | None],
                      ) -> tuple[Spec, ...]:
    """Experiment 2 (table), its Echo Trap on Sokoban and experiment 4 (GiGPO): see cpu_suite."""
    def full(env: str) -> dict[str, str]:
        return {"envs": ",".join(experiment.eval_config(experiment.config_for(env, "grpo")).envs),
                "modes": "greedy,sampled"}

    starts = {env: Setting(f"{env}_sft", f"SFT start ({env}, random demonstrations)",
                           grid_sft_base(env), {}, estimate["grid_sft"], sft=True,
                           final_eval=full(env))
              for env in ("sokoban", "frozen_lake")}
    own = {"modes": "greedy,sampled"}  # the training env only

    def rl(env: str, algo: str, kind: str, label: str, overrides: dict[str, Any],
           final: dict[str, str]) -> Setting:
        return Setting(f"{env}_{kind}", f"{env} {label}", grid_base(env, algo), overrides,
                       estimate[f"grid_{'vanilla' if kind == 'vanilla' else algo}"],
                       eval_before=True, start=starts[env], final_eval=final)

    def per_env(env: str, grpo_final: dict[str, str]) -> tuple[Setting, Setting, Setting]:
        """StarPO-S GRPO, StarPO-S PPO and vanilla StarPO on `env`, in the table's order."""
        return (rl(env, "grpo", "grpo_s", "StarPO-S GRPO", {}, grpo_final),
                rl(env, "ppo", "ppo_s", "StarPO-S PPO", {}, own),
                rl(env, "grpo", "vanilla", "vanilla StarPO (GRPO)", {"vanilla": True}, own))

    grpo, ppo, vanilla = per_env("sokoban", full("sokoban"))
    table = (grpo, ppo, vanilla, *per_env("frozen_lake", own))
    multi = Spec("multi_turn", "2. Multi-turn learning from an SFT start: Sokoban and "
                 "FrozenLake", "table4", SFT_ABOUT, table, seeds)
    echo = Spec("echo_trap_sokoban", "2b. Echo Trap in multi-turn: vanilla StarPO against "
                "StarPO-S on Sokoban", "echo_trap",
                "Experiment 2's vanilla StarPO and StarPO-S GRPO runs on Sokoban (the same "
                "runs, seeds and SFT start). The paper sees vanilla GRPO's reward std and "
                "entropy collapse near step 10 on Sokoban.", (vanilla, grpo), seeds)
    gigpo = rl("sokoban", "grpo", "gigpo_s", "StarPO-S GiGPO",
               {"advantage.estimator": "gigpo"}, own)
    step_level = Spec(
        "gigpo", "4. Step-level credit: GiGPO against GRPO on Sokoban", "table4",
        "StarPO-S with GiGPO's advantages (episode-level GRPO plus step-level credit over the "
        "turns that start from the same env state, exact in JAX: `advantage.estimator=gigpo`) "
        "against experiment 2's StarPO-S GRPO runs (shared), from the same SFT start, shapes, "
        "seeds and held-out states. rollout/anchor_share: the share of taken turns whose start "
        "state another turn of its group shares. Goal (issue 33): GiGPO reaches GRPO's final "
        "held-out success in fewer steps, or ends higher.",
        (dataclasses.replace(grpo, label="sokoban StarPO-S GRPO (experiment 2's runs)"), gigpo),
        seeds)
    return multi, echo, step_level


def cpu_suite() -> Suite:
    """SmolLM2, CPU-sized shapes; the plan and its total: `reproduce.py --suite cpu --dry-run`.

    Experiments 1 and 3 (Bandit) take about an hour. The multi-turn part (issue 31's
    experiment 2, its Echo Trap on Sokoban, issue 33's GiGPO) is sized to <= 10 CPU-hours
    (~6.4 hours by the measured step times, STEP_SECONDS):
    - 4 x 4 rollouts, keep 0.25 (StarPO-S: the update runs on the one group of 4 rows with the
      most spread in reward), 10 steps at lr 1e-5: more steps rather than more groups (the
      rollout is most of a step); 10 steps is where the paper sees vanilla GRPO collapse on
      Sokoban. 4 x 8 groups and 16 steps (a group of 8 tries shows more spread; the pilots'
      4 x 8 StarPO-S steps took 100-120 s) would take ~8 hours: the next shape to run.
    - held-out evaluations are costly (a 5-turn rollout ~1.8 s a row): each run evaluates 64
      states greedily on its training env at steps 5 and 10 (the curves), then its final
      weights once more, sampled (one rollout at 0.5, as the original validates) and, for
      StarPO-S GRPO (the method), on the OOD variants too; PPO, vanilla, GiGPO and FrozenLake
      skip the OOD evaluations. The SFT start is evaluated once per env (its run's last
      evaluation), the "before" of every run started from it; the random policy and the solver
      need no model (seconds).
    - Sokoban is the goal: StarPO-S GRPO, PPO, vanilla StarPO and GiGPO, 3 seeds each;
      FrozenLake: StarPO-S GRPO, PPO and vanilla StarPO, 3 seeds each.
    - SFT: the shipped configs (8 rows from 8 levels a step, 10 steps) once per env, seed 0.
    """
    echo, starpo_s = _echo_trap(_quickstart_bandit, (0, 1, 2), STEP_SECONDS, "bandit")
    multi, echo_grid, gigpo = _multi_turn_specs((0, 1, 2), STEP_SECONDS)
    ablation = _filter_ablation(_quickstart_bandit, starpo_s, (0, 1), STEP_SECONDS, "bandit")
    return Suite((echo, multi, echo_grid, ablation, gigpo), build_seconds=90.0,
                 eval_row_seconds=GRID_EVAL_ROW_SECONDS)


def paper_suite() -> Suite:
    """The paper's settings, nothing scaled down (the shipped config files: 8 x 16 rollouts,
    thinking replies of up to 400 tokens, lr 1e-6, 200 steps, the validation protocol: 512
    held-out states of the fixed val seed every 10 steps, sampled, then greedy; step 0 is the
    suite's eval_before). For GPUs: no time estimate."""
    none = dict.fromkeys(STEP_SECONDS)
    echo, starpo_s = _echo_trap(_paper("bandit_grpo"), (0, 1, 2), none, "paper_bandit")
    grid = tuple(Setting(f"paper_{env}_{algo}", f"{env} StarPO-S {algo.upper()}",
                         _paper(f"{env}_{algo}"), {}, eval_before=True)
                 for env in ("frozen_lake", "sokoban") for algo in ("ppo", "grpo"))
    multi = Spec("multi_turn", "2. Multi-turn learning: FrozenLake and Sokoban", "table4",
                 MULTI_TURN_ABOUT.replace("NoThink, ", ""), grid, (0, 1, 2))
    ablation = _filter_ablation(_paper("bandit_grpo"), starpo_s, (0, 1, 2), none, "paper_bandit")
    return Suite((echo, multi, ablation))


SUITES = {"cpu": cpu_suite, "paper": paper_suite}


# --- the plan and its estimate ---------------------------------------------------------------

def evaluations(config: ConfigDict, eval_before: bool) -> int:
    """Evaluations of one run, each over every eval env: before training (if asked), every
    eval_every steps and after the last."""
    c = config
    if not c.eval_every:
        return int(eval_before)
    due = {t for t in range(1, c.steps + 1) if t % c.eval_every == 0} | {c.steps}
    return int(eval_before) + len(due)


def eval_config(config: ConfigDict):
    """api.eval_config of a run's or an SFT run's config."""
    return experiment.eval_config(sft_lib.split_config(config)[0] if "sft" in config else config)


def eval_pairs(config: ConfigDict) -> list[tuple[str, str]]:
    """The (env, mode) pairs an evaluation of `config` runs."""
    e = eval_config(config)
    return [(env, mode) for env in e.envs for mode in e.modes]


def final_pairs(setting: Setting, config: ConfigDict) -> list[tuple[str, str]]:
    """The (env, mode) pairs of the setting's final evaluation: its final_eval's, less those
    the run's own evaluations cover (none when the run does not evaluate)."""
    final = setting.final_config(config)
    if final is None:
        return []
    own = set(eval_pairs(config)) if config.eval_every else set()
    return [pair for pair in eval_pairs(final) if pair not in own]


def eval_rows(config: ConfigDict, pairs: list[tuple[str, str]]) -> int:
    """Held-out rollouts of an evaluation of `pairs`: episodes each, x pass_k when sampled."""
    e = eval_config(config)
    return sum(e.episodes * (e.pass_k if mode == "sampled" else 1) for _, mode in pairs)


def estimate_seconds(suite: Suite, setting: Setting, seeds: int) -> float | None:
    """The estimated wall time of a setting's `seeds` runs (build, steps, evaluations; the
    evaluation before training of a run with a start is its start's, copied)."""
    if None in (setting.step_seconds, suite.build_seconds, suite.eval_row_seconds):
        return None
    config = setting.config()
    before = setting.eval_before and setting.start is None
    rows = (evaluations(config, before) * eval_rows(config, eval_pairs(config))
            + eval_rows(config, final_pairs(setting, config)))
    per_run = config.steps * setting.step_seconds + rows * suite.eval_row_seconds
    return suite.build_seconds + seeds * per_run


def plan_text(suite: Suite, name: str,
              finished: Callable[[str, int], bool] = lambda setting, seed: False) -> str:
    """The plan: a line per setting (seeds, steps, evaluations, estimate) and the total;
    `finished(setting, seed)` says which runs are done (a resumed suite): their count per
    setting, and the estimate of what is left beside the total."""
    lines = [f"suite {name}: {len(suite.experiments)} experiments"]
    for spec in suite.experiments:
        lines.append(f"  {spec.title}: settings {', '.join(s.name for s in spec.settings)}; "
                     f"seeds {','.join(map(str, spec.seeds))}")
    total, left, known = 0.0, 0.0, True
    runs = done = 0
    for setting, seeds in suite.settings():
        config = setting.config()
        est = estimate_seconds(suite, setting, len(seeds))
        todo = [seed for seed in seeds if not finished(setting.name, seed)]
        evals = evaluations(config, setting.eval_before and setting.start is None)
        envs = ",".join(eval_config(config).envs) if evals else "-"
        final = final_pairs(setting, config)
        step = "?" if setting.step_seconds is None else f"{setting.step_seconds:g}s/step"
        kind = "SFT" if setting.sft else config.algo
        lines.append(f"  {setting.name}: {config.env.name} {kind} {config.model.source} "
                     f"{config.rollout.groups}x{config.rollout.group_size} rollouts, seeds "
                     f"{','.join(map(str, seeds))}, {config.steps} steps at ~{step}, "
                     f"{evals} evaluations on {envs}"
                     + (f" + a final one ({', '.join('/'.join(p) for p in final)})"
                        if final else "")
                     + (f", from {setting.start.name}" if setting.start else "")
                     + f" -> {'?' if est is None else format_duration(est)}"
                     + (f" ({len(seeds) - len(todo)} of {len(seeds)} finished)"
                        if len(todo) < len(seeds) else ""))
        runs += len(seeds)
        done += len(seeds) - len(todo)
        total += est or 0.0
        left += (estimate_seconds(suite, setting, len(todo)) or 0.0) if todo else 0.0
        known = known and est is not None
    if not known:
        lines.append(f"{runs} runs; estimated wall time not estimated (no per-step figures)")
    elif done:
        lines.append(f"{runs} runs, {done} finished; estimated wall time {format_duration(total)}"
                     f", {format_duration(left)} of it left")
    else:
        lines.append(f"{runs} runs; estimated wall time {format_duration(total)}")
    return "\n".join(lines) + "\n"
