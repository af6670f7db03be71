"""Exporting a run's trained policy as a Hugging Face model directory (experiments/export.py).

    from starpo_jax.run.export import export_run
    step, path = export_run("runs/bandit", "exported/bandit", dtype="bfloat16")

The run's config.json (read_run_config: model.source and model.dtype) rebuilds the model and
tokenizer with load_pretrained; the actor of the newest checkpoint under checkpoints/ (or of
`step`) is restored alone (checkpoint.restore_actor: a LoRA checkpoint's frozen base weights are
the model's, from model.source and model.init_from) and written with
starpo_jax.models.export.save_pretrained. The critic is not exported; a LoRA run's adapters are
merged into the weights (W + A B * alpha / rank), so the directory is a plain model.

What the policy was fed goes with it. Every reply of the run began with a forced prefix the
rollout wrote after the chat template's generation prompt ("<answer>" with nothink, "<think>"
otherwise): the exported chat template ends its generation prompt with it
(models.export.prefixed_chat_template), so `tokenizer.apply_chat_template(messages,
add_generation_prompt=True)` is token for token the prompt the run fed its policy, and the
model writes the rest of its reply up to "</answer>". starpo_prompt.json (`prompt_setup`) holds
the run's system prompt, the env's intro, the per-turn and reward templates, the reply prefix,
the stop string and an example conversation of turn 1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
from flax import nnx

import envs_jax
from starpo_jax.run import experiment
from starpo_jax.models import load_pretrained
from starpo_jax.models.export import (DEFAULT_MAX_SHARD_SIZE, check_out_dir,
                                      prefixed_chat_template, save_pretrained)
from starpo_jax.models.lora import adapted
from starpo_jax.run.checkpoint import (frozen_parts, load_init_weights, read_only_manager,
                                       restore_actor)
from starpo_jax.run.schema import ConfigDict, read_run_config
from starpo_jax.text import PromptTemplate, default_template, env_intro, stop_strings
from starpo_jax.text.templates import render_conversation_text, single_turn_user

checkpoint_manager = read_only_manager  # the name scripts and tests know
PROMPT_FILE = "starpo_prompt.json"


def run_template(config: ConfigDict) -> PromptTemplate:
    """The prompt template a run (read_run_config's config) fed its policy: its mode's default
    with the config's prompt section over it (as experiment.build's codec)."""
    overrides = {k: v for k, v in config.prompt.items() if k != "verify" and v is not None}
    mode = experiment.train_config(config).rollout.mode
    return PromptTemplate(**{**default_template(mode).__dict__, **overrides})


def prompt_setup(config: ConfigDict, tokenizer: Any, *, chat_template: bool) -> dict[str, Any]:
    """starpo_prompt.json: what the run fed its policy. Every turn is a user message (turn 1:
    the system prompt, then `intro` + `turn`; later turns `reward` + `turn`, with the fields
    filled) and the assistant's reply, which begins with `reply_prefix` and ends with `stop`.
    chat_template: whether the export's chat template writes the reply prefix. For a JAX env
    also its intro and the first turn's messages and prompt text for its initial state of
    PRNGKey(0); a host env's intro is its instructions (None here)."""
    template = run_template(config)
    rollout = experiment.train_config(config).rollout
    turn = template.single_turn if rollout.context_window_mode == "single_turn" else template.turn
    setup: dict[str, Any] = {
        "about": "What this policy was fed by its starpo-jax run, turn by turn. "
                 + ("The chat template's generation prompt ends with reply_prefix, so "
                    "tokenizer.apply_chat_template(messages, add_generation_prompt=True) is the "
                    "prompt the run fed the policy (reply_prefix='' there gives the model's "
                    "original generation prompt); " if chat_template else
                    "Append reply_prefix to tokenizer.apply_chat_template(messages, "
                    "add_generation_prompt=True): that is the prompt the run fed the policy; ")
                 + "its reply goes on after the prefix and ends with stop.",
        "env": config.env.name, "mode": rollout.mode,
        "context_window_mode": rollout.context_window_mode, "system": template.system,
        "intro": None, "turn": turn.replace("{max_tokens}", str(rollout.announced_tokens)),
        "reward": template.reward, "reply_prefix": template.forced_prefix,
        "stop": list(stop_strings(template.think)),
        "chat_template_adds_reply_prefix": chat_template,
    }
    if config.env.name in envs_jax.names():
        env = experiment.make_env(experiment.merged_config(config))
        setup["intro"] = intro = env_intro(
            template, env, max_actions_per_turn=rollout.max_actions_per_turn,
            max_actions_per_traj=rollout.max_actions_per_traj)
        state = env.render_text(jax.jit(env.reset)(jax.random.PRNGKey(0))[0])
        left, tokens = rollout.max_actions_per_traj, rollout.announced_tokens
        messages = render_conversation_text(template, intro, [state], [], [], [left],
                                            max_tokens=tokens)
        if rollout.context_window_mode == "single_turn":
            messages[1]["content"] = single_turn_user(template, intro, 1, state, left, tokens, [])
        prompt = tokenizer.apply_chat_template(messages, tokenize=False,
                                               add_generation_prompt=True)
        setup["example"] = {"messages": messages, "prompt": prompt + template.forced_prefix}
    return setup


def export_run(workdir: str | os.PathLike, out: str | os.PathLike, *, step: int | None = None,
               dtype: str | None = None, max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
               overwrite: bool = False) -> tuple[int, Path]:
    """Exports the actor of `workdir`'s checkpoint `step` (default: the newest) to `out`.

    dtype: of the stored weights (default: the run's model.dtype). Returns (step, out).
    Raises FileNotFoundError for a workdir without config.json or checkpoints, ValueError for
    a step that was not saved (naming the saved ones) and save_pretrained's errors.
    """
    workdir = Path(workdir)
    check_out_dir(Path(out), overwrite)  # before the slow part
    config, _ = read_run_config(workdir)
    manager, steps = checkpoint_manager(workdir)
    try:
        step = steps[-1] if step is None else step
        if step not in steps:
            raise ValueError(f"no checkpoint of step {step} in {str(workdir)!r}; saved steps: "
                             f"{steps}")
        model, tokenizer = load_pretrained(config.model.source, config.model.dtype)
        if config.model.init_from and "actor" in frozen_parts(manager, step):
            # A LoRA checkpoint without its base: the run's starting weights.
            model = load_init_weights(model, config.model.init_from, config.model.source,
                                      config.model.dtype)
        # The run's policy structure (LoRA: with adapters, whose values the checkpoint holds).
        model = adapted(model, experiment.train_config(config).lora, jax.random.PRNGKey(0))
        actor = restore_actor(manager, step, nnx.state(model))
    finally:
        manager.close()
    source_generation = Path(config.model.source) / "generation_config.json"
    generation = json.loads(source_generation.read_text()) if source_generation.is_file() else None
    chat_template = prefixed_chat_template(tokenizer, run_template(config).forced_prefix)
    setup = prompt_setup(config, tokenizer, chat_template=chat_template is not None)
    path = save_pretrained(actor, model.config, tokenizer, out,
                           dtype=dtype or config.model.dtype,
                           max_shard_size=max_shard_size, overwrite=overwrite,
                           generation_config=generation, chat_template=chat_template,
                           extra_files={PROMPT_FILE: json.dumps(setup, indent=2) + "\n"})
    return step, path
