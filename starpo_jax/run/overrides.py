"""One parser for a config value given as text, wherever the text comes from: `--config.KEY=VALUE`
(ml_collections' config flags: run.py, sft.py, sweep.py, evaluate.py), `--set KEY=VALUE`
(reproduce.py, bench/step.py) and `--grid KEY=V1,V2,...` (sweep.py).

    parse_value("0.25", float)                    # 0.25; the type is that of the key's default
    parse_grid(["loss.kl_coef=0,0.001"], base)    # [("loss.kl_coef", (0.0, 0.001))]
    parse_overrides(["steps=5"], base)            # {"steps": 5}
    use_for_config_flags()                        # --config.KEY=VALUE parsed by parse_value too

The rules: a key's type is its schema default's (a key whose default is None has its declared
type: starpo_jax.run.schema); "None" clears a key; a bool is true / True / 1 or false / False /
0; an int is an int literal (not 2.5); a float any float literal. No JAX here: the scripts
parse their flags before they import it.
"""

from __future__ import annotations

import difflib
from typing import Any, Sequence

from absl import flags
from ml_collections import config_dict
from ml_collections.config_flags import config_flags

ConfigDict = config_dict.ConfigDict
GridAxis = tuple[str, tuple[Any, ...]]  # (dotted config key, its values in the given order)
# Keys a grid may not sweep: seeds have their own flag, and these only shape the output.
NOT_SWEPT = ("seed", "log_every", "checkpoint_every", "keep_checkpoints")
TRUE, FALSE = ("true", "True", "1"), ("false", "False", "0")
TYPES = (bool, int, float, str)


def parse_value(text: Any, kind: type) -> Any:
    """`text` as a value of `kind` (bool, int, float or str); "None" -> None. A value that is
    not text and already of `kind` (a flag's default) is returned as it is. Raises ValueError
    "'<text>' is not of type <kind>" (the caller names the key)."""
    if not isinstance(text, str):
        same = isinstance(text, kind) and (kind is bool or not isinstance(text, bool))
        if text is None or same:
            return text
        if kind is float and isinstance(text, int) and not isinstance(text, bool):
            return float(text)
        raise ValueError(f"{text!r} is not of type {kind.__name__}")
    text = text.strip()
    if text == "None":
        return None
    if kind not in TYPES:
        raise ValueError(f"{text!r}: a {kind.__name__} cannot be given as text; valid: keys "
                         "holding a bool, int, float or str")
    if kind is str:
        return text
    try:
        if kind is bool:
            if text not in TRUE + FALSE:
                raise ValueError
            return text in TRUE
        return kind(text)
    except ValueError:
        raise ValueError(f"{text!r} is not of type {kind.__name__}") from None


def field(base: ConfigDict, key: str, flag: str = "--grid") -> tuple[ConfigDict, str]:
    """The section of `base` holding dotted `key` and the key's last part; ValueError naming
    `flag`, the unknown part and the closest known key."""
    parts = key.split(".")
    section = base
    for i, name in enumerate(parts):
        known = sorted(section.keys()) if isinstance(section, ConfigDict) else []
        if name not in known:
            prefix = "".join(part + "." for part in parts[:i])
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {prefix + close[0]!r}?)" if close else ""
            where = f" in {prefix[:-1]!r}" if prefix else ""
            raise ValueError(f"{flag}: unknown config key {key!r}{hint}; valid keys{where}: "
                             f"{known}")
        if i < len(parts) - 1:
            section = section[name]
    return section, parts[-1]


def key_type(base: ConfigDict, key: str, flag: str = "--grid") -> type:
    """The type of `base`'s dotted `key` (its default's, or its declared one when None)."""
    section, leaf = field(base, key, flag)
    kind = section.get_type(leaf)
    if kind not in TYPES:
        who = "a grid" if flag == "--grid" else flag
        raise ValueError(f"{flag} {key}: config.{key} holds a {kind.__name__}, which {who} "
                         "cannot set; valid: keys holding a bool, int, float or str")
    return kind


def parse_grid(specs: Sequence[str], base: ConfigDict, flag: str = "--grid") -> list[GridAxis]:
    """['loss.kl_coef=0,0.001', ...] -> [('loss.kl_coef', (0.0, 0.001)), ...], each value typed
    like `base`'s field (parse_value). Raises ValueError naming an unknown key, a repeated
    key, a key that may not be swept or a value of the wrong type."""
    grid: list[GridAxis] = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise ValueError(f"{flag} {spec!r}: expected KEY=VALUE[,VALUE...], e.g. "
                             "filter.keep_ratio=0.25,1.0")
        if key in NOT_SWEPT:
            raise ValueError(f"{flag} {spec!r}: {key!r} cannot be swept"
                             f"{' (use --seeds)' if key == 'seed' else ''}")
        if any(key == k for k, _ in grid):
            raise ValueError(f"{flag} {spec!r}: key {key!r} is given twice")
        kind = key_type(base, key, flag)
        try:
            parsed = tuple(parse_value(v, kind) for v in values.split(","))
        except ValueError as error:
            raise ValueError(f"{flag} {key}: {error} (that of config.{key})") from None
        if len(set(map(repr, parsed))) != len(parsed):
            raise ValueError(f"{flag} {spec!r}: a value is repeated")
        grid.append((key, parsed))
    return grid


def parse_overrides(specs: Sequence[str], base: ConfigDict, flag: str = "--set") -> dict[str, Any]:
    """['model.source=/m', ...] -> {'model.source': '/m', ...}: parse_grid's checks, one value
    per key; errors name `flag` (the command's own option)."""
    grid = parse_grid(specs, base, flag)
    for key, values in grid:
        if len(values) != 1:
            raise ValueError(f"{flag} {key}: one value, not {len(values)}")
    return {key: values[0] for key, values in grid}


class _FlagParser(flags.ArgumentParser):
    """absl's parser for a `--config.KEY=VALUE` field of one type, by parse_value."""

    def __init__(self, kind: type):
        self.kind = kind

    def parse(self, argument: Any) -> Any:
        return parse_value(argument, self.kind)

    def flag_type(self) -> str:
        return self.kind.__name__


def use_for_config_flags() -> None:
    """Makes ml_collections' config flags parse `--config.KEY=VALUE` of a bool, int, float or
    str key by parse_value (in this process: config_flags keeps one table of parsers by
    type), so that the command line reads a value as --set and --grid do ("None" included)."""
    for kind in TYPES:
        config_flags.register_flag_parser_for_type(kind, _FlagParser(kind))
