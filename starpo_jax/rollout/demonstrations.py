"""Demonstrations: rollouts whose replies a scripted policy supplies, for supervised warm starts.

    encoder = build_reply_encoder(tokenizer, env, codec)
    out = demonstrate(env, codec, config, policy, encoder, key, eos_id=..., pad_id=...)
    write_jsonl(path, transcripts(out, tokenizer, codec))      # {"messages": [...]} per line
    rows = tokenize_conversations(tokenizer, read_jsonl(path), length=L, codec=codec)

A demonstration is `rollout.rollout` with `replies=`: the same prompts, chat template, forced
prefix, buffers, masks and env stepping as a sampled rollout; only each turn's reply tokens come
from the policy (starpo_jax.rollout.policies) instead of the sampler. A reply is the original's
answer text, `<answer>Up || Left</answer>` (think mode: `<think>` + a fixed templated sentence +
`</think><answer>...`: a template, not reasoning), tokenised in JAX from host-encoded pieces and
verified against `tokenizer.encode` when the encoder is built. Free-text envs (Countdown,
Sudoku) have no action names: their policies return the answer's text as symbol ids
(policies.answer_symbols), and `AnswerEncoder` tokenises it in JAX with the text layer's
byte-level BPE of a block (starpo_jax.text.blocks), checked the same way.

Host envs (envs_host): `host_demonstrate` plays a policy of the observation text,
`(observation, rng) -> answer items`, through host_rollout.host_rollout (`replies=`), the
reply text tokenised whole on the host; its transcripts are written the same way.

When the chat template ends an assistant turn with the EOS token, the reply ends with it too (it
is in the loss mask: the model learns to end its turn; the next message then skips its own copy,
as after a sampled EOS).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from envs_host.pool import EnvPool
from starpo_jax.config import RolloutConfig
from starpo_jax.rollout import world_model as wm
from starpo_jax.rollout.host import host_rollout
from starpo_jax.rollout.host_text import HostText
from starpo_jax.rollout.policies import Policy, answer_bytes, answer_samples, answer_symbols
from starpo_jax.rollout.jax_env import Rollout, rollout
from starpo_jax.text.blocks import Block, Slot, build_block, concat_pieces
from starpo_jax.text.codec import Codec, chat_pieces

#: The think-mode thought of every demonstration reply (a template: it carries no reasoning).
THOUGHT = "I will take the actions below."


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


class ReplyEncoder(flax.struct.PyTreeNode):
    """Token tables of demonstration replies (the tokens after the forced prefix)."""

    head: jax.Array  # [H] int32: think mode's thought and "</think><answer>"; nothink: empty
    first: jax.Array  # [K, W1] int32 (-1 pad): action k as the answer's first item
    first_lengths: jax.Array  # [K] int32
    later: jax.Array  # [K, W2] int32 (-1 pad): separator + action k
    later_lengths: jax.Array  # [K] int32
    tail: jax.Array  # [E] int32: "</answer>" (+ EOS when it ends the template's turns)

    def encode(self, actions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """One reply: actions [A] int32 (-1 after the turn's actions; at least one) ->
        (tokens [H + W1 + (A - 1) * W2 + E] int32, -1 padded; length [] int32)."""
        count = jnp.sum(actions >= 0)
        safe = jnp.maximum(actions, 0)
        pieces = [(self.head, jnp.int32(self.head.shape[0])),
                  (self.first[safe[0]], self.first_lengths[safe[0]])]
        for i in range(1, actions.shape[0]):
            pieces.append((self.later[safe[i]], jnp.where(i < count, self.later_lengths[safe[i]],
                                                          0)))
        pieces.append((self.tail, jnp.int32(self.tail.shape[0])))
        return concat_pieces(pieces)


class AnswerEncoder(flax.struct.PyTreeNode):
    """Token tables of a free-text env's demonstration replies: the text layer's block of
    forced prefix (+ think mode's thought) + answer symbols + "</answer>"."""

    block: Block
    eos: jax.Array  # [E] int32: the EOS when it ends the template's turns, else empty
    prefix: int = flax.struct.field(pytree_node=False)  # tokens of the forced prefix
    width: int = flax.struct.field(pytree_node=False)  # the most tokens of a reply

    def encode(self, answer: jax.Array) -> tuple[jax.Array, jax.Array]:
        """One reply: answer [W] int32 symbols (policies.answer_symbols) -> (tokens [T] int32
        after the forced prefix, -1 padded; length [] int32)."""
        ids, n = self.block.encode({"answer": answer})
        ids, n = concat_pieces([(ids[self.prefix:], n - self.prefix),
                                (self.eos, jnp.int32(self.eos.shape[0]))])
        return ids[: self.width], n


def _table(rows: list[list[int]]) -> tuple[jax.Array, jax.Array]:
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), -1, np.int32)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    return jnp.asarray(ids), jnp.asarray([len(r) for r in rows], jnp.int32)


def reply_text(codec: Codec | HostText, names: Iterable[str]) -> str:
    """The whole assistant text of a demonstration reply naming `names` (answer items; the
    forced prefix included, the end-of-turn token not)."""
    t = codec.template
    answer = f" {t.action_sep} ".join(names)
    head = f"{THOUGHT}</think><answer>" if t.think else ""
    return f"{t.forced_prefix}{head}{answer}</answer>"


def build_reply_encoder(tokenizer: Any, env: Any, codec: Codec, *, max_actions_per_turn: int,
                        verify: int = 200, seed: int = 0) -> ReplyEncoder | AnswerEncoder:
    """Host: the reply tables of `env`'s action names (an AnswerEncoder of its answer symbols
    for a free-text env) for `codec`'s mode, checked on `verify` random replies against
    tokenizer.encode of the reply text. Raises ValueError for a free-text env without an
    answer spelling or a reply the pieces cannot spell exactly."""
    t = codec.template
    prefix = _encode(tokenizer, t.forced_prefix)
    if list(codec.forced_prefix_ids) != prefix:
        raise ValueError("the codec's forced prefix is not this tokenizer's encoding of "
                         f"{t.forced_prefix!r}")
    head = f"{THOUGHT}</think><answer>" if t.think else ""
    sep = f" {t.action_sep} "
    end = chat_pieces(tokenizer)["assistant_to_user"]
    eos = [tokenizer.eos_token_id] if _encode(tokenizer, end)[:1] == [tokenizer.eos_token_id] \
        else []
    names = tuple(env.action_names)
    if names:
        first, first_n = _table([_encode(tokenizer, n) for n in names])
        later, later_n = _table([_encode(tokenizer, sep + n) for n in names])
        encoder = ReplyEncoder(head=jnp.asarray(_encode(tokenizer, head) if head else [],
                                                jnp.int32).reshape(-1),
                               first=first, first_lengths=first_n, later=later,
                               later_lengths=later_n,
                               tail=jnp.asarray(_encode(tokenizer, "</answer>") + eos, jnp.int32))
        rng = np.random.default_rng(seed)
        counts = rng.integers(1, max_actions_per_turn + 1, verify)
        inputs = rng.integers(0, len(names), (verify, max_actions_per_turn))
        inputs = np.where(np.arange(max_actions_per_turn) < counts[:, None], inputs, -1)
        texts = [reply_text(codec, [names[a] for a in acts if a >= 0]) for acts in inputs]
        what = "this tokenizer merges action names with their neighbours"
    else:
        symbols = answer_symbols(env, sep)
        inputs = answer_samples(env, max_actions_per_turn, max(verify, 2), seed)
        slot = Slot("answer", symbols, lambda rng: inputs[rng.integers(len(inputs))])
        block = build_block(tokenizer, [t.forced_prefix + head, slot, "</answer>"],
                            verify=verify, seed=seed)
        if block.static[0][: len(prefix)] != tuple(prefix):
            raise ValueError(f"{type(env).__name__} answers: this tokenizer merges the forced "
                             f"prefix {t.forced_prefix!r} with the reply that follows it")
        # The block's static width allows the longest symbol everywhere; a token has a byte at
        # least, so the answer's own byte bound is a tighter one.
        longest = max(len(x.encode("utf-8")) for x in symbols)
        region = (block.max_tokens[0] - block.slot_widths[0] * longest
                  + answer_bytes(env, max_actions_per_turn, sep))
        width = len(block.static[0]) - len(prefix) + region + len(block.static[1]) + len(eos)
        encoder = AnswerEncoder(block=block, eos=jnp.asarray(eos, jnp.int32).reshape(-1),
                                prefix=len(prefix), width=width)
        texts = [reply_text(codec, ["".join(symbols[i] for i in row)]) for row in inputs]
        what = "this tokenizer merges the answer's pieces with their neighbours"
    encode = jax.jit(jax.vmap(type(encoder).encode, in_axes=(None, 0)))
    ids, lengths = jax.device_get(encode(encoder, jnp.asarray(inputs, jnp.int32)))
    for row, n, text in zip(ids, lengths, texts):
        if prefix + row[:n].tolist() != _encode(tokenizer, text) + eos:
            raise ValueError(f"demonstration reply {text!r} does not tokenise as its pieces; "
                             f"{what}")
    return encoder


def demonstrate(env: Any, codec: Codec, config: RolloutConfig, policy: Policy,
                encoder: ReplyEncoder, key: jax.Array, *, eos_id: int, pad_id: int,
                reset_key: jax.Array | None = None) -> Rollout:
    """B = groups * group_size demonstrations: `rollout.rollout` with each row's replies from
    `policy(env_state, key)` (a fresh key per row and turn), encoded by `encoder` (a
    world_model.WorldModelEncoder: SPA's world-model replies); jit-able.
    key / reset_key as in `rollout.rollout` (reset_key fixes the initial states)."""
    b = config.groups * config.group_size
    if isinstance(encoder, wm.WorldModelEncoder):
        replies = wm.world_model_replies(env, policy, encoder,
                                         max_actions_per_traj=config.max_actions_per_traj,
                                         width=config.reply_tokens)
        return rollout(None, None, env, codec, config, key, eos_id=eos_id, pad_id=pad_id,
                       reset_key=reset_key, replies=replies)

    def replies(states: Any, turn: jax.Array, turn_key: jax.Array, taken: jax.Array):
        actions = jax.vmap(policy)(states, jax.random.split(turn_key, b))
        return jax.vmap(encoder.encode)(actions)

    return rollout(None, None, env, codec, config, key, eos_id=eos_id, pad_id=pad_id,
                   reset_key=reset_key, replies=replies)


#: A host env's demonstration policy: (observation text, rng) -> the turn's answer items
#: (action names, or free-text items; a str is one item).
HostPolicy = Callable[[str, np.random.Generator], Sequence[str] | str]


def host_demonstrate(pool: EnvPool, text: HostText, config: RolloutConfig, policy: HostPolicy,
                     key: jax.Array, *, eos_id: int, pad_id: int, seeds: Any = None,
                     ) -> tuple[Rollout, dict[str, float]]:
    """B = groups * group_size demonstrations of a host env: `host_rollout` (same pool, text,
    key and seeds semantics) with each row's replies from `policy(observation, rng)` (rng
    seeded from the turn's key; rows in order), each reply's text (`reply_text`) tokenised
    whole, the EOS appended where it ends the template's turns. Raises ValueError for a reply
    whose tokens do not begin with the forced prefix's (the tokenizer merges the two)."""
    prefix = list(text.forced_prefix_ids)
    end = text.encode(text.chat["assistant_to_user"])
    eos = [eos_id] if end[:1] == [eos_id] else []

    def replies(observations: list[str | None], turn: int, turn_key: jax.Array):
        rng = np.random.default_rng(np.asarray(jax.random.key_data(turn_key)).tolist())
        rows = []
        for observation in observations:
            if observation is None:  # the row has stopped
                rows.append([])
                continue
            items = policy(observation, rng)
            reply = reply_text(text, [items] if isinstance(items, str) else items)
            ids = text.encode(reply)
            if ids[: len(prefix)] != prefix:
                raise ValueError(f"demonstration reply {reply!r} does not begin with the "
                                 "forced prefix's tokens; this tokenizer merges them")
            rows.append(ids[len(prefix):] + eos)
        tokens = np.full((len(rows), max(map(len, rows))), pad_id, np.int32)
        for row, ids in enumerate(rows):
            tokens[row, : len(ids)] = ids
        return tokens, np.array([len(r) for r in rows], np.int32)

    return host_rollout(None, None, pool, text, config, key, eos_id=eos_id, pad_id=pad_id,
                        seeds=seeds, replies=replies)


# ---------------------------------------------------------------- JSONL chat transcripts


def _runs(mask: np.ndarray) -> list[tuple[bool, int, int]]:
    """(is_reply, start, end) of the runs of equal mask values."""
    edges = np.flatnonzero(np.diff(mask.astype(np.int8))) + 1
    bounds = [0, *edges.tolist(), len(mask)]
    return [(bool(mask[a]), a, e) for a, e in zip(bounds[:-1], bounds[1:])]


def _strip(text: str, head: str, tail: str, what: str) -> str:
    if not (text.startswith(head) and text.endswith(tail) and len(text) >= len(head + tail)):
        raise ValueError(f"{what} {text!r} is not framed by the chat template's {head!r} .. "
                         f"{tail!r}")
    return text[len(head): len(text) - len(tail)]


def transcripts(out: Rollout, tokenizer: Any, codec: Codec | HostText,
                ) -> list[dict[str, list]]:
    """The rows of a rollout (sampled or demonstrated; a host rollout's with its HostText) as
    chat transcripts,
    [{"messages": [{"role": ..., "content": ...}, ...]}], the assistant contents with their
    forced prefix; re-tokenising one with the chat template gives the row's tokens back."""
    host = jax.device_get(out)
    chat = chat_pieces(tokenizer)
    prefix = codec.template.forced_prefix
    eos = tokenizer.eos_token_id
    eos_text = tokenizer.decode([eos], skip_special_tokens=False)
    decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False,  # noqa: E731
                                          clean_up_tokenization_spaces=False)
    result = []
    for b in range(host.tokens.shape[0]):
        n = int(host.lengths[b])
        tokens, mask = host.tokens[b, :n], host.loss_mask[b, :n]
        messages = [{"role": "system", "content": codec.template.system}]
        ended_with_eos = False
        for i, (reply, a, e) in enumerate(_runs(mask)):
            text = decode(tokens[a:e])
            if reply:
                ended_with_eos = bool(tokens[e - 1] == eos)
                ids = tokens[a:e - 1] if ended_with_eos else tokens[a:e]
                messages.append({"role": "assistant", "content": prefix + decode(ids)})
                continue
            if i == 0:
                lead = chat["start"] + codec.template.system + chat["system_to_user"]
            else:
                lead = chat["assistant_to_user"]
                if ended_with_eos:
                    lead = lead[len(eos_text):] if lead.startswith(eos_text) else lead
            user = _strip(text, lead, chat["user_to_assistant"] + prefix, "the prompt text")
            messages.append({"role": "user", "content": user})
        result.append({"messages": messages})
    return result


def write_jsonl(path: str | Path, conversations: Iterable[dict[str, Any]]) -> int:
    """Writes one JSON object a line; returns the number written."""
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for conversation in conversations:
            f.write(json.dumps(conversation, ensure_ascii=False) + "\n")
            count += 1
    return count


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The conversations of a `{"messages": [...]}` JSONL file. Raises ValueError naming the
    line of a malformed one (not JSON, no messages list, a message without role / content)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number} is not JSON ({error.msg})") from None
            messages = item.get("messages") if isinstance(item, dict) else None
            if not isinstance(messages, list) or not messages or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str) for m in messages):
                raise ValueError(f"{path}:{number} is invalid; valid: {{\"messages\": [{{\"role\": "
                                 "..., \"content\": ...}, ...]}")
            out.append(item)
    if not out:
        raise ValueError(f"{path} holds no conversations")
    return out


class TokenizedRows(flax.struct.PyTreeNode):
    """Rows for the SFT forward (the fields of a Rollout it reads): tokens [N, L] int32,
    lengths [N] int32, prompt_lengths [N] int32, loss_mask [N, L] bool."""

    tokens: jax.Array
    lengths: jax.Array
    prompt_lengths: jax.Array
    loss_mask: jax.Array


def tokenize_conversations(tokenizer: Any, conversations: list[dict[str, Any]], *, length: int,
                           pad_id: int, skip_prefix: str = "",
                           max_reply_tokens: int | None = None) -> TokenizedRows:
    """Chat transcripts -> rows of the model's chat template, the loss on the assistant turns
    only: each assistant message's tokens up to and including the EOS that ends it (the
    template's end of turn), without a leading `skip_prefix` (the forced prefix a rollout
    writes, not samples); a row ends after its last assistant turn. Raises ValueError for a
    conversation longer than `length` tokens or a template whose turns do not extend each
    other, or one with more than `max_reply_tokens` loss tokens (the forward's static bound)."""
    eos = tokenizer.eos_token_id
    skip = len(_encode(tokenizer, skip_prefix)) if skip_prefix else 0
    tokens = np.full((len(conversations), length), pad_id, np.int32)
    mask = np.zeros((len(conversations), length), bool)
    lengths = np.zeros(len(conversations), np.int32)
    prompts = np.zeros(len(conversations), np.int32)
    template = lambda m, **kw: _encode(  # noqa: E731  (an exported policy's reply prefix off)
        tokenizer, tokenizer.apply_chat_template(m, tokenize=False, reply_prefix="", **kw))
    for row, item in enumerate(conversations):
        messages = item["messages"]
        ids: list[int] = []
        keep: list[bool] = []
        for k, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = template(messages[:k], add_generation_prompt=True)
            through = template(messages[: k + 1])
            if through[: len(before)] != before or before[: len(ids)] != ids:
                raise ValueError("the chat template does not render a conversation as its turns "
                                 "in sequence; cannot find the assistant tokens")
            reply = through[len(before):]
            end = reply.index(eos) + 1 if eos in reply else len(reply)
            if not ids:
                prompts[row] = len(before)
            keep += [False] * (len(before) - len(ids))
            starts = skip if message["content"].startswith(skip_prefix) and skip_prefix else 0
            keep += [False] * starts + [True] * (end - starts)
            ids = before + reply[:end]
        if len(ids) > length:
            raise ValueError(f"conversation {row} takes {len(ids)} tokens; the rows hold {length}"
                             " (raise rollout.reply_tokens / shorten the conversations)")
        if not any(keep):
            raise ValueError(f"conversation {row} has no assistant message to learn from")
        if max_reply_tokens is not None and sum(keep) > max_reply_tokens:
            raise ValueError(f"conversation {row} has {sum(keep)} assistant tokens; at most "
                             f"{max_reply_tokens} (rollout.max_turns x rollout.reply_tokens)")
        tokens[row, : len(ids)] = ids
        mask[row, : len(ids)] = keep
        lengths[row] = len(ids)
    return TokenizedRows(tokens=jnp.asarray(tokens), lengths=jnp.asarray(lengths),
                         prompt_lengths=jnp.asarray(prompts), loss_mask=jnp.asarray(mask))
