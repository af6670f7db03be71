"""A persistent XLA compilation cache for the commands: a program compiled once is loaded after.

run.py, sft.py, evaluate.py and sweep.py call `use_compile_cache()` before JAX is imported. It
points JAX's persistent compilation cache at `$STARPO_JAX_CACHE/xla` (default
`~/.cache/starpo_jax/xla`, beside the embedded model's file) with a size bound (least recently
used entries go first), through the environment variables JAX reads when it is imported. So
`--resume`, another seed, a sweep's next point and evaluate.py on a run's workdir load the
programs the first run compiled: on an H200, StarPO steps of SmolLM2 whose program another
process had compiled started in 52 s, against ~240 s for the processes that compiled it beside
an SFT run (results/cpu/pilots/README.md); docs/performance.md has this CPU's figures. JAX
keys an entry by the program, its compile options and the JAX / XLA versions, so a loaded
program computes what a fresh compile would; a program with host callbacks is not cached (so
the train step's progress marks go only into steps that may run long:
run/experiment.PROGRESS_MARGIN).

A cache directory chosen already (`JAX_COMPILATION_CACHE_DIR`, the test suite's) is kept;
`STARPO_JAX_COMPILE_CACHE=0` turns it off. The benchmarks do not call this: they time compiles.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import MutableMapping
from pathlib import Path

OPT_OUT = "STARPO_JAX_COMPILE_CACHE"
DIR_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
SIZE_VARIABLE = "JAX_COMPILATION_CACHE_MAX_SIZE"
#: The cache's bound in bytes: SmolLM2's programs are ~1-2 MB each on a CPU.
MAX_BYTES = 2 * 2**30


def cache_root(environ: MutableMapping[str, str] | None = None) -> Path:
    """The project's cache directory: $STARPO_JAX_CACHE, else ~/.cache/starpo_jax (the one
    rule; models.gguf.cache_dir keeps the tokenizers and the embedded model's file there).
    Here, at the package's root, so that a command reads it before JAX loads."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("STARPO_JAX_CACHE") or Path.home() / ".cache" / "starpo_jax")


def use_compile_cache(environ: MutableMapping[str, str] | None = None) -> Path | None:
    """Set the variables JAX reads at import for its persistent compilation cache, unless the
    user chose a directory or opted out; -> the directory now in use by this rule, or None.
    Call before `import jax` (a later call changes nothing in a process that imported it)."""
    environ = os.environ if environ is None else environ
    if environ.get(DIR_VARIABLE) or environ.get(OPT_OUT, "1") == "0":
        return None
    path = cache_root(environ) / "xla"
    environ[DIR_VARIABLE] = str(path)
    # The size bound needs the filelock package (JAX locks the directory to evict); it comes
    # with huggingface-hub, a dependency of transformers.
    if SIZE_VARIABLE not in environ and importlib.util.find_spec("filelock") is not None:
        environ[SIZE_VARIABLE] = str(MAX_BYTES)
    return path
