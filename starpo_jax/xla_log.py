"""XLA's "Very slow compile?" alarm kept off the commands' terminal.

XLA prints a block of asterisks and "Very slow compile? If you want to file a bug, run with
envvar XLA_FLAGS=--xla_dump_to=/tmp/foo and attach the results." whenever one compile passes 2
minutes (xla::SlowCompilationAlarm: a fixed timeout, no XLA flag turns it off), through its C++
log at ERROR level. The paper configs' train step compiles for minutes on a CPU, so the alarm
reads as a failure where nothing is wrong, while the commands already say what they compile
and how long it took (starpo_jax.run.announce). The one knob is the threshold of XLA's C++ log,
the environment variable TF_CPP_MIN_LOG_LEVEL, read when jaxlib loads (0: everything, 1: JAX's
own default, warnings and errors, 2: errors, 3: fatal only): run.py, sft.py, evaluate.py,
sweep.py and reproduce.py call `hide_slow_compile_alarm()` before JAX loads, setting it to 3.
An error that stops a computation still reaches Python as an exception with its message; only
XLA's C++ log lines (its warnings included) are hidden.

A TF_CPP_MIN_LOG_LEVEL of your own is kept: `TF_CPP_MIN_LOG_LEVEL=1 python experiments/run.py
...` shows XLA's warnings and errors, the alarm among them, as plain JAX does.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
#: Fatal messages only: hides the alarm, which XLA logs at ERROR.
FATAL_ONLY = "3"


def hide_slow_compile_alarm(environ: MutableMapping[str, str] | None = None) -> bool:
    """Sets TF_CPP_MIN_LOG_LEVEL=3 in `environ` (default os.environ) unless it is set; -> whether
    it set it. Call before `import jax` (jaxlib reads it as it loads; JAX itself only sets a
    default of 1 when unset)."""
    environ = os.environ if environ is None else environ
    if environ.get(VARIABLE, "") != "":
        return False
    environ[VARIABLE] = FATAL_ONLY
    return True
