"""starpo_jax.run.overrides: one parser for a config value given as text, shared by
`--config.KEY=VALUE`, `--set KEY=VALUE` and `--grid KEY=V1,V2`."""

from __future__ import annotations

import sys

import pytest
from absl import flags
from ml_collections.config_flags import config_flags

from starpo_jax.run.overrides import (parse_grid, parse_overrides, parse_value,
                                      use_for_config_flags)
from starpo_jax.run.schema import default_config

# (key, text, the value every route gives)
CASES = [
    ("steps", "5", 5), ("filter.keep_ratio", "0.5", 0.5), ("filter.keep_ratio", "1", 1.0),
    ("nothink", "true", True), ("nothink", "0", False), ("vanilla", "True", True),
    ("model.source", "tiny-random", "tiny-random"), ("optim.micro_batches", "None", None),
    ("optim.micro_batches", "2", 2), ("optim.remat", "False", False),
    ("rollout.max_turns", "3", 3), ("loss.dual_clip", "None", None),
    ("advantage.whiten", "None", None), ("eval.seed", "7", 7), ("prompt.system", "Hi", "Hi"),
]


@pytest.mark.parametrize("text, kind, expected", [
    ("3", int, 3), (" 3 ", int, 3), ("0.25", float, 0.25), ("2", float, 2.0), ("1e-6", float, 1e-6),
    ("true", bool, True), ("False", bool, False), ("1", bool, True), ("None", int, None),
    ("a b", str, "a b"), (7, int, 7), (True, bool, True), (3, float, 3.0),
])
def test_parse_value_reads_text_as_the_key_s_type(text, kind, expected):
    value = parse_value(text, kind)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("text, kind", [("2.5", int), ("abc", float), ("maybe", bool),
                                        ("yes", bool), (True, int)])
def test_parse_value_refuses_text_of_another_type(text, kind):
    with pytest.raises(ValueError, match=f"^{text!r} is not of type {kind.__name__}$"):
        parse_value(text, kind)


def _config_flags(argv: list[str]):
    """The config `--config.KEY=VALUE ...` gives, parsed as the scripts parse it (cli: the
    overrides are read from sys.argv when the flag is defined)."""
    use_for_config_flags()
    values = flags.FlagValues()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["prog", *argv])
        config_flags.DEFINE_config_dict("config", default_config(), flag_values=values)
        values(sys.argv)
    return values.config


@pytest.mark.parametrize("key, text, value", CASES)
def test_config_flags_set_and_grid_read_a_value_alike(key, text, value):
    base = default_config()
    assert parse_grid([f"{key}={text}"], base) == [(key, (value,))]
    assert parse_overrides([f"{key}={text}"], base) == {key: value}
    config = _config_flags([f"--config.{key}={text}"])
    *sections, leaf = key.split(".")
    for name in sections:
        config = config[name]
    assert config[leaf] == value and type(config[leaf]) is type(value)


def test_a_bare_bool_flag_and_its_no_form_still_work():
    assert _config_flags(["--config.nothink"]).nothink is True
    assert _config_flags(["--noconfig.check_memory"]).check_memory is False


def test_a_config_flag_of_the_wrong_type_is_named_in_one_line():
    with pytest.raises(flags.IllegalFlagValueError,
                       match=r"^flag --config.steps=2.5: '2.5' is not of type int$"):
        _config_flags(["--config.steps=2.5"])
    with pytest.raises(ValueError, match=r"^--grid steps: '2.5' is not of type int \(that of "):
        parse_grid(["steps=2.5"], default_config())
