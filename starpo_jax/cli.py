"""What the command-line scripts in experiments/ share: config file lookup and one-line errors.

    argv = resolve_config_arg(sys.argv, CONFIG_DIR)   # --config bandit_grpo.py -> configs/...
    run_app(_main, argv)                               # absl app; config mistakes exit with 1 line
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path


def resolve_config_arg(argv: list[str], config_dir: Path) -> list[str]:
    """Rewrites `--config NAME[:arg]` / `--config=NAME[:arg]` so that a bare file name that does
    not exist here points into `config_dir`; every other argument is kept as it is."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--config" and i + 1 < len(out):
            out[i + 1] = _resolve(out[i + 1], config_dir)
        elif arg.startswith("--config="):
            out[i] = "--config=" + _resolve(arg.split("=", 1)[1], config_dir)
    return out


def _resolve(value: str, config_dir: Path) -> str:
    path, sep, rest = value.partition(":")
    if not Path(path).exists() and (config_dir / path).exists():
        return str(config_dir / path) + sep + rest
    return value


def run_app(main: Callable[[list[str]], None], argv: list[str] | None = None,
            errors: tuple[type[Exception], ...] = (ValueError,),
            define_flags: Callable[[], None] | None = None) -> None:
    """absl's app.run(main, argv), with the user's mistakes as one line on stderr and exit 1.

    `errors` (raised with a message naming the bad key or value) exit without a traceback; so
    does an unknown `--config.a.b` override, which ml_collections' config_flags reports as a
    KeyError / AttributeError while the flags are parsed (afterwards those are bugs and raise).
    `define_flags`, if given, defines the flags inside the same guard (config_flags applies the
    overrides as the flag is defined).
    """
    from absl import app, flags

    try:
        if define_flags is not None:
            define_flags()
        app.run(main, argv=argv)
    except errors as error:
        sys.exit(f"error: {error}")
    except (KeyError, AttributeError) as error:
        if flags.FLAGS.is_parsed():
            raise
        detail = str(error.args[0]).strip("'").replace("\\n", " ").replace("\\'", "'")
        sys.exit(f"error: unknown --config override key: {detail}")
