"""rollout.context_window_mode: what the model sees at each turn, and the turn samples trained on.

The references are the original's context manager (RAGEN, ragen/llm_agent/ctx_manager.py and
memory/simple_memory.py) rewritten here from its message lists: for turn t (0-based) and
h = max(0, t - k + 1) (h = 0 when k = -1)
  limited_multi_turn: [system, user(intro + turn text of h), assistant(reply h),
                       user(reward h + turn text of h + 1), ..., assistant(reply t)]
  single_turn:        [system, user(intro + summary + an entry per turn h..t-1 + the current
                       turn), assistant(reply t)]
tokenised by the tokenizer's own apply_chat_template (replies spliced in at sentinels, as
tests/test_rollout.py does: sampled replies are not the tokenizer's encoding of their text).
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

import envs_jax  # noqa: E402
from envs_host.jax_adapter import JaxTextEnvHost  # noqa: E402
from envs_host.pool import EnvPool  # noqa: E402
from starpo_jax import api  # noqa: E402
from starpo_jax.config import (CollapseConfig, FilterConfig, LossConfig, OptimConfig,  # noqa: E402
                               RolloutConfig, TrainConfig)
from starpo_jax.rollout.demonstrations import build_reply_encoder, demonstrate  # noqa: E402
from starpo_jax.run.evaluation import REPLY_OPEN, format_conversation  # noqa: E402
from starpo_jax.rollout.host import host_rollout, host_sample_width  # noqa: E402
from starpo_jax.rollout.host_text import build_host_text  # noqa: E402
from starpo_jax.rollout.policies import make_policy  # noqa: E402
from starpo_jax.rollout.jax_env import (group_states, rollout, sample_width,  # noqa: E402
                                       turn_samples)
from starpo_jax.text import build_codec, env_intro, format_reward  # noqa: E402
from starpo_jax.train.step import init_train_state, make_train_fns  # noqa: E402
from test_host_rollout import REPLY_TOKENS, SHORT_TEMPLATE, _both, tiny  # noqa: E402
from test_rollout import _split_on, replay_turns  # noqa: E402



@functools.cache
def _setup(env_name: str, mode: str, template: tuple = (), single_turn: bool = False):
    model, tok = tiny()
    env = envs_jax.make(env_name)
    codec = build_codec(tok, env, mode=mode, max_tokens=REPLY_TOKENS, max_actions_per_turn=3,
                        max_actions_per_traj=5, verify=20, single_turn=single_turn,
                        **{**SHORT_TEMPLATE, **dict(template)})
    return model, tok, env, codec


def _config(window: str, k: int, **changes) -> RolloutConfig:
    return RolloutConfig(**{**dict(groups=2, group_size=2, max_turns=3, reply_tokens=REPLY_TOKENS,
                                   announced_tokens=REPLY_TOKENS,
                                   mode="nothink", max_actions_per_turn=3, max_actions_per_traj=5,
                                   context_window_mode=window, max_context_window=k),
                            **changes})


# ---- the original's messages (see the module docstring) ----

def _turn_text(template, state: str, turn: int, left: int) -> str:
    return template.turn.format(turn=turn, state=state, actions_left=left, max_tokens=REPLY_TOKENS)


def limited_messages(template, intro, states, rewards, left, t, k):
    """The original's _build_limited_multi_turn_samples for turn t, reply j as sentinel j."""
    h = 0 if k < 0 else max(0, t - k + 1)
    messages = [{"role": "system", "content": template.system},
                {"role": "user", "content": intro + _turn_text(template, states[h], h + 1,
                                                               left[h])}]
    for j in range(h, t + 1):
        messages.append({"role": "assistant", "content": f"\x02R{j}\x02"})
        if j < t:
            messages.append({"role": "user", "content": template.reward.format(
                reward=format_reward(rewards[j])) + _turn_text(template, states[j + 1], j + 2,
                                                              left[j + 1])})
    return messages


def single_turn_messages(template, intro, states, replies, rewards, left, t, k,
                         max_tokens=REPLY_TOKENS):
    """The original's _build_single_turn_samples (SimpleMemory's user content, nothink) for
    turn t; replies[j]: the text of reply j."""
    h = 0 if k < 0 else max(0, t - k + 1)
    content = ""
    if h < t:
        content += (f"Summary: {t} step(s) completed so far. Showing the last {t - h} turn(s) "
                    "with state/action/reward details. ")
        content += "Recent turns:\n---\n"
        for j in range(h, t):
            content += f"Turn {j + 1} State:\n{states[j]}\n"
            content += f"Turn {j + 1} Action: {replies[j]}\n"
            content += f"Turn {j + 1} Reward: {format_reward(rewards[j])}\n"
            content += "---\n"
    current = "Current Turn " if h < t else ""
    content += f"{chr(10) if content else ''}{current}(Turn {t + 1}):\n"
    content += (f"State:\n{states[t]}\nYou have {left[t]} actions left. Always output: "
                "<answer> [your answer] </answer> with no extra text. Strictly follow this "
                f"format. Max response length: {max_tokens} words (tokens).\n")
    return [{"role": "system", "content": template.system},
            {"role": "user", "content": intro + content},
            {"role": "assistant", "content": f"\x02R{t}\x02"}]


def sample_tokens(tok, messages, replies, prefix, eos):
    """apply_chat_template(messages) with sentinel j replaced by prefix + replies[j], the
    template's closing after the last reply dropped; a reply ending with EOS (the template's
    end of turn) stands for the next piece's copy of it -> (tokens, loss mask of the last)."""
    text = tok.apply_chat_template(messages, tokenize=False)
    order = [int(part.split("\x02")[0]) for part in text.split("\x02R")[1:]]
    pieces = _split_on(text, [f"\x02R{j}\x02" for j in order])[:-1]
    tokens, mask = [], []
    for i, (piece, j) in enumerate(zip(pieces, order)):
        ids = tok.encode(piece, add_special_tokens=False)
        if tokens and tokens[-1] == eos and ids[:1] == [eos]:
            ids = ids[1:]
        tokens += ids + prefix + replies[j]
        mask += [0] * (len(ids) + len(prefix)) + [int(j == order[-1])] * len(replies[j])
    return tokens, mask


# Every reply starts with two known actions and an unknown one, so the game moves (and the
# budget of 5 runs out inside turn 3) whatever the tiny random model samples after it.
FORCED = (("forced_prefix", "<answer>Up || Left || Jump</answer>"),)


@functools.cache
def _rollout(window: str, k: int):
    model, tok, env, codec = _setup("sokoban", "nothink", FORCED, window == "single_turn")
    config = _config(window, k)
    graphdef, params = nnx.split(model)
    key = jax.random.PRNGKey(5)
    out = jax.jit(lambda p: rollout(graphdef, p, env, codec, config, key,
                                    eos_id=tok.eos_token_id, pad_id=tok.pad_token_id))(params)
    return jax.device_get(out), config


def _replies(out, width: int, b: int) -> list[list[int]]:
    """Row b's reply tokens (after the forced prefix), one list per turn taken."""
    turns = int(out.turn_taken[b].sum())
    return [out.tokens[b, t * width: (t + 1) * width][out.loss_mask[b, t * width:
                                                                    (t + 1) * width]].tolist()
            for t in range(turns)]


def _start_states(env, config, key):
    reset_keys = jax.random.split(jax.random.split(key)[0], config.groups)
    states = group_states(jax.vmap(env.reset)(reset_keys)[0], config.group_size)
    return [jax.tree.map(lambda x: x[b], states) for b in range(config.batch_size)]


# ---- config ----

def test_bad_values_are_named_in_one_line():
    with pytest.raises(ValueError, match=r"rollout.context_window_mode = 'sliding' is invalid; "
                                         r"valid: one of \('full', 'limited_multi_turn', "
                                         r"'single_turn'\)$"):
        RolloutConfig(context_window_mode="sliding")
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match=r"rollout.max_context_window = .* is invalid; "
                                             r"valid: -1 \(every earlier turn\) or an int >= 1$"):
            RolloutConfig(max_context_window=bad)
    with pytest.raises(ValueError, match="collapse.every = 5 is invalid; valid: 0"):
        TrainConfig(algo="grpo", rollout=_config("single_turn", 2),
                    collapse=CollapseConfig(every=5))
    # One training row per (trajectory, turn), as the original counts its mini-batch rows.
    for window, turns in (("limited_multi_turn", 3), ("full", 1)):
        config = TrainConfig(algo="grpo", rollout=_config(window, 1))
        assert config.kept_rows == config.kept_groups * 2 * turns
    assert _config("single_turn", -1).window_turns == 3 and _config("full", 2).window_turns == 2


# ---- the JAX rollout ----

# CI: windows of 1 and 2 of 3 turns; the unlimited one (another compiled rollout) in the slow
# tier (README), and test_an_unlimited_window_is_the_full_conversation below in CI.
@pytest.mark.parametrize("k", [1, 2, pytest.param(-1, marks=pytest.mark.slow)])
def test_limited_multi_turn_samples_are_the_originals_messages(k):
    """Each turn's sample (what the model saw, then its reply) is the chat template of the
    original's limited window, token for token; the loss is on that turn's reply only."""
    out, config = _rollout("limited_multi_turn", k)
    model, tok, env, codec = _setup("sokoban", "nothink", FORCED)
    width = sample_width(codec, config)
    assert out.tokens.shape == (4, config.max_turns * width)
    intro = env_intro(codec.template, env, max_actions_per_turn=config.max_actions_per_turn,
                      max_actions_per_traj=config.max_actions_per_traj)
    prefix = list(codec.forced_prefix_ids)
    for b, state in enumerate(_start_states(env, config, jax.random.PRNGKey(5))):
        replies = _replies(out, width, b)
        states, rewards, penalties, left, taken = replay_turns(tok, env, codec, config, state,
                                                               replies)
        assert len(replies) == len(states) == 3 and int(out.num_actions[b]) == taken == 5
        np.testing.assert_allclose(out.turn_rewards[b], rewards, atol=1e-6)
        np.testing.assert_allclose(out.format_penalties[b], penalties, atol=1e-6)
        for t in range(len(replies)):
            tokens, mask = sample_tokens(
                tok, limited_messages(codec.template, intro, states, rewards, left, t, k),
                replies, prefix, tok.eos_token_id)
            cols = slice(t * width, (t + 1) * width)
            n = int(out.turn_lengths[b, t])
            assert n == len(tokens) and out.tokens[b, cols][:n].tolist() == tokens, (b, t)
            assert out.loss_mask[b, cols].astype(int).tolist() == mask + [0] * (width - n)
            assert (out.turn_ids[b, cols] == np.where(out.loss_mask[b, cols], t, -1)).all()
            assert out.window_lengths[b, t] == n - len(prefix) - len(replies[t])
            assert (out.behaviour_logp[b, cols][out.loss_mask[b, cols]] < 0).all()


def test_an_unlimited_window_is_the_full_conversation():
    """max_context_window = -1: each turn sees the whole conversation, so the same key samples
    the same replies as the full mode, and the last turn's sample is the full mode's row."""
    full, _ = _rollout("full", -1)
    out, config = _rollout("limited_multi_turn", -1)
    width = out.tokens.shape[1] // config.max_turns
    for name in ("turn_rewards", "format_penalties", "reply_lengths", "num_actions",
                 "turn_anchors"):
        np.testing.assert_array_equal(getattr(out, name), getattr(full, name), err_msg=name)
    last = (config.max_turns - 1) * width
    for b in range(4):
        n = int(full.lengths[b])
        assert out.tokens[b, last: last + n].tolist() == full.tokens[b, :n].tolist()
        assert (out.loss_mask[b, last: last + n] <= full.loss_mask[b, :n]).all()
        np.testing.assert_allclose(out.behaviour_logp[b, last: last + n],
                                   np.where(out.loss_mask[b, last: last + n],
                                            full.behaviour_logp[b, :n], 0), atol=2e-5)


def test_turn_samples_are_turn_major_rows_of_their_trajectory():
    out, config = _rollout("limited_multi_turn", 2)
    samples = jax.device_get(turn_samples(out))
    width = out.tokens.shape[1] // config.max_turns
    assert samples.tokens.shape == (3 * 4, width)
    for t in range(3):
        for b in range(4):
            row = t * 4 + b
            np.testing.assert_array_equal(samples.tokens[row],
                                          out.tokens[b, t * width: (t + 1) * width])
            assert samples.lengths[row] == out.turn_lengths[b, t]
            assert samples.prompt_lengths[row] == out.window_lengths[b, t]
            np.testing.assert_array_equal(samples.turn_rewards[row], out.turn_rewards[b])
            assert samples.scores[row] == out.scores[b]
    assert samples.turn_lengths is None and samples.window_lengths is None


@functools.cache
def _single_turn_demo(k: int):
    """Demonstrations (the tokenizer's own reply tokens) on sokoban in single_turn mode, with
    the default (the original's) prompt text."""
    _, tok = tiny()
    env = envs_jax.make("sokoban")
    config = RolloutConfig(groups=2, group_size=2, max_turns=3, reply_tokens=32,
                           announced_tokens=32, mode="nothink", max_actions_per_turn=5,
                           max_actions_per_traj=10, context_window_mode="single_turn",
                           max_context_window=k)
    codec = build_codec(tok, env, mode="nothink", max_tokens=32, verify=20, single_turn=True)
    encoder = build_reply_encoder(tok, env, codec, max_actions_per_turn=5)
    policy = make_policy("random", env, max_actions_per_turn=5, max_turns=3,
                         max_actions_per_traj=10)
    out = jax.jit(lambda key: demonstrate(env, codec, config, policy, encoder, key,
                                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id))(
        jax.random.PRNGKey(0))
    return jax.device_get(out), config, tok, env, codec


@pytest.mark.parametrize("k", [2, pytest.param(-1, marks=pytest.mark.slow)])  # slow tier: README
def test_jax_single_turn_prompts_are_the_originals_messages(k):
    """Each turn's window is the tokenizer's encoding of apply_chat_template of the original's
    single_turn messages (the earlier replies as their decoded text), whole: not spliced."""
    out, config, tok, env, codec = _single_turn_demo(k)
    width = sample_width(codec, config)
    intro = env_intro(codec.template, env, max_actions_per_turn=5, max_actions_per_traj=10)
    prefix = list(codec.forced_prefix_ids)
    eos = tok.eos_token_id
    assert out.turn_taken[:, 1].any()  # some prompt shows history
    for b, state in enumerate(_start_states(env, config, jax.random.PRNGKey(0))):
        replies = _replies(out, width, b)
        assert all(r[-1] == eos for r in replies)  # the template's end of turn: in the loss
        states, rewards, _, left, _ = replay_turns(tok, env, codec, config, state,
                                                   [r[:-1] for r in replies])
        texts = [tok.decode(prefix + r, skip_special_tokens=True) for r in replies]
        for t in range(len(replies)):
            messages = single_turn_messages(codec.template, intro, states, texts, rewards, left,
                                            t, k, max_tokens=32)
            window = tok.encode(tok.apply_chat_template(messages[:2], tokenize=False,
                                                        add_generation_prompt=True),
                                add_special_tokens=False)
            cols = slice(t * width, (t + 1) * width)
            n = int(out.turn_lengths[b, t])
            assert out.tokens[b, cols][:n].tolist() == window + prefix + replies[t], (b, t)
            assert out.window_lengths[b, t] == len(window)
            mask = out.loss_mask[b, cols]
            assert mask.sum() == len(replies[t]) and mask[len(window) + len(prefix):n].all()
        if len(replies) == 3 and k == -1:  # the last turn shows both earlier ones
            assert "Showing the last 2 turn(s)" in tok.decode(out.tokens[b, 2 * width:])


# ---- the host rollout ----

@pytest.mark.parametrize("k", [pytest.param(1, marks=pytest.mark.slow), 2])  # slow tier: README
def test_host_limited_multi_turn_equals_the_compiled_one(k):
    config = _config("limited_multi_turn", k, shared_env_randomness=True)
    want, got, stats = _both("sokoban", config, 5, forced_prefix=dict(FORCED)["forced_prefix"])
    assert stats["host/truncated_observations"] == 0
    assert want.turn_lengths is not None
    for name, value in vars(want).items():
        if name in ("dead_end", "looped"):
            continue
        if name.startswith("behaviour_"):
            np.testing.assert_allclose(getattr(got, name), value, atol=2e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(getattr(got, name), value, err_msg=name)


@functools.cache  # two tests read the same one
def _host(config: RolloutConfig, seed: int):
    """The host rollout of sokoban (the JAX env behind the host protocol) with the key of
    `seed`, seeds 0..P-1 reset with the compiled rollout's keys -> (rollout, stats, tokenizer,
    text)."""
    key = jax.random.PRNGKey(seed)
    model, tok = tiny()
    env = envs_jax.make("sokoban")
    reset_keys = jax.random.split(jax.random.split(key)[0], config.groups)
    factory = functools.partial(JaxTextEnvHost, env, key_for_seed=lambda s: reset_keys[s])
    pool = EnvPool("sokoban", factory, rows=config.batch_size)
    text = build_host_text(tok, factory(), config, **{**SHORT_TEMPLATE, **dict(FORCED)})
    graphdef, params = nnx.split(model)
    out, stats = host_rollout(graphdef, params, pool, text, config, key,
                              seeds=np.arange(config.groups), eos_id=tok.eos_token_id,
                              pad_id=tok.pad_token_id)
    pool.close()
    return jax.device_get(out), stats, tok, text


@pytest.mark.parametrize("k", [2, -1])
def test_host_single_turn_samples_are_the_originals_messages(k):
    """Each turn's sample is [system, user(intro + the original's memory text of the turns
    shown + the current turn), assistant(reply)] through apply_chat_template; an earlier
    reply appears as its decoded text (special tokens skipped, as the original decodes)."""
    config = _config("single_turn", k, shared_env_randomness=True)
    seed = 5
    out, stats, tok, text = _host(config, seed)
    assert stats["host/truncated_observations"] == 0 and stats["host/failed_rows"] == 0
    width = host_sample_width(text, config)
    assert out.tokens.shape == (4, config.max_turns * width)
    _, _, env, codec = _setup("sokoban", "nothink", FORCED)
    prefix = list(text.forced_prefix_ids)
    for b, state in enumerate(_start_states(env, config, jax.random.PRNGKey(seed))):
        replies = _replies(out, width, b)
        states, rewards, penalties, left, taken = replay_turns(tok, env, codec, config, state,
                                                               replies)
        assert len(replies) == 3 and int(out.num_actions[b]) == taken == 5
        shown = [tok.decode(prefix + r, skip_special_tokens=True) for r in replies]
        for t in range(len(replies)):
            messages = single_turn_messages(text.template, text.intro, states, shown, rewards,
                                            left, t, k)
            tokens, mask = sample_tokens(tok, messages, replies, prefix, tok.eos_token_id)
            cols = slice(t * width, (t + 1) * width)
            n = int(out.turn_lengths[b, t])
            assert n == len(tokens) and out.tokens[b, cols][:n].tolist() == tokens, (b, t)
            assert out.loss_mask[b, cols].astype(int).tolist() == mask + [0] * (width - n)
            if t:  # the history is really there: the previous turn's entry
                assert f"Turn {t} Action: {shown[t - 1]}\n" in messages[1]["content"]


# ---- training on turn samples ----

def _grpo_reference(scores: np.ndarray, group: int, eps: float = 1e-6) -> np.ndarray:
    """RAGEN's GRPO per episode: (s - mean) / (std + eps) within each group, std unbiased."""
    out = np.zeros_like(scores, np.float64)
    for g in range(0, len(scores), group):
        s = scores[g: g + group].astype(np.float64)
        std = s.std(ddof=1)
        out[g: g + group] = (s - s.mean()) / (std + eps) if std > eps else 0.0
    return out


def _check_train_step(config: TrainConfig, out, codec) -> None:
    """prepare + one update on a turn-sample rollout: rows are the turn samples (turn-major),
    each with its episode's GRPO advantage on its own reply tokens only; the loss is finite and
    the gradient is that of -sum(A * log p(reply token | its sample's context)) / tokens,
    computed here with the model's plain full-logits forward."""
    model, tok = tiny()
    # Scores that differ within groups (the forced replies would make them all equal).
    rng = np.random.default_rng(0)
    out = jax.tree.map(jnp.asarray, out.replace(
        turn_rewards=np.where(out.turn_taken, rng.normal(size=out.turn_taken.shape), 0.0)
        .astype(np.float32)))
    fns = make_train_fns(config, None, codec, model=model, eos_id=tok.eos_token_id,
                         pad_id=tok.pad_token_id)
    state = init_train_state(config, jax.random.PRNGKey(0), model=model)
    batch = jax.device_get(jax.jit(fns.prepare)(state, out))
    b, turns = out.turn_taken.shape
    rows = batch.rollout
    assert rows.tokens.shape == (turns * b, out.tokens.shape[1] // turns)
    want = _grpo_reference(np.asarray(out.scores), config.rollout.group_size)
    for t in range(turns):
        for r in range(b):
            mask = rows.loss_mask[t * b + r]
            assert (rows.turn_ids[t * b + r][mask] == t).all()
            assert mask.sum() == int(out.reply_lengths[r, t])
            np.testing.assert_allclose(batch.advantages[t * b + r],
                                       np.where(mask, want[r], 0.0), rtol=1e-5, atol=1e-6)
    state2, metrics = jax.jit(fns.update)(state, jax.tree.map(jnp.asarray, batch),
                                          jax.random.PRNGKey(1))
    assert np.isfinite(float(metrics["actor/pg_loss"]))
    graphdef, params = nnx.split(model)
    tokens, lengths = jnp.asarray(rows.tokens), jnp.asarray(rows.lengths)
    mask, adv = jnp.asarray(rows.loss_mask), jnp.asarray(batch.advantages)

    # The LM head only where a reply token is predicted: full logits over every position are
    # [rows, L, vocab] (2.3 GB here) and took most of this test's time.
    row, pos = np.nonzero(np.asarray(rows.loss_mask)[:, 1:])

    def reference(p):
        m = nnx.merge(graphdef, p)
        hidden = m.hidden_states(tokens, attention_mask=jnp.arange(tokens.shape[1])
                                 < lengths[:, None])
        logp = jax.nn.log_softmax(m.logits_from_hidden(hidden[row, pos]), axis=-1)
        logp = jnp.take_along_axis(logp, tokens[row, pos + 1][:, None], axis=-1)[:, 0]
        return -jnp.sum(adv[row, pos + 1] * logp) / mask.sum()

    norm = jax.jit(lambda p: optax.tree.norm(jax.grad(reference)(p)))(params)  # one program
    assert float(norm) > 0
    np.testing.assert_allclose(float(metrics["actor/grad_norm"]), float(norm), rtol=2e-3)
    moved = jax.tree.map(lambda a, c: float(jnp.abs(a - c).max()), state2.actor,
                         nnx.state(model))
    assert max(jax.tree.leaves(moved)) > 0


def _train_config(rollout_config: RolloutConfig) -> TrainConfig:
    return TrainConfig(algo="grpo", rollout=rollout_config, filter=FilterConfig(keep_ratio=1.0),
                       loss=LossConfig(entropy_coef=0.0), optim=OptimConfig(actor_lr=1e-3))


def test_limited_multi_turn_train_step():
    out, config = _rollout("limited_multi_turn", 2)
    _check_train_step(_train_config(config), out, _setup("sokoban", "nothink", FORCED)[3])


@pytest.mark.slow  # another compiled rollout: the slow tier (README); CI trains the same
def test_single_turn_train_step():  # single_turn samples from a host rollout (next test)
    out, config = _rollout("single_turn", 2)
    _check_train_step(_train_config(config), out,
                      _setup("sokoban", "nothink", FORCED, True)[3])


def test_single_turn_train_step_on_a_host_rollout():
    config = _config("single_turn", 2, shared_env_randomness=True)
    out, _, _, _ = _host(config, 5)
    _check_train_step(_train_config(config), out, None)


def test_a_sample_conversation_shows_each_turns_context_and_reply():
    out, config = _rollout("limited_multi_turn", 1)
    _, tok, _, _ = _setup("sokoban", "nothink", FORCED)
    text = format_conversation(tok, out, 0)
    assert text.count(REPLY_OPEN) == int(out.turn_taken[0].sum()) == 3
    for t in (1, 2, 3):  # each window opens with its own turn's state
        assert text.count(f"Turn {t}:") == 1


@pytest.mark.parametrize("window", ["single_turn"])
def test_a_run_trains_in_the_mode(window):
    """Through the config keys and api.build (the codec's single_turn blocks, the memory
    knobs): one compiled step on sokoban gives finite metrics and moves the weights."""
    c = api.config_for("sokoban", "grpo", groups=2, group_size=2, max_turns=2, reply_tokens=4)
    c.model.source = "tiny-random"
    c.nothink = True
    c.prompt.update(system="", intro="", turn=SHORT_TEMPLATE["turn"], verify=20)
    c.rollout.context_window_mode = window
    c.rollout.max_context_window = 2
    c.optim.actor_lr = 1e-3
    c.eval_every = c.sample_every = 0
    exp = api.build(c)
    before = jax.tree.map(np.asarray, exp.state.actor)
    metrics = exp.step()
    assert all(np.isfinite(v) for v in metrics.values())
    assert metrics["rollout/num_turns"] > 0
    moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - b).max()), exp.state.actor,
                         before)
    assert max(jax.tree.leaves(moved)) > 0
