"""The multi-turn rollout against a host-side replay of the same conversations.

The host rebuilds every trajectory from the sampled reply tokens alone: the messages with
`render_conversation_text`, the token stream with the tokenizer's own `apply_chat_template`,
actions with `reference_parse`, the game with the unbatched env. The JAX rollout must agree on
tokens, loss mask, turn ids, rewards, penalties and action counts.
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

import envs_jax  # noqa: E402
from starpo_jax.config import RolloutConfig  # noqa: E402
from starpo_jax.models import load_pretrained  # noqa: E402
from starpo_jax.rollout.jax_env import buffer_length, chunked_rollout, rollout  # noqa: E402
from starpo_jax.text import (build_codec, env_intro, reference_parse,  # noqa: E402
                             render_conversation_text, token_byte_table)

REPLY_TOKENS = 4
# A short prompt keeps the test fast; the codec is exact for any template.
SHORT_TEMPLATE = dict(
    system="", intro="",
    turn="Turn {turn}:\n{state}\nActions left: {actions_left}. Max {max_tokens} tokens.")


@functools.cache
def tiny_bandit_setup(reply_tokens: int = REPLY_TOKENS):
    """(tiny-random model, its tokenizer, bandit env, nothink codec); built once per process."""
    model, tok = load_pretrained("tiny-random")
    env = envs_jax.make("bandit")
    codec = build_codec(tok, env, mode="nothink", max_tokens=reply_tokens, verify=20,
                        **SHORT_TEMPLATE)
    return model, tok, env, codec


def _split_on(text: str, sentinels: list[str]) -> list[str]:
    pieces = []
    for s in sentinels:
        head, found, text = text.partition(s)
        assert found, f"sentinel {s!r} missing from the rendered conversation"
        pieces.append(head)
    return pieces + [text]


def replay_turns(tok, env, codec, config, state, replies):
    """Host replay of one trajectory's game from its replies (token lists after the forced
    prefix, one per turn taken): (state texts, rewards, penalties, budgets shown, actions
    taken), one per turn."""
    table = token_byte_table(tok)
    prefix = list(codec.forced_prefix_ids)
    step = jax.jit(env.step)
    states, rewards, penalties, left = [env.render_text(state)], [], [], []
    taken, done = 0, False
    for reply in replies:
        left.append(config.max_actions_per_traj - taken)
        data = b"".join(bytes(table.bytes[i, : table.lengths[i]]) for i in prefix + reply)
        actions, ok = reference_parse(data, env.action_names, think=False,
                                      max_actions=config.max_actions_per_turn)
        reward = 0.0
        for a in actions:
            if done or taken >= config.max_actions_per_traj:
                break
            state, ts = step(state, jnp.int32(a))
            reward += float(ts.reward)
            taken += 1
            done = bool(ts.last())
        rewards.append(reward)
        penalties.append(0.0 if ok else config.format_penalty)
        if done or taken >= config.max_actions_per_traj:
            break
        states.append(env.render_text(state))
    return states[: len(replies)], rewards, penalties, left, taken


def _replay_row(tok, env, codec, config, state, row_tokens, row_turns):
    """Host replay of one trajectory from its reply tokens: (tokens, mask, turn ids, rewards,
    penalties, actions taken)."""
    replies = []
    for k in range(config.max_turns):
        reply = row_tokens[row_turns == k].tolist()
        if not reply:
            break
        replies.append(reply)
    prefix = list(codec.forced_prefix_ids)
    states, rewards, penalties, left, taken = replay_turns(tok, env, codec, config, state,
                                                           replies)
    sentinels = [f"\x02R{k}\x02" for k in range(len(replies))]
    intro = env_intro(codec.template, env, max_actions_per_turn=config.max_actions_per_turn,
                      max_actions_per_traj=config.max_actions_per_traj)
    messages = render_conversation_text(codec.template, intro, states, sentinels, rewards, left,
                                        max_tokens=config.reply_tokens)
    text = tok.apply_chat_template(messages, tokenize=False)
    pieces = _split_on(text, sentinels)[:-1]  # the template's closing is not in the buffer
    tokens, mask, turns = [], [], []
    for k, piece in enumerate(pieces):
        ids = tok.encode(piece, add_special_tokens=False)
        tokens += ids + prefix + replies[k]
        mask += [0] * (len(ids) + len(prefix)) + [1] * len(replies[k])
        turns += [-1] * (len(ids) + len(prefix)) + [k] * len(replies[k])
    return tokens, mask, turns, rewards, penalties, taken


@pytest.mark.parametrize("max_turns", [3])
def test_rollout_matches_host_replay(max_turns):
    model, tok, env, codec = tiny_bandit_setup()
    config = RolloutConfig(groups=2, group_size=2, max_turns=max_turns, reply_tokens=REPLY_TOKENS,
                           mode="nothink", max_actions_per_traj=3)
    graphdef, params = nnx.split(model)
    key = jax.random.PRNGKey(3)
    out = jax.jit(lambda p, k: rollout(graphdef, p, env, codec, config, k, eos_id=tok.eos_token_id,
                                       pad_id=tok.pad_token_id))(params, key)
    out = jax.device_get(out)
    length = buffer_length(codec, config)
    assert out.tokens.shape == (4, length)
    # The rollout's reset keys: the first half of the split key, one per group.
    reset_keys = jax.random.split(jax.random.split(key)[0], config.groups)
    for b in range(config.batch_size):
        state, _ = env.reset(reset_keys[b // config.group_size])
        tokens, mask, turns, rewards, penalties, taken = _replay_row(
            tok, env, codec, config, state, out.tokens[b], out.turn_ids[b])
        n = int(out.lengths[b])
        assert out.tokens[b, :n].tolist() == tokens, f"row {b}: token stream differs"
        assert out.loss_mask[b].astype(int).tolist() == mask + [0] * (length - n)
        assert out.turn_ids[b].tolist() == turns + [-1] * (length - n)
        turns_taken = int(out.turn_taken[b].sum())
        assert turns_taken == len(rewards)
        np.testing.assert_allclose(out.turn_rewards[b, :turns_taken], rewards, atol=1e-6)
        np.testing.assert_allclose(out.format_penalties[b, :turns_taken], penalties, atol=1e-6)
        assert int(out.num_actions[b]) == taken
        assert (out.reply_lengths[b, :turns_taken] == [sum(t == k for t in turns)
                                                       for k in range(turns_taken)]).all()
        # Behaviour log-probs exist exactly on the model's tokens.
        assert ((out.behaviour_logp[b] != 0) <= out.loss_mask[b]).all()
        assert (out.behaviour_logp[b][out.loss_mask[b]] < 0).all()


def test_group_rows_share_their_first_prompt():
    """The N rows of a group start from the same state: their first prompts are identical."""
    model, tok, env, codec = tiny_bandit_setup()
    config = RolloutConfig(groups=2, group_size=3, max_turns=1, reply_tokens=REPLY_TOKENS,
                           mode="nothink")
    graphdef, params = nnx.split(model)
    out = jax.jit(lambda p, k: rollout(graphdef, p, env, codec, config, k, eos_id=tok.eos_token_id,
                                       pad_id=tok.pad_token_id))(params, jax.random.PRNGKey(0))
    first_reply = np.argmax(np.asarray(out.loss_mask), axis=1)
    tokens = np.asarray(out.tokens)
    for p in range(config.groups):
        rows = range(p * config.group_size, (p + 1) * config.group_size)
        starts = {tuple(tokens[r, : first_reply[r]]) for r in rows}
        assert len(starts) == 1, f"group {p}: rows do not share their first prompt"


def test_chunked_rollout_is_its_pieces_in_group_order():
    # groups = 4 in 2 chunks: rows [0, 8) are the first piece's rollout (key fold_in(key, 0)),
    # rows [8, 16) the second's; a reshape in the wrong order would interleave them.
    model, tok, env, codec = tiny_bandit_setup()
    graphdef, params = nnx.split(model)
    kw = dict(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    config = RolloutConfig(groups=4, group_size=2, max_turns=1, reply_tokens=REPLY_TOKENS,
                           mode="nothink", chunks=2)
    piece = RolloutConfig(groups=2, group_size=2, max_turns=1, reply_tokens=REPLY_TOKENS,
                          mode="nothink")
    key = jax.random.PRNGKey(4)
    whole = jax.jit(lambda p, k: chunked_rollout(graphdef, p, env, codec, config, k, **kw))
    one = jax.jit(lambda p, k: rollout(graphdef, p, env, codec, piece, k, **kw))
    got = jax.device_get(whole(params, key))
    for c in range(2):
        want = jax.device_get(one(params, jax.random.fold_in(key, c)))
        for name, value in vars(want).items():
            if value is None:  # a field of the limited context modes only
                assert getattr(got, name) is None, name
                continue
            np.testing.assert_array_equal(getattr(got, name)[4 * c: 4 * c + 4], value, name)
    with pytest.raises(ValueError, match="rollout.chunks = 3 .*divisor of rollout.groups = 4"):
        RolloutConfig(groups=4, chunks=3)
