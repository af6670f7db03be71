"""The experiment config: its schema (default_config), the shipped shortcuts (config_for,
paper_eval) and its checks, which turn a ConfigDict into the TrainConfig and EvalConfig the
step and the evaluator run (train_config, eval_config). Every bad key or value is named with
what would be valid, before anything is loaded or compiled. starpo_jax.api re-exports the
public names; `api.build` takes such a config.

Nothing here imports JAX, flax or jumanji (config files import config_for from here), so
that check_config reports a bad config before a script imports the heavy stack. Deferred to
train_config: the estimator's checks (advantage.estimator's name, its critic against algo, the
fields it reads), against the estimators known by then (starpo_jax.estimators: the built-ins and
those registered with starpo_jax.algo.advantages.register_advantage_estimator, which imports JAX).
Envs: the built-in names and settings come from envs_jax.catalog; a user's envs (env.module,
the starpo_jax.envs entry points, or envs_jax.register in this process) from the registry,
which loading them imports.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from ml_collections import config_dict

import envs_host
import envs_jax
from envs_jax.catalog import BUILTIN
from starpo_jax.checks import is_int, require_valid
from starpo_jax.config import (EMBEDDED_NAME, TINY_RANDOM_NAME, AdvantageConfig, CollapseConfig,
                               EvalConfig, FilterConfig, GradientAnalysisConfig, LoraConfig,
                               LossConfig, MonitorConfig,
                               OptimConfig, RolloutConfig, RUN_DTYPES, RUN_MATMUL_PRECISIONS,
                               TrainConfig, VAL_SEED, VAL_STATES, VANILLA_FILTER, VANILLA_LOSS,
                               default_eval_envs)
from starpo_jax.run.workdir import read_json_object

ConfigDict = config_dict.ConfigDict
SECTIONS = {"rollout": RolloutConfig, "filter": FilterConfig, "advantage": AdvantageConfig,
            "loss": LossConfig, "optim": OptimConfig, "collapse": CollapseConfig,
            "lora": LoraConfig}
DTYPES = RUN_DTYPES  # model.dtype's
# Dataclass fields that may be None: typed so that --config overrides parse.
_OPTIONAL = {"dual_clip": float, "value_clip": float, "whiten": bool, "estimator": str,
             "max_groups": int, "base_dtype": str, "micro_batches": int, "remat": bool,
             "cache_dtype": str, "chunks": int}
# The memory knobs (autofit.KNOBS): None by default = chosen from the compiled memory plan and
# the free memory (check_memory); a value is used as given.
AUTO = {"optim": ("micro_batches", "remat"), "rollout": ("cache_dtype", "chunks")}
# Installed packages name their env modules under this entry-point group (load_env_entry_points).
ENV_ENTRY_POINTS = "starpo_jax.envs"
# A run's workdir holds its config as JSON (experiments/run.py), with the memory settings
# chosen for the unset knobs under this key (autofit.Choice.record(); not a config key).
RUN_CONFIG_FILE = "config.json"
AUTO_MEMORY = "auto_memory"
# Set by the `nothink` switch, not a key of its own.
_DERIVED = {"rollout": ("mode",)}
# rollout keys whose default (None) is the env's own setting (envs_jax.settings(env.name)).
ENV_SETTINGS = tuple(field.name for field in dataclasses.fields(envs_jax.EnvSettings))
# The only keys whose default here differs from starpo_jax.config's dataclass default, and why:
# None here is resolved by train_config; the dataclass holds what None resolves to when nothing
# else decides (a TrainConfig built in Python, check_memory=False). Every other key's default
# is the dataclass's (tests/test_api.py checks both).
RESOLVED_LATER = {
    **{f"rollout.{key}": "the env's own (envs_jax.settings(env.name)); the dataclass holds the "
       "grid games'" for key in ENV_SETTINGS},
    **{f"{section}.{key}": "chosen from the compiled memory plan before step 1 (check_memory); "
       "the dataclass holds the fastest setting, which check_memory=False takes"
       for section, keys in AUTO.items() for key in keys},
}


def _section(name: str, **overrides: Any) -> ConfigDict:
    out = ConfigDict()
    for field in dataclasses.fields(SECTIONS[name]):
        if field.name in _DERIVED.get(name, ()):
            continue
        auto = field.name in AUTO.get(name, ())
        value = overrides.get(field.name, None if auto else field.default)
        if field.name in _OPTIONAL:
            value = config_dict.FieldReference(value, field_type=_OPTIONAL[field.name])
        out[field.name] = value
    return out


def default_config() -> ConfigDict:
    """Every key a run accepts. The training sections hold `starpo_jax.config`'s dataclass
    defaults (the original's StarPO-S settings: 8 groups x 16 rollouts, thinking replies of up
    to 400 tokens, actor lr 1e-6, critic lr 1e-5, mini-batches of 32 rows, 200 steps); the eval
    section `evaluation.EvalConfig`'s. CPU-sized runs are config files that say so
    (experiments/configs/quickstart.py).

    `vanilla=True` turns StarPO-S into vanilla StarPO (KL 0.001, symmetric clip 0.2, no
    filter: vanilla_values(); a config that sets one of those keys away from its default, to
    another value, is refused, named). `nothink=True` starts replies with <answer>.
    rollout.max_turns, max_actions_per_turn, max_actions_per_traj and announced_tokens: None
    = the env's own (envs_jax.settings(env.name), the original's per-env configs: bandit 1
    turn and 1 action, grid games 5 turns, 5 actions per turn, 10 per trajectory; all announce
    100 tokens); a number overrides it. announced_tokens is the "Max response length" the
    prompt states, reply_tokens the generation budget.
    prompt.* = None keeps the default (RAGEN's) prompt text; prompt.verify is the number of
    random renderings the codec checks against the tokenizer when it is built.
    collapse.*: RAGEN-2's template-collapse metrics every collapse.every steps (0 = off;
    starpo_jax.train.collapse); logged only on the steps that compute them.
    monitor.*: the collapse ("Echo Trap") monitor of experiments/run.py (starpo_jax.run.monitor).
    gradient_analysis.*: RAGEN-2's gradient norms per reward-std bucket every `every` steps (0 =
    off; starpo_jax.train.gradient_analysis: a program of its own, the train step unchanged).
    filter.empty_stop_steps: experiments/run.py saves and stops after that many steps in a row
    whose filter kept no group (0 = never; the original's default 5).
    Evaluation (starpo_jax.run.evaluation) runs before the first step (`val_before_train`,
    logged at step 0; a resumed run does not repeat it), every `eval_every` steps and after the
    last one (eval_every 0 = never, step 0 included); `sample_every` steps write sample
    conversations (0 = never). The eval section's defaults are RAGEN's validation protocol, for
    every env (paper_eval): eval.episodes = 512 held-out initial states of the fixed eval.seed
    123 (None = the run's own seed), "sampled" at eval.temperature 0.5 with eval.pass_k = 1
    rollout each, then "greedy"; eval.batch rows at a time (None = the training rollout's rows
    per chunk). eval.envs: names, comma-separated ("" = the training env and its
    out-of-distribution variants); eval.modes: "sampled" and/or "greedy".
    model.init_from: a workdir of experiments/sft.py (or run.py) whose newest checkpoint's
    policy is the starting weights (LoRA adapters merged in; starpo_jax.run.sft); "" = model.source.
    model.require_init_from: the experiments/sft.py config (of experiments/configs/) whose run
    must be model.init_from: a config of a game the untrained model does not answer in format
    names it, and check_config refuses it with model.init_from unset (check_start: the line
    gives the SFT command and the override; "" = no such requirement, which also runs it anyway).
    mesh.tp: the tensor-parallel size when the run sees several devices (starpo_jax.models.sharding:
    every device of every process, len(jax.devices()) // tp of them on "fsdp").
    max_skipped_steps: experiments/run.py saves and stops after this many steps in a row whose
    updates were dropped for a non-finite loss or gradient (0 = never stops for that).
    check_memory: the step is compiled before it first runs and sized against the free memory
    (starpo_jax.sizing.memory): optim.micro_batches, optim.remat, rollout.cache_dtype and
    rollout.chunks left None are chosen then (starpo_jax.sizing.autofit: the fastest settings whose
    plan fits 90% of it), and a step that cannot fit stops, naming the settings that shrink
    it. check_memory=False: no check, and unset knobs take their fastest values (1, False,
    "float32", 1).
    progress_after: seconds into a step after which each phase's end (rollout chunk, rollout,
    old log-probs, update) prints a progress line (starpo_jax.phases; 0 = never, and no marks
    are compiled in; single-device CPU runs only: on accelerators the step has no host calls).
    Nor are marks compiled into a step that autofit's time model puts under a quarter of it
    (experiment.PROGRESS_MARGIN): such a step, free of host calls, is kept by JAX's persistent
    compilation cache, so a resumed or repeated run loads it instead of compiling it.
    """
    c = ConfigDict()
    c.seed = 0
    c.steps = 200
    c.algo = TrainConfig.algo
    c.vanilla = False
    c.nothink = False
    c.model = ConfigDict({"source": "smollm2-135m-instruct", "dtype": "float32",
                          "init_from": "", "matmul_precision": "auto",
                          "require_init_from": ""})
    c.mesh = ConfigDict({"tp": 1})
    # env.module: comma-separated modules imported before env.name is looked up, so that envs
    # a user's package registers on import (envs_host.register, envs_jax.register) train by
    # name from the command line. env.kwargs: keyword arguments of the env's constructor
    # (envs_jax.make / envs_host.make), e.g. {"success_rate": 0.8} or an OpenEnv server's
    # {"timeout": 10}; set in a config file.
    c.env = ConfigDict({"name": "bandit", "module": "", "kwargs": {}})
    # Host envs (envs_host) only: the env pool's threads (or one process per row) and the
    # seconds an env call may take before its row is failed (envs_host.pool).
    c.host = ConfigDict(dataclasses.asdict(envs_host.PoolConfig()))
    c.prompt = ConfigDict({"system": config_dict.placeholder(str),
                           "intro": config_dict.placeholder(str),
                           "turn": config_dict.placeholder(str), "verify": 50})
    for name in SECTIONS:
        c[name] = _section(name)
    for key in ENV_SETTINGS:  # resolved by train_config from the env
        c.rollout[key] = config_dict.placeholder(int)
    c.log_every = 1
    c.eval_every = 10
    c.val_before_train = True  # RAGEN's trainer.val_before_train: step 0's evaluation
    c.sample_every = 10
    # EvalConfig's defaults; envs and modes as comma-separated text (flags).
    c.eval = ConfigDict({field.name: field.default for field in dataclasses.fields(EvalConfig)
                         if field.name not in ("envs", "modes", "seed", "batch")})
    # None = the run's seed / the training rollout's rows per chunk; typed for overrides.
    c.eval.seed = config_dict.FieldReference(EvalConfig.seed, field_type=int)
    c.eval.batch = config_dict.placeholder(int)
    c.eval.update(envs="", modes=",".join(EvalConfig.modes))
    c.checkpoint_every = 10
    c.keep_checkpoints = 3
    c.max_skipped_steps = 3
    c.check_memory = True
    c.progress_after = 60
    c.monitor = ConfigDict(dataclasses.asdict(MonitorConfig()))
    # RAGEN-2's gradient analysis (a run-level setting: the train step is unchanged).
    c.gradient_analysis = ConfigDict(dataclasses.asdict(GradientAnalysisConfig()))
    # Weights & Biases beside JSONL and TensorBoard (the optional extra `wandb`;
    # logging.WandbWriter): the W&B project, and the run's name ("" = the workdir's name).
    c.logging = ConfigDict({"wandb": False, "wandb_project": "starpo-jax", "wandb_name": ""})
    return c


def config_for(env: str, algo: str, **rollout: Any) -> ConfigDict:
    """default_config() for `env` trained with `algo` ("ppo" | "grpo"), rollout keys updated."""
    c = default_config()
    c.env.name, c.algo = env, algo
    c.rollout.update(rollout)
    return c


def paper_eval(config: ConfigDict) -> ConfigDict:
    """`config` validated as the original validates (its config/base.yaml): 512 held-out
    initial states of the fixed val seed (seed.val 123), one rollout each, sampled at
    temperature 0.5 (val_kwargs), before training and every 10 steps; then greedy, this
    project's second mode. The defaults of default_config(): this undoes a config's smaller
    evaluation. Returns config."""
    config.eval.update(episodes=VAL_STATES, modes=",".join(EvalConfig.modes), pass_k=1,
                       temperature=0.5, seed=VAL_SEED)
    config.eval_every, config.val_before_train = 10, True
    return config


# Sections whose keys are the user's (an env constructor's keyword arguments), not checked here.
FREE_FORM = ("env.kwargs",)


def _check_keys(given: Any, known: ConfigDict, prefix: str = "") -> None:
    for key in given.keys():
        name = prefix + key
        if key not in known:
            close = difflib.get_close_matches(key, list(known.keys()), n=1)
            hint = f" (did you mean {prefix + close[0]!r}?)" if close else ""
            where = f" in {prefix[:-1]!r}" if prefix else ""
            raise ValueError(f"unknown config key {name!r}{hint}; valid keys{where}: "
                             f"{sorted(known.keys())}")
        if isinstance(known[key], ConfigDict) and name not in FREE_FORM:
            if not hasattr(given[key], "keys"):
                raise ValueError(f"config key {name!r} = {given[key]!r} must be a section with "
                                 f"keys {sorted(known[key].keys())}")
            _check_keys(given[key], known[key], name + ".")


def merged_config(config: Any) -> ConfigDict:
    """default_config() updated with `config` (ConfigDict or nested dict), keys checked."""
    _check_keys(config, default_config())
    values = config.to_dict() if isinstance(config, ConfigDict) else config
    full = default_config()
    try:
        full.update(values)
    except (TypeError, AttributeError) as error:  # ConfigDict's type check, e.g. a str for an int
        raise ValueError(_wrong_type(values, default_config()) or str(error)) from None
    return full


def _wrong_type(values: Any, section: ConfigDict, prefix: str = "") -> str | None:
    """The message for the first value in `values` that `section` refuses for its type."""
    for key, value in values.items():
        if isinstance(section[key], ConfigDict):
            if not hasattr(value, "items"):
                return f"config.{prefix}{key} = {value!r} is invalid; valid: a dict"
            found = _wrong_type(value, section[key], f"{prefix}{key}.")
            if found:
                return found
            continue
        try:
            section[key] = value
        except TypeError:
            kind = section.get_type(key).__name__
            valid = {"int": "an int", "float": "a number", "bool": "True or False",
                     "str": "a string"}.get(kind, f"a {kind}")
            return f"config.{prefix}{key} = {value!r} is invalid; valid: {valid}"
    return None


def _model_source_exists(source: Any) -> bool:
    """A known model name, an existing .gguf file or directory (what load_pretrained reads)."""
    if not isinstance(source, str) or not source:
        return False
    path = Path(source).expanduser()
    return (source in (EMBEDDED_NAME, TINY_RANDOM_NAME) or path.is_dir()
            or (source.endswith(".gguf") and path.is_file()))


class _EstimatorUnchecked(TrainConfig):
    """A TrainConfig whose estimator is not checked (check_config: a user's estimators are
    registered with JAX, after it)."""

    def check_estimator(self) -> None:
        pass


def train_config(config: ConfigDict) -> TrainConfig:
    """Checks every key and value of an experiment config (nothing is loaded or compiled) and
    returns the TrainConfig it describes. Raises ValueError naming the key and what is valid."""
    return _train_config(config, TrainConfig)


def check_config(config: ConfigDict) -> None:
    """train_config's checks, all but the advantage estimator's (see the module docstring),
    without importing JAX: what a script runs before it imports the heavy stack; and the run's
    start (check_start). Raises ValueError naming the key and what is valid."""
    _train_config(config, _EstimatorUnchecked)
    check_start(config)


def warm_start(sft_config: str) -> tuple[str, str]:
    """(the experiments/sft.py command that makes the warm start `sft_config` names, the
    run.py override that starts from it)."""
    workdir = f"runs/{Path(sft_config).stem}"  # cli.default_workdir (cli imports this module)
    return (f"python experiments/sft.py --config {sft_config} --workdir {workdir}",
            f"--config.model.init_from={workdir}")


def check_start(config: Any) -> None:
    """Refuses to start RL from the untrained model when the config says its game needs a warm
    start (model.require_init_from names the SFT config) and model.init_from is unset: every
    reply would be invalid and nothing learned, at minutes a step. One line: the SFT command,
    the override to pass afterwards, and the one that runs it anyway. Run training's check
    (check_config, loop.run), not train_config's: api.build still builds the config (a bench
    of its shape needs no warm start)."""
    full = merged_config(config)
    needed, init = full.model.require_init_from, full.model.init_from
    require_valid("model.require_init_from", needed, isinstance(needed, str),
                  "'' or the name of an experiments/sft.py config, e.g. 'sokoban_sft.py'")
    if not needed or init:
        return
    build, start = warm_start(needed)
    raise ValueError(
        f"config.model.init_from = {init!r} is invalid: this config trains a game the untrained "
        f"model does not answer in format (model.require_init_from = {needed!r}: every reply "
        f"invalid, nothing to learn); valid: a warm start, made first by `{build}`, then "
        f"`{start}` (a --resume passes the run's own again; --config.model.require_init_from= "
        "runs from the untrained model anyway)")


def _train_config(config: ConfigDict, kind: type[TrainConfig]) -> TrainConfig:
    full = merged_config(config)
    for name, value, low in (("seed", full.seed, 0), ("steps", full.steps, 1),
                             ("log_every", full.log_every, 1),
                             ("checkpoint_every", full.checkpoint_every, 0),
                             ("keep_checkpoints", full.keep_checkpoints, 1),
                             ("mesh.tp", full.mesh.tp, 1),
                             ("prompt.verify", full.prompt.verify, 0)):
        require_valid(name, value, is_int(value, low), f"an int >= {low}")
    for name in ("eval_every", "sample_every", "progress_after", "max_skipped_steps"):
        require_valid(name, full[name], is_int(full[name], 0), "an int >= 0 (0 = never)")
    for name in ("vanilla", "nothink", "check_memory", "val_before_train"):
        require_valid(name, full[name], isinstance(full[name], bool), "True or False")
    require_valid("model.source", full.model.source, _model_source_exists(full.model.source),
             f"{EMBEDDED_NAME!r}, {TINY_RANDOM_NAME!r}, the path of a .gguf file or of a Hugging "
             "Face model directory")
    require_valid("model.dtype", full.model.dtype, full.model.dtype in DTYPES, f"one of {DTYPES}")
    require_valid("model.matmul_precision", full.model.matmul_precision,
                  full.model.matmul_precision in RUN_MATMUL_PRECISIONS,
                  f"one of {RUN_MATMUL_PRECISIONS}")
    init = full.model.init_from
    require_valid("model.init_from", init, isinstance(init, str) and (
        not init or (Path(init) / "config.json").is_file()),
        "'' or a workdir of experiments/sft.py or run.py (holding config.json and checkpoints)")
    _check_logging(full.logging)
    import_env_modules(full.env.module)
    all_envs = _jax_env_names() + envs_host.names() + envs_host.namespaces()
    require_valid("env.name", full.env.name,
                  full.env.name in _jax_env_names() or envs_host.known(full.env.name),
                  f"one of {all_envs}")
    env_kwargs(full)
    envs_host.PoolConfig(**full.host.to_dict())
    eval_config(full)
    MonitorConfig(**full.monitor.to_dict())  # a run-level setting (run.py), checked here too
    analysis = GradientAnalysisConfig(**full.gradient_analysis.to_dict())  # run-level too
    require_valid("gradient_analysis.every", analysis.every,
                  not analysis.every or not envs_host.known(full.env.name),
                  f"0: env.name = {full.env.name!r} is a host env, whose rollout the analysis "
                  "cannot repeat (JAX envs only)")
    sections = {name: section(**_fastest(name, full[name].to_dict()))
                for name, section in SECTIONS.items() if name not in ("rollout", "advantage")}
    advantage = full.advantage.to_dict()
    if kind is not TrainConfig:  # its estimator's name is checked by train_config
        advantage["estimator"] = None
    sections["advantage"] = AdvantageConfig(**advantage)
    sections["rollout"] = RolloutConfig(**_rollout_values(full))
    if full.nothink:
        sections["rollout"] = dataclasses.replace(sections["rollout"], mode="nothink")
    result = kind(algo=full.algo, **sections)
    if full.vanilla:
        _check_vanilla(full)
    return result.vanilla() if full.vanilla else result


def vanilla_values() -> dict[str, Any]:
    """What `vanilla=True` sets, as "section.key" -> value (TrainConfig.vanilla(): the loss
    keys of VANILLA_LOSS, and every key of the filter section: VANILLA_FILTER's, the rest at
    their defaults; but filter.empty_stop_steps, the run's, which it keeps)."""
    values = {f"loss.{key}": value for key, value in VANILLA_LOSS.items()}
    for field in dataclasses.fields(FilterConfig):
        if field.name != "empty_stop_steps":
            values[f"filter.{field.name}"] = VANILLA_FILTER.get(field.name, field.default)
    return values


def _check_vanilla(full: ConfigDict) -> None:
    """Raises ValueError naming every key that `full` sets explicitly (away from its default)
    to a value other than the one vanilla=True gives it: vanilla would drop it silently."""
    defaults = default_config()
    conflicts = []
    for name, value in vanilla_values().items():
        section, key = name.split(".")
        given = full[section][key]
        if given != defaults[section][key] and given != value:
            conflicts.append(f"{name} = {given!r}")
    if conflicts:
        sets = ", ".join(f"loss.{key} = {value!r}" for key, value in VANILLA_LOSS.items())
        raise ValueError(f"config.vanilla = True conflicts with {', '.join(conflicts)}: vanilla "
                         f"sets {sets} and turns the filter off (filter.keep_ratio = 1.0, every "
                         "other filter key at its default); valid: vanilla = False to keep "
                         "those keys, or leave them unset")


def _check_logging(section: ConfigDict) -> None:
    require_valid("logging.wandb", section.wandb, isinstance(section.wandb, bool),
                  "True or False")
    require_valid("logging.wandb", section.wandb,
                  not section.wandb or importlib.util.find_spec("wandb") is not None,
                  "False, or True with the wandb package installed (pip install -e \".[wandb]\")")
    require_valid("logging.wandb_project", section.wandb_project,
                  isinstance(section.wandb_project, str) and bool(section.wandb_project),
                  "a W&B project name")


@functools.cache
def load_env_entry_points() -> tuple[str, ...]:
    """Loads, once per process, every entry point of the group ENV_ENTRY_POINTS that installed
    packages declare (`[project.entry-points."starpo_jax.envs"] mine = "mypkg.envs"`): a
    module is imported (its envs register themselves), a function (`"mypkg.envs:register"`)
    is called. Returns the entry points' names. Raises ValueError naming one that fails."""
    loaded = []
    for point in importlib.metadata.entry_points(group=ENV_ENTRY_POINTS):
        try:
            target = point.load()
            if callable(target):
                target()
        except Exception as error:  # a broken plugin: named, with its own message
            raise ValueError(f"entry point {point.name} = {point.value!r} of the group "
                             f"{ENV_ENTRY_POINTS!r} failed: {type(error).__name__}: "
                             f"{error}") from error
        loaded.append(point.name)
    return tuple(loaded)


def import_env_modules(modules: str) -> None:
    """Loads the installed packages' env entry points (load_env_entry_points), then imports the
    comma-separated `modules` (config env.module), from the Python path or the current
    directory: a user's envs register themselves when their module is imported. Raises
    ValueError naming a module that cannot be found."""
    load_env_entry_points()
    names = _names(modules) if isinstance(modules, str) else ()
    require_valid("env.module", modules, isinstance(modules, str), "comma-separated module names")
    if names and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # `python experiments/run.py` puts only experiments/ first
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as error:
            raise ValueError(f"config.env.module = {modules!r} is invalid ({error}); valid: "
                             "comma-separated modules, importable from the current directory or "
                             "the Python path, that register envs") from None


def _rollout_values(full: ConfigDict) -> dict[str, Any]:
    """The rollout section of a merged config, every unset env setting (None) taken from the
    env's (envs_jax.settings(env.name)); env.name must be registered."""
    values = full.rollout.to_dict()
    if envs_host.known(full.env.name):
        env_settings = host_env_settings(full.env.name)
    else:
        env_settings = (envs_jax.settings(full.env.name) if _registry_loaded()
                        else BUILTIN[full.env.name])
    for key in ENV_SETTINGS:
        if values[key] is None:
            values[key] = getattr(env_settings, key)
    return _fastest("rollout", values)


def env_kwargs(full: ConfigDict) -> dict[str, Any]:
    """config.env.kwargs as a dict (keyword arguments of the env's constructor), checked."""
    kwargs = full.env.get("kwargs", {})
    kwargs = kwargs.to_dict() if isinstance(kwargs, ConfigDict) else kwargs
    require_valid("env.kwargs", kwargs, isinstance(kwargs, dict),
                  "a dict of keyword arguments of the env's constructor")
    return dict(kwargs)


def make_env(full: ConfigDict) -> Any:
    """The training env of a merged config: envs_host.make or envs_jax.make of env.name with
    env.kwargs. Keyword arguments the constructor refuses raise ValueError naming them."""
    kwargs = env_kwargs(full)
    made = envs_host.make if envs_host.known(full.env.name) else envs_jax.make
    if not kwargs:
        return made(full.env.name)
    try:
        return made(full.env.name, **kwargs)
    except TypeError as error:
        raise ValueError(f"config.env.kwargs = {kwargs!r} is invalid for env "
                         f"{full.env.name!r} ({error}); valid: keyword arguments of its "
                         "constructor") from None


def host_env_settings(name: str) -> envs_jax.EnvSettings:
    """The `settings` (an EnvSettings) of host env `name`'s class, read from the class: no
    instance, no data loaded; EnvSettings() for a factory that is not a HostEnv class."""
    made = envs_host.factory(name).func
    if hasattr(made, "defaults"):  # the dict these settings were before they were EnvSettings
        raise ValueError(f"host env {name!r} ({made.__module__}.{made.__qualname__}) sets "
                         "`defaults`, which is no longer read; valid: `settings = "
                         "envs_host.EnvSettings(max_turns=..., ...)`")
    settings = getattr(made, "settings", envs_jax.EnvSettings())
    if not isinstance(settings, envs_jax.EnvSettings):
        raise ValueError(f"host env {name!r}: settings = {settings!r} is invalid; valid: an "
                         "envs_host.EnvSettings")
    return settings


def _fastest(section: str, values: dict[str, Any]) -> dict[str, Any]:
    """`values` of a section with its unset memory knobs (None) at their fastest settings,
    the dataclass defaults: what runs when nothing is chosen (check_memory=False)."""
    fields = {f.name: f.default for f in dataclasses.fields(SECTIONS[section])}
    return {k: fields[k] if v is None and k in AUTO.get(section, ()) else v
            for k, v in values.items()}


def auto_knobs(config: Any) -> tuple[str, ...]:
    """The memory knobs (autofit.KNOBS) a config leaves unset (None), as "section.key"."""
    full = merged_config(config)
    return tuple(f"{section}.{key}" for section, keys in AUTO.items() for key in keys
                 if full[section][key] is None)


def config_from_train_config(train: TrainConfig, **top: Any) -> ConfigDict:
    """An experiment config holding `train`'s values; `top` sets other keys (e.g. steps=5).
    Nested keys go in as sections: model={"source": "tiny-random"}."""
    c = default_config()
    c.algo = train.algo
    c.nothink = train.rollout.mode == "nothink"
    for name in SECTIONS:
        values = dataclasses.asdict(getattr(train, name))
        c[name].update({k: v for k, v in values.items() if k in c[name]})
    _check_keys(top, c)
    c.update(top)
    return c


def read_run_config(workdir: str | Path) -> tuple[ConfigDict, dict[str, Any] | None]:
    """The config a run of experiments/run.py ran, from its workdir's config.json, checked
    like any config without importing JAX (check_config; train_config, which a consumer calls
    before it builds the step, checks the estimator too), and the record of the memory
    settings chosen for the knobs it left unset (config.json's "auto_memory",
    autofit.Choice.record(); None when there is none). Those knobs are set to the chosen values in the returned config, so that a
    consumer (evaluate.py, export.py, a notebook) builds the step the run stepped with.
    Raises FileNotFoundError / ValueError, one line naming the file and what was expected."""
    workdir = Path(workdir)
    path = workdir / RUN_CONFIG_FILE
    if workdir.exists() and not workdir.is_dir():
        raise FileNotFoundError(f"workdir {str(workdir)!r} is a file, not a directory; expected "
                                "the --workdir of a run of experiments/run.py")
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: expected the --workdir of a run of "
                                "experiments/run.py")
    try:
        saved = read_json_object(path)
    except ValueError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); it is the config.json that "
                         "experiments/run.py writes in its workdir") from None
    record = saved.pop(AUTO_MEMORY, None)
    saved.pop("sft", None)  # an experiments/sft.py workdir's: how it trained, not what runs
    config = merged_config(saved)
    check_config(config)
    chosen = (record or {}).get("settings") or {}
    for section, names in AUTO.items():
        for name in names:
            if config[section][name] is None and f"{section}.{name}" in chosen:
                config[section][name] = chosen[f"{section}.{name}"]
    check_config(config)  # the chosen values are valid knob values too
    return config, record


def evaluated_config(workdir: str | Path, overrides: Mapping[str, Any]) -> ConfigDict:
    """The run's config (read_run_config) with `overrides` ({"eval.episodes": 32, ...})
    applied and checked (check_config: without JAX; api.build checks it whole): what
    experiments/evaluate.py evaluates a run's checkpoint with."""
    foreign = sorted(k for k in overrides if not k.startswith("eval."))
    if foreign:
        raise ValueError(f"only eval.* keys may be overridden when evaluating a run; got {foreign}")
    config, _ = read_run_config(workdir)
    config.eval.update({key.split(".", 1)[1]: value for key, value in overrides.items()})
    check_config(config)
    return config


def _registry_loaded() -> bool:
    """Whether envs_jax's registry is imported (by a user's env module, or any use of the
    games): it then holds the built-in envs and every env registered since."""
    return "envs_jax.registry" in sys.modules


def _jax_env_names() -> tuple[str, ...]:
    """The registered JAX env names, sorted; the built-in ones (envs_jax.catalog) while the
    registry is not imported, without importing it."""
    return envs_jax.names() if _registry_loaded() else tuple(sorted(BUILTIN))


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def eval_config(config: Any) -> EvalConfig:
    """The checked eval section of an experiment config as an EvalConfig."""
    full = merged_config(config)
    envs = _names(full.eval.envs) or default_eval_envs(full.env.name)
    # A host env's run evaluates host envs (host_train.HostEvaluator), a JAX env's JAX envs.
    host = envs_host.known(full.env.name)
    same_kind = envs_host.names() + envs_host.namespaces() if host else _jax_env_names()
    for name in envs:
        require_valid("eval.envs", full.eval.envs,
                      envs_host.known(name) if host else name in same_kind,
                 f"comma-separated names from {same_kind} ('' = the training env and its "
                 "out-of-distribution variants)")
    return EvalConfig(envs=envs, modes=_names(full.eval.modes),
                      **{k: v for k, v in full.eval.items() if k not in ("envs", "modes")})
