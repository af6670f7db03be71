"""Per test file (or per test, --tests) of a COMPILE_LOG written through sitecustomize.py here:
seconds of XLA backend compile, tracing and lowering, and the persistent cache's misses and
hits, most compile first.

    python tests/helpers/compile_log/summary.py /tmp/compile.jsonl [--tests] [--top 40]"""

from __future__ import annotations

import argparse
import collections
import json

SECONDS = {"/jax/core/compile/backend_compile_duration": "backend",
           "/jax/core/compile/jaxpr_trace_duration": "trace",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower"}
COUNTS = {"/jax/compilation_cache/cache_misses": "misses",
          "/jax/compilation_cache/cache_hits": "hits"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log")
    parser.add_argument("--tests", action="store_true", help="one row per test, not per file")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    rows: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    with open(args.log) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a killed process
                continue
            key = record["test"] if args.tests else record["test"].split("::")[0]
            name = SECONDS.get(record["event"]) or COUNTS.get(record["event"])
            if name:
                rows[key][name] += record["value"]
    total = sum(rows.values(), collections.Counter())
    print(f"{'backend s':>9} {'trace s':>8} {'lower s':>8} {'misses':>7} {'hits':>6}  where")
    ranked = sorted(rows.items(), key=lambda kv: -kv[1]["backend"])[: args.top]
    for key, c in [("all", total), *ranked]:
        print(f"{c['backend']:9.1f} {c['trace']:8.1f} {c['lower']:8.1f} {int(c['misses']):7d} "
              f"{int(c['hits']):6d}  {key}")


if __name__ == "__main__":
    main()
