"""Demonstrations of host envs: a policy of the observation text played through the host
rollout (the same loop as a sampled one), exported as JSONL transcripts, trained on by sft."""

from __future__ import annotations

import functools
import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

import envs_host  # noqa: E402
import envs_jax  # noqa: E402
from envs_host import EnvPool  # noqa: E402
from envs_host.jax_adapter import JaxTextEnvHost  # noqa: E402
from starpo_jax.run import sft  # noqa: E402
from starpo_jax.config import RolloutConfig  # noqa: E402
from starpo_jax.rollout.demonstrations import (host_demonstrate, read_jsonl,  # noqa: E402
                                               tokenize_conversations, transcripts, write_jsonl)
from starpo_jax.rollout.host import host_buffer_length, host_rollout  # noqa: E402
from starpo_jax.rollout.host_text import build_host_text  # noqa: E402
from test_host_rollout import SHORT_TEMPLATE, tiny  # noqa: E402

FIELDS = ("tokens", "lengths", "prompt_lengths", "loss_mask", "turn_ids", "turn_rewards",
          "format_penalties", "turn_taken", "format_ok", "reply_lengths", "success",
          "num_actions", "effective_actions", "turn_anchors")


def test_host_replies_replay_a_sampled_host_rollout():
    """A host rollout whose reply source hands back a sampled host rollout's replies is that
    rollout, field for field (one loop: same prompts, buffers, masks, env steps)."""
    model, tok = tiny()
    graphdef, params = nnx.split(model)
    env = envs_jax.make("sokoban")
    config = RolloutConfig(groups=2, group_size=2, max_turns=3, reply_tokens=4, mode="nothink",
                           max_actions_per_turn=3, max_actions_per_traj=5)
    text = build_host_text(tok, JaxTextEnvHost(env), config, **SHORT_TEMPLATE,
                           forced_prefix="<answer>Up || Left</answer>")
    kw = dict(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, seeds=[3, 4])
    key = jax.random.PRNGKey(7)
    with_pool = lambda run: run(EnvPool("sokoban", functools.partial(  # noqa: E731
        JaxTextEnvHost, env), rows=4))
    sampled, _ = with_pool(lambda pool: host_rollout(graphdef, params, pool, text, config, key,
                                                     **kw))
    sampled = jax.device_get(sampled)
    seen = []

    def replay(observations, turn, _key):
        seen.append(observations)
        tokens = np.full((4, 4), tok.pad_token_id, np.int32)
        for b in range(4):
            row = sampled.tokens[b][sampled.turn_ids[b] == turn]
            tokens[b, : len(row)] = row
        return tokens, sampled.reply_lengths[:, turn]

    demo, _ = with_pool(lambda pool: host_rollout(None, None, pool, text, config, key,
                                                  replies=replay, **kw))
    demo = jax.device_get(demo)
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(demo, field), getattr(sampled, field),
                                      err_msg=field)
    assert not demo.behaviour_logp.any()
    assert sampled.num_actions.sum() > 0  # the env stepped
    # The source sees each row's current observation, None once the row has stopped.
    assert [o is None for o in seen[-1]] == list(~sampled.turn_taken[:, len(seen) - 1])
    assert all(isinstance(o, str) and "#" in o for o in seen[0])


def _chain_sum_answer(observation: str, rng: np.random.Generator) -> str:
    """The solver of reasoning-gym's chain_sum, from the question's text alone."""
    expression = re.search(r"problem: ([\d +-]+) =", observation).group(1)
    return str(eval(expression))  # noqa: S307 - digits, spaces, + and - only


@functools.cache
def _chain_sum_setup():
    _, tok = tiny()
    config = RolloutConfig(groups=4, group_size=1, max_turns=1, reply_tokens=12,
                           mode="nothink", max_actions_per_turn=1, max_actions_per_traj=1)
    text = build_host_text(tok, envs_host.make("rg_chain_sum"), config, **SHORT_TEMPLATE)
    return tok, config, text


def _chain_sum_demos(key: int, policy=_chain_sum_answer):
    tok, config, text = _chain_sum_setup()
    pool = EnvPool("rg_chain_sum", envs_host.factory("rg_chain_sum"), rows=4)
    try:
        out, _ = host_demonstrate(pool, text, config, policy, jax.random.PRNGKey(key),
                                  eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    finally:
        pool.close()
    return jax.device_get(out)


def test_host_demonstrations_solve_and_round_trip_through_jsonl(tmp_path):
    """A policy of the question's text solves reasoning-gym's chain_sum (the env's own
    scoring); the transcripts re-tokenise with the chat template to the rollout's rows."""
    tok, config, text = _chain_sum_setup()
    out = _chain_sum_demos(0)
    assert out.success.all() and out.format_ok.all()
    path = tmp_path / "demos.jsonl"
    assert write_jsonl(path, transcripts(out, tok, text)) == 4
    conversations = read_jsonl(path)
    for item in conversations:
        user, reply = item["messages"][1]["content"], item["messages"][2]["content"]
        assert reply == f"<answer>{_chain_sum_answer(user, None)}</answer>"
    rows = tokenize_conversations(tok, conversations, length=host_buffer_length(text, config),
                                  pad_id=tok.pad_token_id, skip_prefix="<answer>")
    np.testing.assert_array_equal(rows.tokens, out.tokens)
    np.testing.assert_array_equal(rows.loss_mask, out.loss_mask)
    # A wrong policy: same questions (same key), no success.
    wrong = _chain_sum_demos(0, lambda obs, rng: str(int(_chain_sum_answer(obs, rng)) + 1))
    assert not wrong.success.any()
    np.testing.assert_array_equal(wrong.prompt_lengths, out.prompt_lengths)


def test_sft_trains_a_host_env_on_its_transcripts(tmp_path):
    """sft.data on a host env: the file's rows are what the loss reads; steps lower it; the
    evaluation runs the host rollout and adds the held-out loss."""
    tok, config, text = _chain_sum_setup()
    path = tmp_path / "demos.jsonl"
    write_jsonl(path, transcripts(_chain_sum_demos(1), tok, text)
                + transcripts(_chain_sum_demos(2), tok, text))
    c = sft.sft_config("rg_chain_sum", groups=2, group_size=1, max_turns=1, reply_tokens=12)
    c.model.source = "tiny-random"
    c.nothink = True
    c.host.workers = 2
    c.prompt.update(system="", intro="", turn=SHORT_TEMPLATE["turn"])
    c.optim.actor_lr = 1e-3
    c.check_memory = False
    c.eval.update(episodes=2, modes="greedy")
    c.sft.update(data=str(path), heldout=0.25)
    exp = sft.build(c)
    assert exp.data.tokens.shape[0] == 6 and exp.heldout.tokens.shape[0] == 2
    losses = [exp.step()["sft/loss"] for _ in range(4)]
    assert losses[-1] < losses[0]
    metrics = exp.evaluator().evaluate(exp.state.actor).metrics
    assert "val/rg_chain_sum/greedy/success" in metrics and "val/sft/heldout/loss" in metrics
    c.sft.data = ""
    with pytest.raises(ValueError, match=r"config.env.name = 'rg_chain_sum' is a host env; "
                                         r"valid for SFT: a JAX env"):
        sft.split_config(c)
