"""What the command-line scripts in experiments/ share: config file lookup and one-line errors.

    argv = resolve_config_arg(sys.argv, CONFIG_DIR)   # --config bandit_grpo.py -> configs/...
    run_app(_main, argv, config_dir=CONFIG_DIR)        # absl app; mistakes exit with 1 line

A script whose config can be checked without JAX parses its flags and checks them first
(parse_first), then imports the heavy stack and hands the parsed arguments to run_app.
"""

from __future__ import annotations

import ast
import contextlib
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

# The shipped config files (a source checkout's experiments/configs/): where a bare `--config
# NAME` resolves, and the configs the suites and the step-time advice name.
CONFIG_DIR = Path(__file__).resolve().parents[2] / "experiments" / "configs"


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


def config_path(argv: list[str]) -> str | None:
    """The file of the last `--config FILE[:arg]` / `--config=FILE[:arg]` in argv, if any."""
    found = None
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith("--config="):
            found = arg.split("=", 1)[1]
    return None if found is None else found.partition(":")[0]


def check_config_file(argv: list[str], config_dir: Path) -> None:
    """Raises ValueError, naming the file, if argv's --config file is missing, does not parse
    as Python, or defines no top-level get_config (the file is read, not run)."""
    path = config_path(argv)
    if path is None:
        return
    if not Path(path).is_file():
        names = ", ".join(sorted(p.name for p in config_dir.glob("*.py")))
        raise ValueError(f"config file {path!r} not found; valid: a path to a config file or "
                         f"a name in {config_dir}: {names}")
    try:
        tree = ast.parse(Path(path).read_text(), filename=path)
    except (SyntaxError, ValueError) as error:  # ValueError: a NUL byte in the file
        line = getattr(error, "lineno", None)
        raise ValueError(f"config file {path!r} is not valid Python"
                         f"{f' (line {line})' if line else ''}: {type(error).__name__}: "
                         f"{getattr(error, 'msg', error)}") from None
    if not any(isinstance(node, ast.FunctionDef) and node.name == "get_config"
               for node in tree.body):
        raise ValueError(f"config file {path!r} defines no get_config(); valid: a Python file "
                         "with `def get_config():` returning the config (see "
                         f"{config_dir / 'bandit_grpo.py'})")


def _raised_at(error: BaseException, path: str | None) -> int | None:
    """The line of the innermost frame of `error` in the file `path`, if any."""
    if path is None:
        return None
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if Path(f.filename).resolve() == Path(path).resolve()]
    return frames[-1].lineno if frames else None


def _config_failure(text: str, path: str) -> str:
    """One line from config_flags' report of a get_config() error (a traceback as text)."""
    last = [line for line in text.splitlines() if line.strip()][-1].strip()
    lines = [int(m.group(2)) for m in re.finditer(r'File "([^"]+)", line (\d+)', text)
             if Path(m.group(1)).resolve() == Path(path).resolve()]
    return f"error: config file {path!r} failed{f' at line {lines[-1]}' if lines else ''}: {last}"


def _resolve(value: str, config_dir: Path) -> str:
    path, sep, rest = value.partition(":")
    if not Path(path).exists() and (config_dir / path).exists():
        return str(config_dir / path) + sep + rest
    return value


class _UsageError(Exception):
    """absl's app.UsageError, out of app.run's reach (it would print the whole usage text)."""


def run_app(main: Callable[[list[str]], None], argv: list[str] | None = None,
            errors: tuple[type[Exception], ...] = (ValueError, FileNotFoundError),
            define_flags: Callable[[], None] | None = None,
            config_dir: Path | None = None, parsed: list[str] | None = None) -> None:
    """absl's app.run(main, argv), with the user's mistakes as one line on stderr and exit 1.

    `errors` (raised with a message naming the bad key, value or file) exit without a traceback;
    so do absl's usage errors (a missing or unexpected argument: one line, not the usage text)
    and an unknown `--config.a.b` override, which ml_collections' config_flags reports as a
    KeyError / AttributeError while the flags are parsed (afterwards those are bugs and raise).
    `define_flags`, if given, defines the flags inside the same guard (config_flags applies the
    overrides as the flag is defined). `config_dir`, for a script with a --config file flag:
    the file is checked first (`check_config_file`), and an exception its get_config() raises
    while the flags are parsed is reported as one line with the file and line. `parsed`: what
    parse_first returned (the flags are parsed and checked already; argv, define_flags and
    config_dir are then those given to it).
    """
    from absl import app

    def guarded(argv: list[str]) -> None:
        try:
            main(argv)
        except app.UsageError as error:
            raise _UsageError(f"{error} (--help lists the flags)") from error

    config_file = None if config_dir is None else config_path(argv or sys.argv)
    with _one_line(errors, config_file):
        if parsed is None:
            _define(argv, define_flags, config_dir)
        app.run(guarded, argv=argv, flags_parser=(
            (lambda _: parsed) if parsed is not None else
            (lambda args: _parse_flags(args, config_file))))


def parse_first(check: Callable[[], None], argv: list[str] | None = None,
                errors: tuple[type[Exception], ...] = (ValueError, FileNotFoundError),
                define_flags: Callable[[], None] | None = None,
                config_dir: Path | None = None) -> list[str]:
    """run_app's parsing, for a script to call before it imports JAX, jumanji and flax (seconds):
    defines and parses the flags as run_app does, then calls `check()` (the flags' config
    checked without JAX, e.g. run_config.check_config), each mistake the one `error:` line
    run_app prints. Returns the arguments left, for run_app(..., parsed=...)."""
    from absl import app

    config_file = None if config_dir is None else config_path(argv or sys.argv)
    with _one_line(errors, config_file):
        _define(argv, define_flags, config_dir)
        app.define_help_flags()  # app.run's own (--help, --helpshort), defined once
        rest = _parse_flags(argv or sys.argv, config_file)
        check()
    return rest


def _define(argv: list[str] | None, define_flags: Callable[[], None] | None,
            config_dir: Path | None) -> None:
    from starpo_jax.run.overrides import use_for_config_flags

    use_for_config_flags()  # --config.KEY=VALUE read as --set and --grid read it
    if config_dir is not None:
        check_config_file(argv or sys.argv, config_dir)
    if define_flags is not None:
        define_flags()


def _parse_flags(args: list[str], config_file: str | None) -> list[str]:
    """absl's parse_flags_with_usage, but each mistake is one `error:` line like every other
    bad value (absl's own is a two-line FATAL message; a get_config() TypeError / ValueError,
    which config_flags reports with its whole traceback, is one line too)."""
    from absl import flags

    try:
        return flags.FLAGS(args)
    except flags.Error as error:
        text = str(error)
        if config_file and "Error whilst parsing config file" in text:
            sys.exit(_config_failure(text, config_file))
        sys.exit(f"error: {text} (--helpshort lists the flags)")


@contextlib.contextmanager
def _one_line(errors: tuple[type[Exception], ...], config_file: str | None) -> Iterator[None]:
    """The user's mistakes raised inside, as one `error:` line and exit 1 (see run_app)."""
    from absl import flags

    try:
        yield
    except (*errors, _UsageError) as error:
        sys.exit(f"error: {error}")
    except Exception as error:
        if flags.FLAGS.is_parsed():
            raise  # after parsing: a bug, with its traceback
        if line := _raised_at(error, config_file):
            sys.exit(f"error: config file {config_file!r} failed at line {line}: "
                     f"{type(error).__name__}: {error}")
        if not isinstance(error, (KeyError, AttributeError)):
            raise
        detail = str(error.args[0]).strip("'").replace("\\n", " ").replace("\\'", "'")
        sys.exit(f"error: unknown --config override key: {detail}")
