"""The public API for notebooks and scripts (a facade: nothing inside the package imports it).

    from starpo_jax import api
    config = api.config_for("bandit", "grpo")      # an ml_collections ConfigDict
    config.model.source = "tiny-random"
    exp = api.build(config)                        # env, model, tokenizer, codec, state, step
    metrics = exp.step()                           # one StarPO iteration -> {name: float}
    api.train(exp, "runs/bandit")                  # the run loop: checkpoints, logs, evaluations

Building an experiment is run/experiment.py, the run loop run/loop.py, the config schema
run/schema.py, the SFT warm start run/sft.py (`build_sft`: its step() is one supervised step),
exporting a run run/export.py; docs/architecture.md has the whole tree.

Loading the model, compiling, restoring, evaluating and saving say what they do as they start,
as INFO records of the logger "starpo_jax.progress" printed on stdout (run/announce.py):
silenced by `logging.getLogger("starpo_jax.progress").setLevel(logging.WARNING)`.
"""

from starpo_jax.run.experiment import (AUTO, DTYPES, ENV_SETTINGS, SECTIONS, ConfigDict,
                                       Experiment, auto_knobs, build, build_evaluator,
                                       check_config, check_memory, config_for,
                                       config_from_train_config, default_config,
                                       demonstrations, eval_config, eval_envs, eval_run_key,
                                       memory_plan, merged_config, paper_eval, pin_memory,
                                       policy_baseline, read_run_config, require_valid,
                                       run_keys, shrink_hint, step_shape, train_config)
from starpo_jax.run.export import export_run
from starpo_jax.run.loop import evaluate_workdir, run, run_sft, stop_on_signals, train
from starpo_jax.run.sft import build as build_sft
from starpo_jax.run.sft import sft_config

__all__ = ["AUTO", "DTYPES", "ENV_SETTINGS", "SECTIONS", "ConfigDict", "Experiment", "auto_knobs",
           "build", "build_evaluator", "build_sft", "check_config", "check_memory", "config_for",
           "config_from_train_config", "default_config", "demonstrations", "eval_config",
           "eval_envs", "eval_run_key", "evaluate_workdir", "export_run", "memory_plan",
           "merged_config", "paper_eval", "pin_memory", "policy_baseline", "read_run_config",
           "require_valid", "run", "run_keys", "run_sft", "sft_config", "shrink_hint",
           "step_shape", "stop_on_signals", "train", "train_config"]
