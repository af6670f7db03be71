"""Export a run's trained policy as a Hugging Face model directory (safetensors).

    python experiments/export.py --workdir runs/bandit --out exported/bandit
    python experiments/export.py --workdir runs/bandit --out exported/bandit --step 20 \
        --dtype bfloat16 --overwrite

starpo_jax.run.export.export_run reads the run's config.json (model.source and model.dtype),
rebuilds the model and tokenizer with load_pretrained, restores the actor of the newest
checkpoint under checkpoints/ (or of --step N) and writes it with
starpo_jax.models.export.save_pretrained: config.json, safetensors weights (sharded above
--max_shard_size), generation_config.json and the tokenizer with its chat template (files mode
0644). The critic is not exported; a LoRA run's adapters are merged into the weights
(W + A B * alpha / rank; the frozen base is rebuilt from model.source and model.init_from), so
the directory is a plain model. The result loads with
`transformers.AutoModelForCausalLM.from_pretrained(out)` and with our own `load_pretrained(out)`.
Its chat template's generation prompt ends with the reply prefix the run forced before every
reply ("<answer>" or "<think>"), so `apply_chat_template(messages, add_generation_prompt=True)`
is the prompt the run fed its policy; starpo_prompt.json holds the run's system prompt, env
intro, turn and reward templates, reply prefix, stop string and an example of turn 1.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from starpo_jax.config import MODEL_DTYPES as DTYPES  # noqa: E402
from starpo_jax.run.schema import read_run_config  # noqa: E402


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python experiments/export.py", description=__doc__.split("\n\n")[0],
        epilog="example: python experiments/export.py --workdir runs/quickstart --out "
        "exported/quickstart (the result loads with transformers' from_pretrained and with "
        "starpo_jax.models.load_pretrained; docs/models.md)")
    parser.add_argument("--workdir", required=True, help="the run's --workdir")
    parser.add_argument("--out", required=True, help="the directory to write (must not exist, "
                        "or be empty, unless --overwrite)")
    parser.add_argument("--step", type=int, default=None,
                        help="the checkpoint to export (default: the newest)")
    parser.add_argument("--dtype", choices=DTYPES, default=None,
                        help="dtype of the stored weights (default: the run's model.dtype)")
    parser.add_argument("--max_shard_size", default=None,
                        help="split the weights into files of at most this size (e.g. 2GB; "
                        "default: save_pretrained's)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    args = parser.parse_args(argv)
    try:  # the run's config, before the heavy imports: a workdir without one is a line at once
        read_run_config(args.workdir)
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
    return args


_ARGS: argparse.Namespace | None = None  # parsed and checked first, run as a script
if __name__ == "__main__":
    _ARGS = _parse(None)

from absl import logging as absl_logging  # noqa: E402

from starpo_jax.run.export import export_run  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    args = _ARGS if _ARGS is not None and argv is None else _parse(argv)
    absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's notes on opening read-only
    shards = {} if args.max_shard_size is None else {"max_shard_size": args.max_shard_size}
    try:
        step, path = export_run(args.workdir, args.out, step=args.step, dtype=args.dtype,
                                overwrite=args.overwrite, **shards)
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(f"exported step {step} of {args.workdir} -> {path}", flush=True)


if __name__ == "__main__":
    main()
