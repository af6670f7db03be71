"""The SFT warm start: demonstrations are rollouts (token for token), policies play well, the
loss is the reply tokens' cross-entropy, JSONL round trips, resume, LoRA, RL from an SFT run."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

import envs_jax  # noqa: E402
from envs_jax.frozen_lake import types as fl  # noqa: E402
from envs_jax.sokoban.solver import solve  # noqa: E402
from starpo_jax import api  # noqa: E402
from starpo_jax.analysis.suite import load_config  # noqa: E402
from starpo_jax.run import loop as runner, sft  # noqa: E402
from starpo_jax.run.checkpoint import Checkpoints  # noqa: E402
from starpo_jax.config import RolloutConfig  # noqa: E402
from starpo_jax.rollout.demonstrations import (build_reply_encoder, demonstrate,  # noqa: E402
                                               read_jsonl, tokenize_conversations, transcripts,
                                               write_jsonl)
from starpo_jax.models.lora import merged_params  # noqa: E402
from starpo_jax.rollout.policies import (frozen_lake_values, make_policy, mixed_policy,  # noqa: E402
                                        sokoban_distances)
from starpo_jax.rollout.jax_env import group_states, rollout  # noqa: E402
from starpo_jax.text import build_codec  # noqa: E402
from helpers import forward  # noqa: E402
from helpers.scripts import stopped_before_step_1  # noqa: E402
from helpers.tiny import SHORT_TURN, tiny_config  # noqa: E402
from test_rollout import REPLY_TOKENS, SHORT_TEMPLATE, _replay_row, tiny_bandit_setup  # noqa: E402



@functools.cache
def _grid_setup(name: str, mode: str, reply_tokens: int = 32):
    """(env, SmolLM2 tokenizer, codec, reply encoder, rollout config) of a grid env."""
    from helpers.text_testing import smollm2_tokenizer

    tok = smollm2_tokenizer()
    env = envs_jax.make(name)
    codec = build_codec(tok, env, mode=mode, max_tokens=reply_tokens, verify=20, **SHORT_TEMPLATE)
    config = RolloutConfig(groups=2, group_size=2, max_turns=3, reply_tokens=reply_tokens,
                           mode=mode, max_actions_per_turn=5, max_actions_per_traj=10)
    return env, tok, codec, build_reply_encoder(tok, env, codec, max_actions_per_turn=5), config


@functools.cache  # the same demonstrations serve several tests (read, never written)
def _demos(name: str, mode: str, policy: str, key: int = 0, solver_share: float = 0.5,
           **shape):
    env, tok, codec, encoder, config = _grid_setup(name, mode)
    config = dataclasses.replace(config, **shape)
    p = make_policy(policy, env, max_actions_per_turn=config.max_actions_per_turn,
                    max_turns=config.max_turns, max_actions_per_traj=config.max_actions_per_traj,
                    solver_share=solver_share)
    run = jax.jit(lambda k: demonstrate(env, codec, config, p, encoder, k,
                                        eos_id=tok.eos_token_id, pad_id=tok.pad_token_id))
    return jax.device_get(run(jax.random.PRNGKey(key))), config


def test_demonstration_is_the_rollout_of_the_same_replies():
    """A demonstration whose reply source hands back a sampled rollout's replies is that
    rollout, field for field (same prompts, buffers, masks, env steps; no second loop)."""
    model, tok, env, codec = tiny_bandit_setup()
    config = RolloutConfig(groups=2, group_size=2, max_turns=3, reply_tokens=REPLY_TOKENS,
                           mode="nothink", max_actions_per_traj=3)
    graphdef, params = nnx.split(model)
    key = jax.random.PRNGKey(5)
    ids = dict(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    sampled = jax.jit(lambda p: rollout(graphdef, p, env, codec, config, key, **ids))(params)
    # Each turn's sampled tokens, in order, as [B, T, reply_tokens].
    host = jax.device_get(sampled)
    replies = np.full((4, config.max_turns, REPLY_TOKENS), tok.pad_token_id, np.int32)
    for b in range(4):
        for k in range(config.max_turns):
            row = host.tokens[b][host.turn_ids[b] == k]
            replies[b, k, : len(row)] = row

    def replay(states, turn, _key, _taken):
        return jnp.asarray(replies)[:, turn], jnp.asarray(host.reply_lengths)[:, turn]

    demo = jax.jit(lambda: rollout(None, None, env, codec, config, key, replies=replay, **ids))()
    for field in ("tokens", "lengths", "prompt_lengths", "loss_mask", "turn_ids", "turn_rewards",
                  "format_penalties", "turn_taken", "format_ok", "reply_lengths", "success",
                  "num_actions", "effective_actions"):
        np.testing.assert_array_equal(getattr(demo, field), getattr(sampled, field), err_msg=field)
    assert not np.asarray(demo.behaviour_logp).any()  # nothing was sampled


@pytest.mark.parametrize("name,policy", [
    ("sokoban", "random"),
    # The slow tier (README); CI checks FrozenLake's solver against numpy value iteration.
    pytest.param("frozen_lake", "solver", marks=pytest.mark.slow)])
def test_demonstrations_equal_the_chat_template_of_their_conversation(name, policy):
    """Independent reference: the host replays each row from its reply text (reference_parse,
    the unbatched env) and tokenises the conversation with apply_chat_template."""
    out, config = _demos(name, "nothink", policy)
    env, tok, codec, _, _ = _grid_setup(name, "nothink")
    reset_keys = jax.random.split(jax.random.split(jax.random.PRNGKey(0))[0], config.groups)
    states = jax.vmap(env.reset)(reset_keys)[0]
    states = group_states(states, config.group_size)
    eos = tok.eos_token_id
    for b in range(config.groups * config.group_size):
        # Every reply ends with EOS, the template's end of turn, in the loss mask; the host's
        # transcript has it as the next piece's first token (and after the last reply, in the
        # closing): replay the replies without it, then compare around it.
        n = int(out.lengths[b])
        ends = np.flatnonzero(out.loss_mask[b, :n] & ~np.append(out.loss_mask[b, 1:n], False))
        assert (out.tokens[b, ends] == eos).all() and ends[-1] == n - 1
        turn_ids = out.turn_ids[b].copy()
        turn_ids[ends] = -1
        state = jax.tree.map(lambda x: x[b], states)
        tokens, mask, _, rewards, _, taken = _replay_row(
            tok, env, codec, config, state, out.tokens[b], turn_ids)
        assert out.tokens[b, : n - 1].tolist() == tokens, f"row {b}"
        reply_mask = out.loss_mask[b, : n - 1].copy()
        reply_mask[ends[:-1]] = False
        assert reply_mask.astype(int).tolist() == mask
        assert int(out.num_actions[b]) == taken
        np.testing.assert_allclose(out.turn_rewards[b, : len(rewards)], rewards, atol=1e-6)
        assert out.format_ok[b][out.turn_taken[b]].all()


@pytest.mark.optimized  # its time is running the codecs' checks (conftest)
@pytest.mark.parametrize("mode", ["nothink", "think"])
def test_reply_tokens_are_the_tokenizers_own(mode, qwen_style_tok):
    env = envs_jax.make("sokoban")
    for tok in (_grid_setup("sokoban", mode)[1], qwen_style_tok):
        codec = build_codec(tok, env, mode=mode, verify=5, **SHORT_TEMPLATE)
        encoder = build_reply_encoder(tok, env, codec, max_actions_per_turn=3)
        ids, n = jax.jit(encoder.encode)(jnp.asarray([0, 2, -1], jnp.int32))
        text = ("<answer>" if mode == "nothink" else
                "<think>I will take the actions below.</think><answer>") + "Up || Left</answer>"
        want = tok.encode(text + "<|im_end|>", add_special_tokens=False)
        assert list(codec.forced_prefix_ids) + np.asarray(ids)[: int(n)].tolist() == want


def test_jsonl_round_trip(tmp_path):
    """Demonstrations -> JSONL transcripts -> the chat template's tokens: the same rows."""
    out, _ = _demos("frozen_lake", "think", "random", key=1)
    env, tok, codec, _, _ = _grid_setup("frozen_lake", "think")
    path = tmp_path / "demos.jsonl"
    assert write_jsonl(path, transcripts(out, tok, codec)) == 4
    conversations = read_jsonl(path)
    assert [m["role"] for m in conversations[0]["messages"][:3]] == ["system", "user", "assistant"]
    assert conversations[0]["messages"][2]["content"].startswith(
        "<think>I will take the actions below.</think><answer>")
    rows = tokenize_conversations(tok, conversations, length=out.tokens.shape[1],
                                  pad_id=tok.pad_token_id, skip_prefix="<think>")
    np.testing.assert_array_equal(rows.tokens, out.tokens)
    np.testing.assert_array_equal(rows.loss_mask, out.loss_mask)
    np.testing.assert_array_equal(rows.lengths, out.lengths)
    (tmp_path / "bad.jsonl").write_text('{"messages": [{"role": "user"}]}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1 is invalid"):
        read_jsonl(tmp_path / "bad.jsonl")


def test_sokoban_solver_is_optimal_and_solves():
    """Distances from the JAX search equal the plain-Python BFS solver's; the solver's
    demonstrations solve every level whose optimal length fits the 10-action budget."""
    out, config = _demos("sokoban", "nothink", "solver", key=3, groups=8, group_size=1)
    env = _grid_setup("sokoban", "nothink")[0]
    keys = jax.random.split(jax.random.split(jax.random.PRNGKey(3))[0], 8)
    states = jax.vmap(env.reset)(keys)[0]
    dist = jax.jit(jax.vmap(lambda s: sokoban_distances(env, s)[0]))(states)
    cols = env.dim_room[1]
    n = env.dim_room[0] * cols
    for b in range(8):
        state = jax.tree.map(lambda x: x[b], states)
        here = (int(state.player[0]) * cols + int(state.player[1])) * n + int(
            np.argmax(np.asarray(state.boxes).reshape(-1)))
        optimal = solve(np.asarray(env.render_symbols(state)))
        assert int(dist[b, here]) == optimal
        assert bool(out.success[b]) == (optimal <= config.max_actions_per_traj)
        if optimal <= config.max_actions_per_traj:
            assert int(out.num_actions[b]) == optimal


def _numpy_frozen_lake_q(tiles: np.ndarray, horizon: int, success_rate: float = 1 / 3,
                         ) -> np.ndarray:
    """Finite-horizon value iteration of the slippery 4-action MDP, in plain loops: the intended
    direction with probability success_rate, each perpendicular one half of the rest."""
    size = tiles.shape[0]
    value = np.zeros((size, size))
    qs = []
    for _ in range(horizon):
        q = np.zeros((size * size, 4))
        for r in range(size):
            for c in range(size):
                for a in range(4):
                    for slip in (-1, 0, 1):
                        dr, dc = fl.MOVES[(a + slip) % 4]
                        r2, c2 = min(max(r + dr, 0), size - 1), min(max(c + dc, 0), size - 1)
                        t = tiles[r2, c2]
                        gain = 1.0 if t == fl.GOAL else (value[r2, c2] if t == fl.FROZEN else 0)
                        chance = success_rate if slip == 0 else (1 - success_rate) / 2
                        q[r * size + c, a] += gain * chance
        value = q.max(1).reshape(size, size)
        qs.append(q)
    return np.stack(qs)


def test_mix_policy_plays_the_solver_on_its_share_of_turns():
    """mixed_policy picks its second policy on a `share` of calls (each call's own coin);
    "mix" at share 1 is the solver's demonstrations, at share 0 no solver turn is played, and a
    share outside [0, 1] is named."""
    zeros = lambda state, key: jnp.zeros((3,), jnp.int32)  # noqa: E731
    ones = lambda state, key: jnp.ones((3,), jnp.int32)  # noqa: E731
    keys = jax.random.split(jax.random.PRNGKey(0), 4000)
    for share in (0.0, 0.3, 1.0):
        picks = jax.vmap(lambda k: mixed_policy(zeros, ones, share)(None, k))(keys)
        assert (picks.min(1) == picks.max(1)).all()  # one policy's whole turn, never a blend
        assert abs(float(picks[:, 0].mean()) - share) < 0.03
    env = _grid_setup("sokoban", "nothink")[0]
    solver, _ = _demos("sokoban", "nothink", "solver", key=3, groups=8, group_size=1)
    mix_all, _ = _demos("sokoban", "nothink", "mix", key=3, solver_share=1.0, groups=8,
                        group_size=1)
    np.testing.assert_array_equal(mix_all.tokens, solver.tokens)
    random, _ = _demos("sokoban", "nothink", "random", key=3, groups=8, group_size=1)
    half, _ = _demos("sokoban", "nothink", "mix", key=3, groups=8, group_size=1)
    assert half.success.mean() > random.success.mean()
    with pytest.raises(ValueError, match=r"solver_share = 1.5 is not a probability"):
        make_policy("mix", env, max_actions_per_turn=5, max_turns=5, max_actions_per_traj=10,
                    solver_share=1.5)
    c = sft_tiny_config()
    c.sft.solver_share = -0.1
    with pytest.raises(ValueError, match=r"config.sft.solver_share = -0.1 is invalid"):
        sft.split_config(c)


def test_micro_batches_divide_all_the_rows_sft_trains_on():
    """SFT has no filter and one update over every row: 8 rows take 8 micro-batches (a StarPO
    run's check would count the 2 rows its filter keeps), and 3 is named against the 8."""
    c = sft_tiny_config()
    c.rollout.update(groups=4, group_size=2)
    c.optim.micro_batches = 8
    run, _ = sft.split_config(c)
    assert (run.filter.keep_ratio, run.optim.micro_batches) == (1.0, 8)
    c.optim.micro_batches = 3
    with pytest.raises(ValueError, match=r"optim.micro_batches = 3 is invalid; valid: a divisor "
                       r"of the 8 rows of a mini-batch"):
        sft.split_config(c)


def test_shipped_solver_sft_config_is_the_measured_recipe():
    """sokoban_sft_solver.py (the GPU-trained start of results/cpu/pilots) checks and says what
    was measured: solver demonstrations, 64 a step, LoRA rank 32, 100 steps."""
    run, section = sft.split_config(load_config("sokoban_sft_solver"))
    assert (section.policy, run.rollout.groups, run.rollout.group_size) == ("solver", 64, 1)
    assert (run.lora.rank, run.optim.actor_lr, run.steps) == (32, 5e-4, 100)
    assert run.eval.episodes == 64 and run.eval.seed == 0


def test_frozen_lake_solver_values_match_numpy_value_iteration():
    env = envs_jax.make("frozen_lake")
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    states = jax.vmap(env.reset)(keys)[0]
    qs = jax.jit(jax.vmap(lambda t: frozen_lake_values(env, t, 10)))(states.tiles)
    for b in range(3):
        np.testing.assert_allclose(qs[b], _numpy_frozen_lake_q(np.asarray(states.tiles[b]), 10),
                                   atol=1e-5)
    for rate in (0.8, 1.0):  # RAGEN's CoordFrozenLake slips 1 in 5; 1.0 never slips
        lake = envs_jax.make("frozen_lake", success_rate=rate)
        qs = jax.jit(jax.vmap(lambda t: frozen_lake_values(lake, t, 10)))(states.tiles)
        for b in range(3):
            np.testing.assert_allclose(
                qs[b], _numpy_frozen_lake_q(np.asarray(states.tiles[b]), 10, rate), atol=1e-5)
    solver, _ = _demos("frozen_lake", "nothink", "solver", key=4, groups=32, group_size=1)
    random, _ = _demos("frozen_lake", "nothink", "random", key=4, groups=32, group_size=1)
    assert solver.success.mean() > random.success.mean()


def test_random_policy_is_valid_and_bad_names_are_named():
    out, config = _demos("sokoban", "nothink", "random", key=2)
    assert out.format_ok[out.turn_taken].all()
    per_turn = out.num_actions.sum() / out.turn_taken.sum()
    assert 1 <= per_turn <= config.max_actions_per_turn
    env = envs_jax.make("sokoban")
    with pytest.raises(ValueError, match=r"unknown policy 'greedy'; valid: random, solver"):
        make_policy("greedy", env, max_actions_per_turn=5, max_turns=5, max_actions_per_traj=10)
    with pytest.raises(ValueError, match=r"no 'solver' policy for object"):
        make_policy("solver", object(), max_actions_per_turn=1, max_turns=1,
                    max_actions_per_traj=1)
    c = sft_tiny_config()
    c.sft.policy = "oracle"
    with pytest.raises(ValueError, match=r"config.sft.policy = 'oracle' is invalid"):
        sft.split_config(c)


def test_api_demonstrations_take_a_name_or_a_function():
    """api.demonstrations: the bandit's solver always pulls the high-risk arm (success = that
    arm pulled); a user function pulling the other arm never succeeds."""
    exp = tiny_sft()
    solver = api.demonstrations(exp, "solver", jax.random.PRNGKey(0), groups=4)
    assert solver.success.all() and solver.format_ok[:, 0].all()
    low = api.demonstrations(exp, lambda state, key: jnp.array([0], jnp.int32),
                             jax.random.PRNGKey(0))
    assert not low.success.any() and (low.num_actions == 1).all()


# ---------------------------------------------------------------- training


def sft_tiny_config(lora: int = 0):
    """Bandit SFT on the solver's demonstrations, tiny-random, 2 x 2 rows."""
    c = sft.sft_config("bandit", "solver", groups=2, group_size=2, max_turns=1, reply_tokens=8)
    c.model.source = "tiny-random"
    c.nothink = True
    c.prompt.update(system="", intro="", turn=SHORT_TURN, verify=20)
    c.optim.actor_lr = 1e-3
    c.lora.rank = lora
    c.check_memory = False
    c.steps, c.eval_every, c.sample_every, c.checkpoint_every = 3, 0, 0, 1
    c.eval.update(episodes=2, modes="greedy")
    return c


@functools.cache
def tiny_sft(lora: int = 0) -> sft.SftExperiment:
    return sft.build(sft_tiny_config(lora))


def test_sft_loss_is_the_reply_tokens_cross_entropy():
    """The loss equals a numpy cross-entropy over the loss-mask tokens of the model's full
    logits; micro-batches and the shared-prefix forward give the same loss and update."""
    exp = tiny_sft()
    out = exp.demos(jax.random.PRNGKey(0))
    mask = np.asarray(out.loss_mask)
    targets = np.asarray(out.tokens)
    row, pos = np.nonzero(mask[:, 1:])  # the positions that predict a loss token
    logits = np.asarray(forward.logits(exp.model, out.tokens))[row, pos].astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    want = -logp[np.arange(len(row)), targets[row, pos + 1]].sum() / mask.sum()
    # The loss tokens are the replies after the forced prefix, their end of turn included.
    for b in range(4):
        assert exp.tokenizer.decode(targets[b][mask[b]]) == "Dragon</answer><|im_end|>"
    results = {}
    for micro, shared in ((1, False), (2, True)):
        train = dataclasses.replace(exp.train, optim=dataclasses.replace(exp.train.optim,
                                                                         micro_batches=micro))
        fns = sft._fns(exp, train)
        state, metrics = jax.jit(fns.sft, static_argnums=2)(exp.fresh_state(), out, shared)
        results[micro, shared] = state.actor
        np.testing.assert_allclose(float(metrics["sft/loss"]), want, rtol=1e-4)
        loss = jax.jit(fns.sft_loss, static_argnums=2)(exp.fresh_state().actor, out, shared)
        np.testing.assert_allclose(float(loss["loss"]), want, rtol=1e-4)
    # One AdamW step of lr 1e-3: float-rounding differences of a near-zero gradient move a
    # weight by a small fraction of the step.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), results[1, False],
                 results[2, True])


def test_sft_learns_and_lora_trains_only_adapters():
    exp = tiny_sft(lora=4)
    exp.state = exp.fresh_state()
    before = jax.tree.map(np.asarray, exp.state.actor)
    losses = [exp.step()["sft/loss"] for _ in range(3)]
    assert losses[-1] < losses[0]
    after = jax.tree.map(np.asarray, exp.state.actor)
    changed = jax.tree_util.tree_map_with_path(
        lambda path, a, b: ("lora" in jax.tree_util.keystr(path), not np.array_equal(a, b)),
        before, after)
    flags = jax.tree.leaves(changed, is_leaf=lambda x: isinstance(x, tuple))
    assert any(c for is_lora, c in flags if is_lora)
    assert not any(c for is_lora, c in flags if not is_lora)


def test_resume_repeats_the_same_steps(tmp_path):
    exp = tiny_sft()
    exp.state = exp.fresh_state()
    straight = [exp.step() for _ in range(3)]
    exp.state = exp.fresh_state()
    exp.step()
    checkpoints = Checkpoints(tmp_path / "checkpoints", 1, 2)
    checkpoints.maybe_save(exp.state, force=True)
    exp.state = checkpoints.restore_latest(like=exp.fresh_state())
    checkpoints.close()
    assert [exp.step() for _ in range(2)] == straight[1:]


def test_a_lora_run_resumes_exactly_from_its_adapters(tmp_path):
    """run.py's loop on a LoRA run: its checkpoints hold the adapters, their AdamW moments and
    the step, not the frozen base weights; stopped after step 1 and resumed (the base from the
    experiment's fresh state) it logs the numbers of a run never stopped."""
    exp = tiny_sft(lora=4)
    exp.state, exp.config.steps = exp.fresh_state(), 2
    try:
        assert runner.train(exp, tmp_path / "straight") == 2
        exp.config.steps = 1
        assert runner.train(exp, tmp_path / "stopped") == 1
        exp.config.steps = 2
        assert runner.train(exp, tmp_path / "stopped", resume=True) == 2
    finally:
        exp.config.steps = 3
    lines = {name: [{k: v for k, v in json.loads(line).items() if not k.startswith("timing/")}
                    for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
             for name in ("straight", "stopped")}
    assert lines["stopped"] == lines["straight"] and len(lines["straight"]) == 2
    checkpoints = Checkpoints(tmp_path / "stopped" / "checkpoints", 0, 1)
    try:
        saved = checkpoints.manager.item_metadata(2).tree
    finally:
        checkpoints.close()
    assert set(saved["frozen"]) == {"actor"}
    assert all("_lora_" in name for name in saved["actor"]["layers"])
    assert set(saved["actor"]) == {"layers"}, "no embedding, norm or other base weight"


def test_rl_starts_from_the_sft_workdir(tmp_path, caplog):
    """run.py's loop on an SFT experiment writes a workdir; model.init_from loads its policy
    (LoRA adapters merged) into a StarPO run's model, whose train step compiles once (restored
    weights committed to a device made step 2 compile it again)."""
    exp = tiny_sft(lora=4)
    exp.state = exp.fresh_state()
    assert runner.train(exp, tmp_path) == 3
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3 and "sft/loss" in json.loads(lines[0])
    config = tiny_config()
    config.model.init_from = str(tmp_path)
    rl_exp = api.build(config)
    want = merged_params(nnx.to_pure_dict(exp.state.actor), exp.model.config)
    got = nnx.to_pure_dict(nnx.state(rl_exp.model))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), got, want)
    with jax.log_compiles(), caplog.at_level(logging.WARNING):
        rl_exp.step()
        rl_exp.step()
    compiles = [r for r in caplog.records if r.getMessage().startswith("Compiling jit(step)")]
    assert len(compiles) == 1
    # A host env's run starts from it the same way (one prelude for both kinds of env).
    host = api.config_for("rg_chain_sum", "grpo", groups=2, group_size=2, reply_tokens=4)
    host.model.source, host.nothink, host.host.workers = "tiny-random", True, 1
    host.model.init_from = str(tmp_path)
    host_exp = api.build(host)
    got = nnx.to_pure_dict(nnx.state(host_exp.model))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), got, want)
    config.model.init_from = str(tmp_path / "nothing")
    with pytest.raises(ValueError, match=r"config.model.init_from = .* is invalid"):
        api.train_config(config)


def _sft_cli(*args: str) -> "subprocess.CompletedProcess":
    import subprocess

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, str(root / "experiments" / "sft.py"), *args],
                          capture_output=True, text=True, env=env, timeout=900)


def test_sft_command_names_a_bad_policy_in_one_line(tmp_path):
    done = _sft_cli("--config", "frozen_lake_sft.py", "--config.sft.policy=oracle",
                    "--workdir", str(tmp_path / "w"))
    assert done.returncode == 1
    assert done.stderr.strip() == ("error: config.sft.policy = 'oracle' is invalid; valid: one "
                                   "of ('random', 'solver', 'mix')")


@pytest.mark.slow
def test_sft_command_writes_a_workdir_and_resumes(tmp_path):
    """experiments/sft.py end to end (tiny model): demos.jsonl, before.json, metrics with
    sft/loss and the held-out evaluation, then --resume to a later step; evaluate.py reads the
    SFT workdir."""
    work = tmp_path / "w"
    tiny = ["--config", "frozen_lake_sft.py", "--config.model.source=tiny-random",
            "--config.rollout.max_turns=2", "--config.rollout.groups=2",
            "--config.rollout.group_size=2", "--config.optim.micro_batches=1",
            "--config.eval.episodes=2", "--config.eval_every=2", "--config.sample_every=0",
            "--config.check_memory=False", "--workdir", str(work)]
    done = _sft_cli(*tiny, "--config.steps=2", "--config.sft.write_demos=3")
    assert done.returncode == 0, done.stderr
    assert len(read_jsonl(work / "demos.jsonl")) == 3
    assert "val/frozen_lake/greedy/action_is_valid" in json.loads(
        (work / "before.json").read_text())
    rows = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 0: before.json's, logged
    assert {k: v for k, v in rows[0].items() if k != "step"} == json.loads(
        (work / "before.json").read_text())
    assert "sft/loss" in rows[1] and "val/sft/heldout/loss" in rows[2]
    done = _sft_cli(*tiny, "--config.steps=3", "--config.sft.write_demos=3", "--resume")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    step, metrics = runner.evaluate_workdir(work, None, {"eval.episodes": 2})
    assert step == 3 and "val/frozen_lake/greedy/action_is_valid" in metrics


@pytest.mark.slow  # a sft.py process to its first evaluation (~30-60 s)
def test_sft_command_stopped_before_step_1_leaves_nothing(tmp_path):
    """Ctrl-C during sft.py's evaluation before SFT (its demonstrations written already) ends
    the process at once; the fresh run leaves nothing: no demos.jsonl, before.json, config.json
    or checkpoint."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    work = tmp_path / "w"
    process = subprocess.Popen(
        [sys.executable, str(root / "experiments" / "sft.py"), "--config", "frozen_lake_sft.py",
         "--config.model.source=tiny-random", "--config.rollout.max_turns=2",
         "--config.rollout.groups=2", "--config.rollout.group_size=2",
         "--config.eval.episodes=2", "--config.eval_every=2", "--config.sft.write_demos=3",
         "--workdir", str(work)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(root)})
    out, _ = stopped_before_step_1(process, "evaluating ")
    assert "3 demonstrations -> " in out
    assert not work.exists(), sorted(p.name for p in work.iterdir())


def test_an_sft_workdir_resumes_across_config_forms_and_new_sft_keys(tmp_path):
    """An SFT workdir's config.json written before sft.solver_share existed (the CPU suite's
    SFT start) lacks it: checked against the SFT defaults, the key at its default passes and
    another value is named. The keys split_config forces (one update on every row) may differ
    (a config.json holds the given or the effective form); a StarPO run's rules are neither."""
    from starpo_jax.run.workdir import RunFault, check_config

    config = sft.sft_config("sokoban").to_dict()
    saved = json.loads(json.dumps(config))
    del saved["sft"]["solver_share"]
    saved["optim"]["minibatch_rows"] = 3
    saved["filter"]["keep_ratio"] = 0.25
    path = tmp_path / "config.json"
    path.write_text(json.dumps(saved))
    rules = sft.resume_rules(config, runner.RESUMABLE_CHANGES)
    check_config(path, config, True, has_checkpoints=True, **rules)
    config["sft"]["solver_share"] = 0.9
    with pytest.raises(RunFault, match=r"sft.solver_share: '\(absent\)' there, 0.9 here"):
        check_config(path, config, True, has_checkpoints=True, **rules)
    starpo = sft.resume_rules(api.default_config(), runner.RESUMABLE_CHANGES)
    assert "sft" not in starpo["defaults"] and starpo["resumable"] == runner.RESUMABLE_CHANGES
