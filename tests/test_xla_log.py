"""starpo_jax.xla_log: the commands set XLA's C++ log threshold before JAX loads, so that its
"Very slow compile?" alarm stays off the terminal, and keep a value of the user's.
(tests/test_first_hour.py reads the value inside run.py's process, set and kept.)"""

import re
from pathlib import Path

import pytest

from starpo_jax import xla_log

ROOT = Path(__file__).resolve().parents[1]
# What loads JAX (or could) in a command: every import after the environment is set.
HEAVY = re.compile(r"^(import jax|from jax|from absl|from starpo_jax\.(run|analysis))\b", re.M)


@pytest.mark.parametrize("environ", [{}, {"TF_CPP_MIN_LOG_LEVEL": ""}])
def test_fatal_only_when_unset(environ):
    assert xla_log.hide_slow_compile_alarm(environ)
    assert environ == {"TF_CPP_MIN_LOG_LEVEL": "3"}


@pytest.mark.parametrize("value", ["0", "1", "2", "3"])
def test_a_users_value_is_kept(value):
    environ = {"TF_CPP_MIN_LOG_LEVEL": value}
    assert not xla_log.hide_slow_compile_alarm(environ)
    assert environ == {"TF_CPP_MIN_LOG_LEVEL": value}


@pytest.mark.parametrize("script", ["run", "sft", "evaluate", "sweep", "reproduce"])
def test_the_commands_set_it_before_jax_loads(script):
    text = (ROOT / "experiments" / f"{script}.py").read_text()
    call = text.index('if __name__ == "__main__":')
    call = text.index("    hide_slow_compile_alarm()", call)
    assert call < HEAVY.search(text).start(), f"{script}.py imports JAX's users first"
