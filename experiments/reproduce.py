"""The reproduction suite: train, compare StarPO with StarPO-S, and report (issue 15).

    python experiments/reproduce.py --suite cpu --workdir results/cpu [--dry-run]
    python experiments/reproduce.py --suite paper --workdir results/paper   # GPUs: the paper's
    python experiments/reproduce.py --suite cpu --workdir results/cpu --report-only
    python experiments/reproduce.py --suite cpu --workdir results/cpu --only filter_ablation

The suites' experiments are starpo_jax.analysis.suite; what this command does with one (the runs,
their resume, the SFT stage, the report under --workdir) is starpo_jax.analysis.reproduce's
docstring.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from starpo_jax.hostmem import reexec_with_huge_pages  # noqa: E402
from starpo_jax.xla_log import hide_slow_compile_alarm  # noqa: E402

if __name__ == "__main__":
    reexec_with_huge_pages()  # first: huge pages for XLA's CPU buffers (starpo_jax/hostmem.py)
    hide_slow_compile_alarm()  # XLA's "Very slow compile?" block: starpo_jax/xla_log.py

from starpo_jax.analysis.reproduce import MEMORY_WAIT_SECONDS, reproduce  # noqa: E402
from starpo_jax.analysis.suite import SUITES  # noqa: E402
from starpo_jax.run.workdir import RunFault  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES), required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the "
                        "estimated time; train nothing")
    parser.add_argument("--report-only", action="store_true", help="write the report from the "
                        "finished runs; train nothing")
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep a finished "
                        "run's checkpoints (deleted by default: GiBs per SmolLM2 run)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every setting, e.g. --set "
                        "model.source=/models/Qwen2.5-0.5B-Instruct (repeatable)")
    parser.add_argument("--only", action="append", default=[], metavar="EXPERIMENT",
                        help="train only this experiment's runs (repeatable; the report still "
                        "covers every experiment's finished runs)")
    parser.add_argument("--memory-wait", type=float, default=MEMORY_WAIT_SECONDS / 60,
                        metavar="MINUTES", help="how long a run whose step does not fit the "
                        "free memory waits for it, trying again every minute (default "
                        f"{MEMORY_WAIT_SECONDS / 60:g}; 0: stop at once)")
    args = parser.parse_args()
    if not args.memory_wait >= 0:
        parser.error(f"--memory-wait {args.memory_wait:g} is invalid; valid: minutes >= 0")
    reproduce(SUITES[args.suite](), args.suite, args.workdir, dry_run=args.dry_run,
              report_only=args.report_only, keep_checkpoints=args.keep_checkpoints,
              overrides=args.set, only=args.only, memory_wait=args.memory_wait * 60)


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError, MemoryError, FileExistsError, RunFault) as error:
        sys.exit(f"error: {error}")
