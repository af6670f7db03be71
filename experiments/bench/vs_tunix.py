"""The same GRPO step in starpo-jax and in tunix (google-tunix 0.1.7: its GRPO learner and
vanilla sampler), side by side on one machine: seconds per step and peak memory.

    python3 -m venv /tmp/tunixvenv && /tmp/tunixvenv/bin/pip install google-tunix==0.1.7
    python experiments/bench/vs_tunix.py --tunix-python /tmp/tunixvenv/bin/python [--steps 4]

tunix needs its own environment (its pins differ from this project's), so it runs under
--tunix-python; without it only this project's rows are printed. The work is the quickstart's
(experiments/configs/quickstart.py): SmolLM2-135M in float32, 4 Bandit prompts (the rollout's
own first prompts, chat template and forced "<answer>" prefix included, ~210 tokens) x 8
sampled replies of at most 12 tokens at temperature 1, one GRPO update of the policy on all 32
rows (filter.keep_ratio=1.0), Adam, no KL term. tunix gets the same weights (written as a
Hugging Face directory by starpo_jax.models.export) and the same prompt texts.

Each side runs in a process of its own, one after the other (ours first), for --steps steps:
a step's time is the median over the steps after the first (the first compiles), peak memory
the process's peak resident set (os.wait4). This project's rows run `experiments/run.py` with
the config's defaults (memory knobs chosen from the compiled plan, as a user's run); tunix's
with train / rollout / log-prob micro-batches of --tunix-micro-batch prompts (default 1: 8 rows
at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # experiments/


def _child(argv: list[str], log: Path, env: dict | None = None) -> tuple[int, float]:
    """Runs argv, its output to `log`; returns (exit status, peak RSS in GiB)."""
    with open(log, "w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(process.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 2**20


def _steady(seconds: list[float]) -> float:
    """The median step time after the first step (which compiles)."""
    return statistics.median(seconds[1:] if len(seconds) > 1 else seconds)


# ---------------------------------------------------------------- this project's side


def prepare_side(out: Path) -> None:
    """Writes SmolLM2 as a Hugging Face directory under `out` and the tunix side's spec,
    out/spec.json: that directory and the quickstart's 4 first prompts as text."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from starpo_jax import api
    from starpo_jax.models.export import save_pretrained
    from starpo_jax.analysis.suite import load_config

    config = load_config("quickstart")
    config.filter.keep_ratio = 1.0
    exp = api.build(config)
    model_dir = out / "smollm2-hf"
    save_pretrained(exp.model, exp.model.config, exp.tokenizer, model_dir, overwrite=True)
    r = exp.train.rollout
    states, _ = jax.vmap(exp.env.reset)(jax.random.split(jax.random.PRNGKey(0), r.groups))
    symbols = jax.vmap(exp.env.render_symbols)(states)
    ids, lengths = exp.codec.first_prompt(symbols, jnp.full((r.groups,),
                                                             r.max_actions_per_traj))
    ids, lengths = np.asarray(ids), np.asarray(lengths)
    forced = list(exp.codec.forced_prefix_ids)
    prompts = [exp.tokenizer.decode([int(i) for i in ids[g, :lengths[g]]] + forced)
               for g in range(r.groups)]
    spec = dict(model_dir=str(model_dir), prompts=prompts, group_size=r.group_size,
                reply_tokens=r.reply_tokens, temperature=r.temperature,
                lr=config.optim.actor_lr, eos_id=exp.tokenizer.eos_token_id,
                prompt_tokens=[int(n) + len(forced) for n in lengths])
    (out / "spec.json").write_text(json.dumps(spec))


def prepare(work: Path) -> dict:
    """prepare_side in a process of its own (its memory is gone before anything is timed)."""
    status, _ = _child([sys.executable, __file__, "--prepare-side", str(work)],
                       work / "prepare.log")
    if status:
        raise RuntimeError(f"exporting SmolLM2 failed (exit {status}); see {work}/prepare.log")
    return json.loads((work / "spec.json").read_text())


def ours(steps: int, keep_ratio: float, work: Path) -> dict:
    """experiments/run.py on the quickstart config with `keep_ratio`, in its own process."""
    workdir = work / f"ours_keep_{keep_ratio}"
    argv = [sys.executable, str(HERE / "run.py"), "--config", "quickstart.py",
            "--workdir", str(workdir), f"--config.steps={steps}", "--config.eval_every=0",
            "--config.sample_every=0", "--config.checkpoint_every=0",
            f"--config.filter.keep_ratio={keep_ratio}"]
    status, rss = _child(argv, work / f"ours_keep_{keep_ratio}.log")
    if status:
        raise RuntimeError(f"run.py failed (exit {status}); see {work}/ours_keep_{keep_ratio}.log")
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    seconds = [x["timing/step_seconds"] for x in lines if "timing/step_seconds" in x]
    memory = json.loads((workdir / "config.json").read_text()).get("auto_memory") or {}
    return dict(seconds=seconds, peak_rss_gib=rss, settings=memory.get("settings"))


def tunix(python: str, spec: dict, steps: int, micro: int, work: Path) -> dict:
    """This file's tunix side (`--tunix-side`) under `python`, in its own process."""
    spec = dict(spec, steps=steps, micro_batch=micro)
    spec_path = work / "tunix_spec.json"
    spec_path.write_text(json.dumps(spec))
    result = work / "tunix_result.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    status, rss = _child([python, __file__, "--tunix-side", str(spec_path), str(result)],
                         work / "tunix.log", env)
    if status:
        raise RuntimeError(f"the tunix side failed (exit {status}); see {work}/tunix.log")
    return dict(json.loads(result.read_text()), peak_rss_gib=rss)


# ---------------------------------------------------------------- tunix's side


def tunix_side(spec_path: str, result_path: str) -> None:
    """Runs in tunix's environment: GRPOLearner + vanilla sampler on the spec's prompts;
    writes each step's seconds (from the end of one global step to the next's)."""
    import jax
    import numpy as np
    import optax
    import transformers
    from tunix.models.llama3 import model as llama
    from tunix.models.llama3 import params as llama_params
    from tunix.rl import rl_cluster as rl
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout

    spec = json.loads(Path(spec_path).read_text())
    hf = json.loads((Path(spec["model_dir"]) / "config.json").read_text())
    config = llama.ModelConfig(
        num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"],
        embed_dim=hf["hidden_size"], hidden_dim=hf["intermediate_size"],
        num_heads=hf["num_attention_heads"], head_dim=hf["hidden_size"]
        // hf["num_attention_heads"], num_kv_heads=hf["num_key_value_heads"],
        rope_theta=int(hf["rope_theta"]), norm_eps=hf["rms_norm_eps"],
        weight_tying=hf.get("tie_word_embeddings", False))
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    model = llama_params.create_model_from_safe_tensors(spec["model_dir"], config, mesh)
    tokenizer = transformers.AutoTokenizer.from_pretrained(spec["model_dir"])
    prompt_tokens = max(len(tokenizer(p)["input_ids"]) for p in spec["prompts"])
    max_prompt = -(-prompt_tokens // 8) * 8
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=spec["reply_tokens"], max_prompt_length=max_prompt,
        kv_cache_size=max_prompt + spec["reply_tokens"] + 8, temperature=spec["temperature"],
        top_p=1.0, top_k=None, eos_tokens=[spec["eos_id"]])
    micro = spec["micro_batch"]
    training = rl.RLTrainingConfig(
        actor_optimizer=optax.adam(spec["lr"]), eval_every_n_steps=10**9,
        max_steps=spec["steps"], mini_batch_size=len(spec["prompts"]),
        train_micro_batch_size=micro, rollout_micro_batch_size=micro,
        compute_logps_micro_batch_size=micro)
    roles = {rl.Role.ACTOR: mesh, rl.Role.REFERENCE: mesh, rl.Role.ROLLOUT: mesh}
    cluster = rl.RLCluster(actor=model, reference=None, tokenizer=tokenizer,
                           cluster_config=rl.ClusterConfig(
                               role_to_mesh=roles, rollout_engine="vanilla",
                               offload_to_cpu=False, training_config=training,
                               rollout_config=rollout))
    ends: list[float] = []

    class Timed(grpo_learner.GRPOLearner):
        def _run_global_step(self, *args, **kwargs):
            out = super()._run_global_step(*args, **kwargs)
            jax.effects_barrier()
            ends.append(time.perf_counter())
            return out

    def reward(prompts, completions, **_):
        # Any reward with spread within a group will do: the work does not depend on it.
        return [float(len(c) % 3) for c in completions]

    algo = grpo_learner.GRPOConfig(num_generations=spec["group_size"], num_iterations=1,
                                   beta=0.0, epsilon=0.2)
    learner = Timed(rl_cluster=cluster, algo_config=algo, reward_fns=reward)
    batches = [{"prompts": list(spec["prompts"])} for _ in range(spec["steps"])]
    start = time.perf_counter()
    learner.train(batches)
    times = np.diff([start] + ends).tolist()
    Path(result_path).write_text(json.dumps(dict(seconds=times, prompt_tokens=prompt_tokens)))


# ---------------------------------------------------------------- table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tunix-python", default=None,
                        help="a Python with google-tunix==0.1.7 installed (its own venv)")
    parser.add_argument("--steps", type=int, default=4, help="steps per side (>= 2)")
    parser.add_argument("--tunix-micro-batch", type=int, default=1,
                        help="tunix's train / rollout / log-prob micro-batch, in prompts")
    parser.add_argument("--workdir", default=None, help="where the runs write (default: a "
                        "temporary directory)")
    parser.add_argument("--tunix-side", nargs=2, metavar=("SPEC", "RESULT"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--prepare-side", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tunix_side:
        tunix_side(*args.tunix_side)
        return
    if args.prepare_side:
        prepare_side(Path(args.prepare_side))
        return
    if args.steps < 2:
        parser.error(f"--steps {args.steps}: at least 2 (the first step compiles)")
    if args.tunix_python and not Path(args.tunix_python).is_file():
        parser.error(f"--tunix-python {args.tunix_python}: no such file")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_tunix_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"workdir {work}; {args.steps} steps per side", flush=True)
    rows = []
    if args.tunix_python:
        spec = prepare(work)
        print(f"prompts: {spec['prompt_tokens']} tokens (ours)", flush=True)
    for keep in (1.0, 0.25):
        r = ours(args.steps, keep, work)
        what = ("starpo-jax, keep_ratio 1.0 (all 32 rows updated)" if keep == 1.0
                else "starpo-jax, quickstart as shipped (keep 0.25: 8 rows updated)")
        rows.append((what, r))
        print(f"{what}: {r['seconds']}", flush=True)
    if args.tunix_python:
        r = tunix(args.tunix_python, spec, args.steps, args.tunix_micro_batch, work)
        rows.insert(0, (f"tunix 0.1.7 (micro-batch {args.tunix_micro_batch}; all 32 rows)", r))
        print(f"tunix: {r['seconds']} (prompt {r['prompt_tokens']} tokens)", flush=True)
    print("\n| what | step (steady median) | peak RSS | memory knobs |\n|---|---:|---:|---|")
    for what, r in rows:
        knobs = ", ".join(f"{k}={v}" for k, v in (r.get("settings") or {}).items()) or "-"
        print(f"| {what} | {_steady(r['seconds']):.1f} s | {r['peak_rss_gib']:.1f} GiB | "
              f"{knobs} |")
    if args.tunix_python:
        t, o = _steady(rows[0][1]["seconds"]), _steady(rows[1][1]["seconds"])
        print(f"\nsame work (all 32 rows): starpo-jax {t / o:.2f}x faster per step, "
              f"{rows[1][1]['peak_rss_gib'] / rows[0][1]['peak_rss_gib']:.2f}x tunix's peak "
              "memory")


if __name__ == "__main__":
    main()
