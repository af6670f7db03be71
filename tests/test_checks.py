"""starpo_jax.checks: the one set of value checks, each refusal one line naming the key, the
value and what is valid."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from starpo_jax import checks


@pytest.mark.parametrize("call, message", [
    (lambda: checks.check_int("rollout.groups", 0),
     "rollout.groups = 0 is invalid; valid: an int >= 1"),
    (lambda: checks.check_int("collapse.every", True, low=0),
     "collapse.every = True is invalid; valid: an int >= 0"),
    (lambda: checks.check_number("loss.clip_low", 1.0, 0.0, 1.0, high_open=True),
     "loss.clip_low = 1.0 is invalid; valid: a number in [0.0, 1.0)"),
    (lambda: checks.check_number("rollout.top_p", 0.0, 0.0, 1.0, low_open=True),
     "rollout.top_p = 0.0 is invalid; valid: a number in (0.0, 1.0]"),
    (lambda: checks.check_number("optim.actor_lr", float("nan"), 0.0, 10.0),
     "optim.actor_lr = nan is invalid; valid: a number in [0.0, 10.0]"),
    (lambda: checks.check_number("loss.kl_coef", False, 0.0, 1.0),
     "loss.kl_coef = False is invalid; valid: a number in [0.0, 1.0]"),
    (lambda: checks.check_bool("optim.remat", 1),
     "optim.remat = 1 is invalid; valid: True or False"),
    (lambda: checks.check_choice("loss.agg", "sum", ("token_mean",)),
     "loss.agg = 'sum' is invalid; valid: one of ('token_mean',)"),
    (lambda: checks.require_valid("seed", -1, False, "an int >= 0"),
     "config.seed = -1 is invalid; valid: an int >= 0"),
])
def test_a_refusal_is_one_line_naming_key_value_and_what_is_valid(call, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()


def test_valid_values_pass_at_the_closed_ends():
    checks.check_int("rollout.top_k", 0, low=0)
    checks.check_number("filter.keep_ratio", 1.0, 0.0, 1.0, low_open=True)
    checks.check_number("loss.kl_coef", 0, 0.0, 1.0)
    checks.check_bool("nothink", False)
    checks.check_choice("algo", "ppo", ("ppo", "grpo"))
    assert checks.is_int(3, 3) and not checks.is_int(3.0, 0) and not checks.is_int(True, 0)
    assert checks.is_number(1e-6) and not checks.is_number(float("inf"))


def test_the_config_dataclasses_import_no_jax():
    """config.py and checks.py are the lowest rank: a config is checked before JAX loads."""
    code = "import sys, starpo_jax.config; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
