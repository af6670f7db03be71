"""Sampler and training-step throughput of SmolLM2-135M: starpo-jax vs transformers + torch.

Prints one markdown table. Both sides run in this process on the same weights (the embedded
GGUF, dequantised to float32), the same prompts and the same thread count, and each figure is
also given as a fraction of the machine's f32 matmul peak measured in the same run.

    python experiments/bench/sampler.py            # batches 1, 8, 32, 128 (~15-30 min on 2 cores)
    python experiments/bench/sampler.py --quick    # smoke run (small shapes)
    python experiments/bench/sampler.py --train-only   # only training forward+backward
    # the same, each side in processes of its own, alternating (the fair ratio: see below)
    python experiments/bench/sampler.py --train-only --process-per-side
    # + the JAX side with the training step's own loss (log-probs in chunks, recomputed)
    python experiments/bench/sampler.py --train-only --process-per-side --jax-losses full trainer
    # the rollout's decode regime (bench/step.py's chunk of 16 rows; the cache has L slots):
    python experiments/bench/sampler.py --generate-only --batches 16 --cache-slots 1732 \
        --cache-dtype bfloat16 --decode-fills 0.25 0.5 1.0
    # decode steps with the policy's float32 weights and the bfloat16 sampler, side by side
    # (rollout.sampler_dtype; the bfloat16 sampler's cache is bfloat16):
    python experiments/bench/sampler.py --generate-only --skip-torch --batches 16 32 64 \
        --cache-slots 1758 --decode-fills 0.5 --sampler-dtypes model bfloat16

The torch side loads the weights with the parity tests' reference (tests/helpers/hf_reference.py,
test-only: run from the repository root with PYTHONPATH=tests, or pass --skip-torch).
Sharing one process, the two sides slow each other's training rounds (on a 2-core CPU: 0.53x
in one process against 0.86x with a process per side, docs/performance.md), so
`--process-per-side` times the training row in alternating child processes, one side each.
Every timed phase is run once untimed first (compilation, and first touch of fresh memory,
which is slow on these VMs); the JAX sampler then reuses its KV cache by donation.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from starpo_jax.hostmem import reexec_with_huge_pages  # noqa: E402

if __name__ == "__main__":
    reexec_with_huge_pages()  # first: huge pages for XLA's CPU buffers (starpo_jax/hostmem.py)

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from starpo_jax.models import KVCache, load_pretrained
from starpo_jax.models.embedded import embedded_gguf_path
from starpo_jax.models.sampler_weights import (SAMPLER_DTYPES, sampler_graphdef,
                                               sampler_params)
from starpo_jax.rollout.sampling import SamplingOptions, generate_jit
from starpo_jax.train.forward import logprobs_from_hidden


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def best_times(fns: list[Callable[[], Any] | None], reps: int) -> list[float | None]:
    """Smallest wall time of each fn over `reps` rounds that call them in turn, so that both
    sides of a comparison see the same machine load (other processes share these cores)."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for fn, spent in zip(fns, times, strict=True):
            if fn is not None:
                start = time.perf_counter()
                fn()
                spent.append(time.perf_counter() - start)
    return [min(spent) if spent else None for spent in times]


def matmul_peak(n: int, reps: int) -> tuple[float, float]:
    """FLOP/s of an [n, n] @ [n, n] f32 matmul in jax and in torch."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32))
    mm = jax.jit(lambda a: a @ a)
    mm(x).block_until_ready()
    y = torch.from_numpy(np.array(x))
    y @ y
    t_jax, t_torch = best_times([lambda: mm(x).block_until_ready(), lambda: y @ y], reps)
    flops = 2.0 * n**3
    return flops / t_jax, flops / t_torch


def jax_generation(
    model, prompts: np.ndarray, new_tokens: int, cache_slots: int | None, cache_dtype: str | None
) -> tuple[float, Callable[[], None]]:
    """(compile seconds, one warmed-up generate call) of the starpo-jax sampler.

    The cache has `cache_slots` slots (default: exactly prompt + new tokens) in `cache_dtype`
    (default: the model's), as the rollout's is sized for the whole trajectory: prefill and
    decode steps read only its filled key blocks (models/layers.cache_attention)."""
    b, t = prompts.shape
    options = SamplingOptions(max_new_tokens=new_tokens, temperature=1.0)  # no EOS: full budget
    graphdef, params = nnx.split(model)
    ids, lengths = jnp.asarray(prompts), jnp.full((b,), t, jnp.int32)
    cache = KVCache.init(model.config, b, cache_slots or t + new_tokens, cache_dtype)
    start = time.perf_counter()
    compiled = generate_jit.lower(
        graphdef, params, ids, lengths, jax.random.key(0), cache, None, options
    ).compile()
    compile_s = time.perf_counter() - start
    state = {"cache": cache, "step": 0}

    def run() -> None:
        # An emptied cache (end = 0) is a fresh one: slots >= end are never read. Donating it
        # lets every call write into the same buffers.
        empty = state["cache"].replace(end=jnp.zeros((b,), jnp.int32))
        state["step"] += 1
        out = compiled(params, ids, lengths, jax.random.key(state["step"]), empty, None)
        out.tokens.block_until_ready()
        assert int(out.lengths.min()) == new_tokens
        state["cache"] = out.cache

    run()
    return compile_s, run


def jax_decode_step(
    model, batch: int, slots: int, cache_dtype: str | None, fill: float
) -> Callable[[], None]:
    """Four warmed-up decode steps (one token per row) over a cache of `slots` slots whose rows
    hold `fill` of them: the rollout's inner loop, without prefill or sampling."""
    graphdef, params = nnx.split(model)
    end = max(1, int(fill * slots) - 4)
    token, mask = jnp.zeros((batch, 1), jnp.int32), jnp.ones((batch, 1), bool)

    @functools.partial(jax.jit, donate_argnums=(1,))
    def step(params: nnx.State, cache: KVCache) -> tuple[jax.Array, KVCache]:
        return nnx.merge(graphdef, params)(token, attention_mask=mask, cache=cache)

    state = {"cache": KVCache.init(model.config, batch, slots, cache_dtype)}

    def run() -> None:
        cache = state["cache"].replace(end=jnp.full((batch,), end, jnp.int32))  # donated below
        for _ in range(4):
            logits, cache = step(params, cache)
        logits.block_until_ready()
        state["cache"] = cache

    run()
    return run


def torch_generation(
    model, prompts: np.ndarray, new_tokens: int, pad_id: int
) -> Callable[[], None]:
    """One warmed-up `generate` call of transformers (sampling, EOS suppressed)."""
    ids = torch.from_numpy(prompts.astype(np.int64))
    mask = torch.ones_like(ids)

    def run() -> None:
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=pad_id,
            )
        assert out.shape[1] == prompts.shape[1] + new_tokens

    run()
    return run


#: The JAX side's loss (--jax-losses): "full" materialises log-softmax over the whole vocabulary
#: at every position, as the torch side's cross-entropy does; "trainer" is the training step's
#: own path (`train.forward.logprobs_from_hidden`: logits `TRAINER_CHUNK` positions at a time,
#: recomputed in the backward pass). The same mean next-token cross-entropy either way.
JAX_LOSSES = ("full", "trainer")
TRAINER_CHUNK = 128  # the default optim.logit_chunk


def train_loss(graphdef: nnx.GraphDef, loss: str = "full") -> Callable[[Any, jax.Array],
                                                                        jax.Array]:
    """(params, ids [B, L + 1] int32) -> the mean next-token cross-entropy of ids[:, 1:] given
    the tokens before, computed as `loss` (one of JAX_LOSSES) says."""
    def loss_fn(params: nnx.State, ids: jax.Array) -> jax.Array:
        model = nnx.merge(graphdef, params)
        if loss == "trainer":
            hidden = model.hidden_states(ids[:, :-1])  # position t - 1 predicts token t
            b, length = ids.shape
            targets = jnp.broadcast_to(jnp.arange(length) >= 1, (b, length))
            logp, _ = logprobs_from_hidden(model, hidden, jnp.zeros((b,), jnp.int32), ids,
                                           targets, length - 1, TRAINER_CHUNK)
            return -jnp.mean(logp[:, 1:])
        logp = jax.nn.log_softmax(model(ids[:, :-1]), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))

    return loss_fn


def jax_train_step(model, batch: np.ndarray,
                   loss: str = "full") -> tuple[float, Callable[[], None]]:
    """(compile seconds, a warmed-up call) of `train_loss` and its gradients."""
    graphdef, params = nnx.split(model)
    loss_fn = train_loss(graphdef, loss)

    ids = jnp.asarray(batch)
    start = time.perf_counter()
    step = jax.jit(jax.value_and_grad(loss_fn)).lower(params, ids).compile()
    compile_s = time.perf_counter() - start

    def run() -> None:
        jax.block_until_ready(step(params, ids))

    run()
    return compile_s, run


def torch_train_step(model, batch: np.ndarray) -> Callable[[], None]:
    ids = torch.from_numpy(batch.astype(np.int64))

    def run() -> None:
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()

    run()
    return run


def train_batch(vocab: int, train_shape: tuple[int, ...]) -> np.ndarray:
    """The training row's token ids, [B, L + 1]: the same in every process."""
    rng = np.random.default_rng(0)
    return rng.integers(100, vocab, (train_shape[0], train_shape[1] + 1)).astype(np.int32)


def train_side(side: str, train_shape: tuple[int, ...], reps: int,
               loss: str = "full") -> tuple[float, float]:
    """(best of `reps` timed fwd+bwd rounds, compile seconds or 0) of one side, alone in this
    process: a --process-per-side child. loss: the JAX side's (JAX_LOSSES)."""
    if side == "jax":
        policy, _ = load_pretrained("smollm2-135m-instruct")
        compile_s, run = jax_train_step(
            policy, train_batch(policy.config.vocab_size, train_shape), loss)
    else:
        torch.set_num_threads(os.cpu_count() or 1)
        from helpers.hf_reference import transformers_from_gguf
        hf_model = transformers_from_gguf(embedded_gguf_path())[0]
        compile_s = 0.0
        run = torch_train_step(hf_model.train(),
                               train_batch(hf_model.config.vocab_size, train_shape))
    return min(best_times([run], reps)), compile_s


def sides_in_processes(skip_torch: bool, train_shape: tuple[int, ...], reps: int,
                       losses: tuple[str, ...]) -> tuple[dict[str, float], float | None,
                                                         dict[str, float]]:
    """({JAX loss: seconds}, torch seconds or None, {JAX loss: compile seconds}) of the
    training rows, each the best over `reps` child processes of that side, started
    alternately (each JAX loss, then torch), one round timed in each after its warm-up."""
    sides = [("jax", loss) for loss in losses] + ([] if skip_torch else [("torch", "full")])
    best: dict[tuple[str, str], float] = {}
    compile_s: dict[str, float] = {}
    for _ in range(reps):
        for side, loss in sides:
            command = [sys.executable, os.path.abspath(__file__), "--train-side", side,
                       "--jax-losses", loss, "--train-shape", *map(str, train_shape),
                       "--reps", "1"]
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            line = [x for x in done.stdout.splitlines() if x.startswith("TRAIN_SECONDS")][-1]
            seconds, compiled = map(float, line.split()[1:])
            name = side if side == "torch" else f"jax ({loss} loss)"
            progress(f"train fwd+bwd, {name} alone in its process: {seconds:.2f} s")
            best[side, loss] = min(best.get((side, loss), seconds), seconds)
            if side == "jax":
                compile_s[loss] = compiled
    return ({loss: best["jax", loss] for loss in losses}, best.get(("torch", "full")),
            compile_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, one rep: a smoke run")
    parser.add_argument("--batches", type=int, nargs="+", default=None)
    parser.add_argument("--prompt-len", type=int, default=None)
    parser.add_argument("--train-shape", type=int, nargs=2, default=None, metavar=("B", "L"))
    parser.add_argument("--reps", type=int, default=None, help="timed runs per phase (best kept)")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--train-only", action="store_true", help="only the fwd+bwd rows")
    parser.add_argument("--generate-only", action="store_true", help="only the generate rows")
    parser.add_argument("--process-per-side", action="store_true",
                        help="time the training row in alternating child processes, one side "
                        "each (--reps of them per side), not both in this one")
    parser.add_argument("--jax-losses", choices=JAX_LOSSES, nargs="+", default=("full",),
                        help="the JAX side's loss in the training rows, a row each: full "
                        "(log-softmax over the whole vocabulary, as torch's) or trainer (the "
                        "training step's chunked, recomputed log-probs)")
    parser.add_argument("--train-side", choices=("jax", "torch"), default=None,
                        help=argparse.SUPPRESS)  # a --process-per-side child
    parser.add_argument("--decode-fills", type=float, nargs="+", default=(),
                        help="also time one decode step of each batch with the cache "
                        "(--cache-slots) this full, e.g. 0.25 0.5 1.0")
    parser.add_argument("--cache-slots", type=int, default=None,
                        help="KV cache slots of the JAX sampler (default: prompt + new tokens)")
    parser.add_argument("--cache-dtype", choices=("float32", "bfloat16"), default=None,
                        help="KV cache storage of the JAX sampler (default: float32)")
    parser.add_argument("--sampler-dtypes", choices=SAMPLER_DTYPES, nargs="+",
                        default=("model",),
                        help="the JAX sampler's weights (rollout.sampler_dtype): the decode-fill "
                        "rows are timed for each, every batch, side by side; the generate rows "
                        "use the first")
    args = parser.parse_args()
    if "bfloat16" in args.sampler_dtypes and args.cache_dtype == "float32":
        parser.error("--cache-dtype float32 with --sampler-dtypes bfloat16: a bfloat16 "
                     "sampler's cache is bfloat16; leave --cache-dtype unset")
    quick = args.quick
    batches = args.batches or ([1, 4] if quick else [1, 8, 32, 128])
    prompt_len, new_tokens = (32, 16) if quick else (150, 64)
    prompt_len = args.prompt_len or prompt_len
    if args.cache_slots is not None and args.cache_slots < prompt_len + new_tokens:
        parser.error(f"--cache-slots {args.cache_slots} is below prompt + new tokens "
                     f"({prompt_len} + {new_tokens}); give at least {prompt_len + new_tokens}")
    for fill in args.decode_fills:
        if not 0.0 < fill <= 1.0:
            parser.error(f"--decode-fills {fill}: a fill is in (0, 1]")
    train_shape = tuple(args.train_shape or ((2, 128) if quick else (8, 512)))
    reps = args.reps or (1 if quick else 2)
    if args.train_side:
        print("TRAIN_SECONDS", *train_side(args.train_side, train_shape, reps,
                                           args.jax_losses[0]), flush=True)
        return
    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)

    print(
        f"jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__}, "
        f"{cores} cores, torch threads {torch.get_num_threads()}"
    )
    print(
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; allocators: defaults of both "
        "(XLA_PYTHON_CLIENT_PREALLOCATE only concerns GPUs); JAX reuses its KV cache by "
        "donation, transformers grows a DynamicCache per call; one untimed warm-up run each"
    )

    peak_jax, peak_torch = matmul_peak(512 if quick else 2048, 3)
    peak = max(peak_jax, peak_torch)

    policy, tokenizer = load_pretrained("smollm2-135m-instruct")
    samplers = {d: nnx.merge(sampler_graphdef(policy, d),
                             sampler_params(nnx.state(policy), policy.config, d))
                for d in args.sampler_dtypes}
    model = samplers[args.sampler_dtypes[0]]
    n_params = policy.config.num_params
    vocab = model.config.vocab_size
    hf_model = None
    if not args.skip_torch and not (args.train_only and args.process_per_side):
        # The parity tests' reference (tests/helpers: not in the wheel), hence PYTHONPATH=tests.
        from helpers.hf_reference import transformers_from_gguf
        hf_model = transformers_from_gguf(embedded_gguf_path())[0]
    rng = np.random.default_rng(0)
    rows: list[tuple[str, float, float | None, str, float]] = []  # name, jax, torch, unit, flops

    cache_note = (
        f", JAX cache {args.cache_slots or 'fitted'} slots {args.cache_dtype or 'float32'}"
        if args.cache_slots or args.cache_dtype else ""
    )
    for b in [] if args.train_only else batches:
        prompts = rng.integers(100, vocab, (b, prompt_len)).astype(np.int32)
        compile_s, run_jax = jax_generation(
            model, prompts, new_tokens, args.cache_slots, args.cache_dtype
        )
        run_torch = (
            torch_generation(hf_model, prompts, new_tokens, tokenizer.eos_token_id)
            if hf_model is not None
            else None
        )
        t_jax, t_torch = best_times([run_jax, run_torch], reps)
        progress(
            f"B={b}: jax {b * new_tokens / t_jax:.1f} tok/s (compile {compile_s:.1f} s), "
            f"torch {t_torch and b * new_tokens / t_torch} tok/s"
        )
        flops = 2.0 * n_params * b * (prompt_len + new_tokens)
        tokens = b * new_tokens
        rows.append(
            (
                f"generate B={b} ({prompt_len}+{new_tokens} tok{cache_note}), generated tok/s",
                tokens / t_jax,
                t_torch and tokens / t_torch,
                "tok/s",
                flops / tokens,
            )
        )
        if b == batches[min(2, len(batches) - 1)]:
            rows.append((f"compile prefill+decode B={b}, s", compile_s, None, "s", 0.0))

    slots = args.cache_slots or prompt_len + new_tokens
    for b, fill in [(b, f) for b in batches for f in args.decode_fills]:
        steps = [jax_decode_step(m, b, slots, args.cache_dtype, fill) for m in samplers.values()]
        for dtype, m, t_step in zip(samplers, samplers.values(), best_times(steps, reps)):
            stored = args.cache_dtype or m.config.dtype
            name = (f"decode step B={b}, cache {slots} slots {stored} {round(100 * fill)}% "
                    f"full, sampler {dtype}, ms")
            rows.append((name, 1e3 * t_step / 4, None, "ms", 0.0))
            progress(f"{name}: {1e3 * t_step / 4:.1f}")

    if not args.generate_only:
        losses = tuple(dict.fromkeys(args.jax_losses))
        if args.process_per_side:
            t_jax, t_torch, compile_s = sides_in_processes(args.skip_torch, train_shape, reps,
                                                           losses)
        else:
            batch = train_batch(vocab, train_shape)
            compiled = {loss: jax_train_step(policy, batch, loss) for loss in losses}
            run_torch = (torch_train_step(hf_model.train(), batch) if hf_model is not None
                         else None)
            *times, t_torch = best_times([compiled[loss][1] for loss in losses] + [run_torch],
                                         reps)
            t_jax = dict(zip(losses, times))
            compile_s = {loss: compiled[loss][0] for loss in losses}
        tokens = train_shape[0] * train_shape[1]
        for loss in losses:
            rows.append((f"train fwd+bwd {train_shape[0]}x{train_shape[1]} (jax: {loss} loss), "
                         "tok/s", tokens / t_jax[loss], t_torch and tokens / t_torch, "tok/s",
                         6.0 * n_params))
        for loss in losses:
            rows.append((f"compile fwd+bwd ({loss} loss), s", compile_s[loss], None, "s", 0.0))

    print(
        f"\nSmolLM2-135M ({n_params / 1e6:.1f} M params, float32). f32 matmul peak: "
        f"jax {peak_jax / 1e9:.1f} GFLOP/s, torch {peak_torch / 1e9:.1f} GFLOP/s; "
        f"fractions below are of the larger ({peak / 1e9:.1f}).\n"
    )
    print("| phase | starpo-jax | transformers | jax / torch | jax % peak | torch % peak |")
    print("|---|---|---|---|---|---|")
    for name, jx, th, unit, flops_per_token in rows:
        if unit in ("s", "ms"):
            print(f"| {name} | {jx:.1f} | | | | |")
            continue
        ratio = f"{jx / th:.2f}x" if th else ""
        jax_frac, torch_frac = (
            f"{100 * rate * flops_per_token / peak:.1f}%" if rate else "" for rate in (jx, th)
        )
        print(
            f"| {name} | {jx:.1f} | {f'{th:.1f}' if th else ''} | {ratio} | {jax_frac} | "
            f"{torch_frac} |"
        )


if __name__ == "__main__":
    main()
