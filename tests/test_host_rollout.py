"""The host-driven rollout against the compiled one, on JAX envs wrapped as host envs.

Same model, same keys, same initial states (the adapter's seeds map to the compiled rollout's
reset keys): every field of the two Rollouts must agree (log-probs to float tolerance). A
forced prefix holding a whole answer makes every turn step the env on both paths, whatever the
tiny random model samples after it (the parser reads the first answer).
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import envs_jax  # noqa: E402
from envs_host import EnvPool, HostEnv  # noqa: E402
from envs_host.jax_adapter import JaxTextEnvHost  # noqa: E402
from starpo_jax.config import RolloutConfig  # noqa: E402
from starpo_jax.rollout.host import host_rollout  # noqa: E402
from starpo_jax.rollout.host_text import build_host_text  # noqa: E402
from starpo_jax.models import load_pretrained  # noqa: E402
from starpo_jax.rollout.jax_env import prompt_widths, rollout  # noqa: E402
from starpo_jax.text import build_codec, render_conversation_text  # noqa: E402
from test_rollout import _split_on  # noqa: E402

REPLY_TOKENS = 4
SHORT_TEMPLATE = dict(
    system="", intro="",
    turn="Turn {turn}:\n{state}\nActions left: {actions_left}. Max {max_tokens} tokens.")
FORCED_ANSWER = "<answer>Up || Left || Jump</answer>"
# Sokoban, 3 turns, start states that repeat: the case the compiled-vs-host and GiGPO tests share
SOKOBAN_3_TURNS = RolloutConfig(groups=2, group_size=2, max_turns=3, reply_tokens=REPLY_TOKENS,
                                mode="nothink", max_actions_per_turn=3, max_actions_per_traj=5,
                                shared_env_randomness=True)


@functools.cache
def tiny():
    return load_pretrained("tiny-random")


@functools.cache
def _codec(env_name: str, config: RolloutConfig, **template):
    """The tiny model's codec of `env_name` for `config`, SHORT_TEMPLATE updated by `template`."""
    _, tok = tiny()
    return build_codec(tok, envs_jax.make(env_name), mode=config.mode,
                       max_tokens=config.announced_tokens,
                       max_actions_per_turn=config.max_actions_per_turn,
                       max_actions_per_traj=config.max_actions_per_traj, verify=20,
                       **{**SHORT_TEMPLATE, **template})


@functools.cache  # the same case is read by several tests (e.g. GiGPO's below)
def _both(env_name: str, config: RolloutConfig, seed: int, **template):
    """(compiled rollout, host rollout, host stats) of `config` on `env_name` wrapped as a host
    env, both from PRNGKey(seed), as numpy (shared between tests: read, never written)."""
    key = jax.random.PRNGKey(seed)
    model, tok = tiny()
    env = envs_jax.make(env_name)
    codec = _codec(env_name, config, **template)
    template = {**SHORT_TEMPLATE, **template}
    graphdef, params = nnx.split(model)
    kw = dict(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    compiled = jax.jit(lambda p, k: rollout(graphdef, p, env, codec, config, k, **kw))(params, key)
    reset_keys = jax.random.split(jax.random.split(key)[0], config.groups)
    factory = functools.partial(JaxTextEnvHost, env, key_for_seed=lambda s: reset_keys[s])
    pool = EnvPool(env_name, factory, rows=config.batch_size)
    text = build_host_text(tok, factory(), config, widths=prompt_widths(codec), **template)
    host, stats = host_rollout(graphdef, params, pool, text, config, key,
                               seeds=np.arange(config.groups), **kw)
    pool.close()
    return jax.device_get(compiled), jax.device_get(host), stats


def test_host_rollout_equals_compiled_rollout():
    # Each turn: Up and Left stepped, Jump unknown (a format penalty); the budget of 5 actions
    # runs out inside turn 3, so rows take 3 turns and the EOS / next-message path is crossed.
    want, got, stats = _both("sokoban", SOKOBAN_3_TURNS, 5, forced_prefix=FORCED_ANSWER)
    assert stats["host/failed_rows"] == 0 and stats["host/truncated_observations"] == 0
    for name, value in vars(want).items():
        if name in ("dead_end", "looped"):  # the failure classifier's env-state inputs
            assert getattr(got, name) is None, "a host rollout keeps no env states"
        elif name.startswith("behaviour_"):
            np.testing.assert_allclose(getattr(got, name), value, atol=2e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(getattr(got, name), value, err_msg=name)
    # The env really stepped on both paths: budget spent, rewards, penalties, three turns.
    assert (want.num_actions == 5).all() and np.abs(want.turn_rewards).sum() > 0
    assert want.turn_taken.all() and (want.format_penalties < 0).all()
    # GiGPO's anchors (compared above: the compiled rollout's from symbol ids, the host's from
    # observation texts): turn 1's Up, Left moved the player, after which it stands against a
    # wall, so turns 2 and 3 start from one state (the states after each turn would read 0 0 0).
    np.testing.assert_array_equal(want.turn_anchors[:2], [[0, 1, 1], [0, 1, 1]])


def test_gigpo_trains_on_compiled_and_host_rollouts_alike():
    """Sokoban, 3 turns whose start states repeat (the case above): `prepare` with
    the filter gives the reference's GiGPO advantages on the compiled rollout and on the host
    one alike; two PPO epochs of two mini-batches update; learn logs the anchor share."""
    from starpo_jax.config import AdvantageConfig, FilterConfig, OptimConfig, TrainConfig
    from starpo_jax.train.step import init_train_state, make_train_fns
    from test_credit import gigpo_reference

    rollout = SOKOBAN_3_TURNS
    compiled, host, _ = _both("sokoban", rollout, 5, forced_prefix=FORCED_ANSWER)
    model, tok = tiny()
    env = envs_jax.make("sokoban")
    codec = _codec("sokoban", rollout, forced_prefix=FORCED_ANSWER)  # the rollouts' own
    config = TrainConfig(algo="grpo", rollout=rollout, filter=FilterConfig(keep_ratio=0.5),
                         advantage=AdvantageConfig(estimator="gigpo", step_gamma=0.9,
                                                   omega=0.5, step_mode="mean"),
                         optim=OptimConfig(actor_lr=1e-3, minibatch_rows=1, ppo_epochs=2))
    fns = make_train_fns(config, env, codec, model=model, eos_id=tok.eos_token_id,
                         pad_id=tok.pad_token_id)
    state = init_train_state(config, jax.random.PRNGKey(0), model=model)
    prepare = jax.jit(fns.prepare)
    advantages = []
    for out in (compiled, host):
        batch = jax.device_get(prepare(state, out))
        kept = batch.rollout
        states = [[None if a < 0 else str(a) for a in row] for row in kept.turn_anchors]
        rewards = kept.turn_rewards + kept.format_penalties
        want, step = gigpo_reference(states, rewards, kept.turn_ids, 0.9, 0.5, "mean_std",
                                     "mean", n=2)
        assert np.abs(step).max() > 0  # turns 2 and 3 share a start state, not a return
        np.testing.assert_allclose(batch.advantages, want, rtol=1e-5, atol=1e-5)
        advantages.append(batch.advantages)
    np.testing.assert_allclose(advantages[0], advantages[1], atol=1e-6)
    _, metrics = jax.jit(fns.learn)(state, host, jax.random.PRNGKey(1))
    assert np.isfinite(float(metrics["actor/pg_loss"])) and float(metrics["actor/grad_norm"]) > 0
    # Every taken turn of a row shares its start state with the other row's same turn.
    assert float(metrics["rollout/anchor_share"]) == 1.0


def test_anchors_are_the_states_turns_start_from():
    """Slippery FrozenLake, each row its own randomness, the same answer every turn: all rows
    of a group start turn 1 from the group's first state (anchor 0), then slip apart. Anchors
    of the states after each turn's steps would split the rows already at turn 1."""
    model, tok = tiny()
    env = envs_jax.make("frozen_lake")
    config = RolloutConfig(groups=2, group_size=8, max_turns=3, reply_tokens=REPLY_TOKENS,
                           mode="nothink", max_actions_per_turn=2, max_actions_per_traj=6)
    codec = build_codec(tok, env, mode="nothink", max_tokens=config.announced_tokens,
                        max_actions_per_turn=2, max_actions_per_traj=6, verify=20,
                        forced_prefix="<answer>Down || Right</answer>", **SHORT_TEMPLATE)
    graphdef, params = nnx.split(model)
    out = jax.device_get(jax.jit(lambda p, k: rollout(
        graphdef, p, env, codec, config, k, eos_id=tok.eos_token_id,
        pad_id=tok.pad_token_id))(params, jax.random.PRNGKey(2)))
    anchors = out.turn_anchors
    assert (anchors[:, 0] == 0).all()
    assert ((anchors == -1) == ~out.turn_taken).all()
    later = anchors[:, 1][out.turn_taken[:, 1]]
    assert len(np.unique(later)) > 1, "the rows never slipped apart: pick another key"


class Echo(HostEnv):
    """Free-text env: says what it heard; seed 1 crashes on its first step, seed 2's first
    observation is far longer than its room."""

    instructions = "Say something."
    observation_tokens = 24

    def reset(self, seed: int) -> str:
        self.seed, self.turn = seed, 0
        return "long " * 200 if seed == 2 else f"word {seed}"

    def step(self, action: str):
        if self.seed == 1:
            raise RuntimeError("boom")
        self.turn += 1
        return f"you said {action} é", 0.5, self.turn == 2, {"success": self.turn == 2}


def test_host_rollout_free_text_env_chat_template_failures_and_truncation():
    model, tok = tiny()
    graphdef, params = nnx.split(model)
    config = RolloutConfig(groups=3, group_size=2, max_turns=3, reply_tokens=REPLY_TOKENS,
                           mode="nothink", max_actions_per_turn=1, max_actions_per_traj=5)
    pool = EnvPool("echo", Echo, rows=config.batch_size)
    text = build_host_text(tok, Echo(), config, **SHORT_TEMPLATE,
                           forced_prefix="<answer>hi there</answer>")
    out, stats = host_rollout(graphdef, params, pool, text, config, jax.random.PRNGKey(1),
                              seeds=[0, 1, 2], eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    pool.close()
    out = jax.device_get(out)
    assert stats["host/failed_rows"] == 2 and stats["host/truncated_observations"] == 1
    # Group 0: two turns of reward 0.5, success; group 1 crashed: reward 0, no success, ended.
    np.testing.assert_array_equal(out.turn_rewards[:2], [[0.5, 0.5, 0.0]] * 2)
    np.testing.assert_array_equal(out.turn_taken[:2], [[True, True, False]] * 2)
    np.testing.assert_array_equal(out.turn_rewards[2:4], 0.0)
    np.testing.assert_array_equal(out.turn_taken[2:4], [[True, False, False]] * 2)
    np.testing.assert_array_equal(out.success, [True, True, False, False, True, True])
    assert out.format_ok[out.turn_taken].all() and (out.format_penalties == 0).all()
    # The token stream of a row is the chat template of its messages, split at the replies.
    prefix = list(text.forced_prefix_ids)
    for b in (0, 1, 4):
        replies = [out.tokens[b][out.turn_ids[b] == k].tolist() for k in range(2)]
        first = "long " * 200 if b == 4 else "word 0"
        if b == 4:  # the cut observation: what the buffer holds is a prefix of it
            head = tok.decode(out.tokens[b, : np.argmax(out.loss_mask[b])])
            first = first[: max(n for n in range(len(first) + 1) if first[:n] in head)]
        sentinels = ["\x02R0\x02", "\x02R1\x02"]
        messages = render_conversation_text(
            text.template, text.intro, [first, "you said hi there é"], sentinels, [0.5], [5, 4],
            max_tokens=text.max_tokens)
        pieces = _split_on(tok.apply_chat_template(messages, tokenize=False), sentinels)[:-1]
        want = []
        for k, piece in enumerate(pieces):
            want += tok.encode(piece, add_special_tokens=False) + prefix + replies[k]
        assert out.tokens[b, : out.lengths[b]].tolist() == want, f"row {b}"
        assert out.lengths[b] <= out.tokens.shape[1]
