"""What the command-line scripts in experiments/ share: config file lookup, one-line errors, the
help page and the workdir's default and early checks.

    argv = resolve_config_arg(sys.argv, CONFIG_DIR)   # --config quickstart -> configs/...
    run_app(_main, argv, config_dir=CONFIG_DIR)        # absl app; mistakes exit with 1 line

A script whose config can be checked without JAX parses its flags and checks them first
(parse_first), then imports the heavy stack and hands the parsed arguments to run_app. With
`usage`, --help / --helpshort (-h) print that page and exit 0 before anything else; with
`workdir=True`, --workdir (default: runs/<config name>) and --resume are read from the
arguments and checked (workdir.check_workdir) before the flags are parsed, since parsing them
loads the config file, which may import JAX.
"""

from __future__ import annotations

import ast
import contextlib
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# The shipped config files (a source checkout's experiments/configs/): where a bare `--config
# NAME` resolves, and the configs the suites and the step-time advice name.
CONFIG_DIR = Path(__file__).resolve().parents[2] / "experiments" / "configs"
# Where a run writes without --workdir: runs/<config name> in the current directory.
RUNS_DIR = "runs"
HELP_FLAGS = ("--help", "-help", "--helpshort", "-helpshort", "-h", "-?")
# The keys a newcomer changes first, for the help page (their defaults: schema.default_config;
# every key: docs/configuration.md).
COMMON_KEYS = (
    ("steps", "training steps (iterations)"),
    ("seed", "the run's seed"),
    ("algo", "ppo (with a critic) or grpo (without)"),
    ("env.name", "the env: bandit, sokoban, frozen_lake, ..."),
    ("model.source", "the model: a name, a Hugging Face directory, a .gguf"),
    ("model.init_from", "start from the policy of this workdir (e.g. sft.py's)"),
    ("rollout.groups", "initial states per step"),
    ("rollout.group_size", "rollouts per initial state"),
    ("rollout.reply_tokens", "the most tokens a reply may have"),
    ("nothink", "True: replies start with <answer>, no thinking"),
    ("vanilla", "True: vanilla StarPO (KL, symmetric clip, no filter)"),
    ("filter.keep_ratio", "share of the groups trained on (1.0: all)"),
    ("optim.actor_lr", "the policy's learning rate"),
    ("lora.rank", "LoRA adapters' rank (0: train every weight)"),
    ("eval_every", "evaluate every that many steps and at the end (0: never)"),
    ("checkpoint_every", "save every that many steps and at the end"),
)


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
    """A config file that does not exist here, looked up in `config_dir`, `.py` optional."""
    path, sep, rest = value.partition(":")
    if path and not Path(path).exists():
        for name in (path, path + ".py"):
            if (config_dir / name).is_file():
                return str(config_dir / name) + sep + rest
    return value


def load_config(name: str, config_dir: Path = CONFIG_DIR) -> Any:
    """get_config() of a shipped config file: <config_dir>/<name> (".py" optional)."""
    import importlib.util

    path = config_dir / (name if name.endswith(".py") else f"{name}.py")
    if not path.is_file():
        shipped = ", ".join(sorted(p.name for p in config_dir.glob("*.py")))
        raise FileNotFoundError(f"no config file {path}; the shipped ones: {shipped}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def default_workdir(config_file: str) -> str:
    """runs/<config name>: where a run of `config_file` writes without --workdir (relative to
    the current directory)."""
    return str(Path(RUNS_DIR) / Path(config_file.partition(":")[0]).stem)


def workdir_arg(argv: list[str]) -> tuple[str | None, bool, bool]:
    """(the workdir, resume, whether the workdir is the default) that argv gives, read without
    parsing the other flags (which loads the config file): --workdir as absl reads it, else
    default_workdir of the --config file (None without one). Raises app.UsageError for an
    empty --workdir; (None, False, False) when --workdir or --resume does not parse (the
    flags' own parse reports it)."""
    from absl import app, flags

    values = flags.FlagValues()
    flags.DEFINE_string("workdir", None, "", flag_values=values)
    flags.DEFINE_bool("resume", False, "", flag_values=values)
    try:
        values(list(argv), known_only=True)
    except flags.Error:
        return None, False, False
    if values["workdir"].present:
        if not values.workdir:
            config = config_path(argv)
            default = default_workdir(config) if config else f"{RUNS_DIR}/<config name>"
            raise app.UsageError(f"--workdir is empty: pass a directory, or leave it out for "
                                 f"{default} (the default)")
        return values.workdir, values.resume, False
    config = config_path(argv)
    return (default_workdir(config) if config else None), values.resume, True


def check_workdir_arg(argv: list[str]) -> None:
    """workdir.check_workdir on what workdir_arg reads from argv (nothing without a workdir):
    a wrong workdir is one line before the config file is loaded."""
    from starpo_jax.run.workdir import check_workdir

    workdir, resume, _ = workdir_arg(argv)
    if workdir is not None:
        # Only process 0 of a multi-process run (which loads JAX first) takes the lock.
        jax = sys.modules.get("jax")
        check_workdir(Path(workdir), resume, lock=jax is None or jax.process_index() == 0)


def wants_help(argv: list[str]) -> bool:
    """Whether argv asks for the help page (--help, --helpshort, -h; not after `--`)."""
    args = argv[1:]
    return any(arg in HELP_FLAGS for arg in args[: args.index("--") if "--" in args else None])


#: The flags of the training scripts (run.py, sft.py), as their help pages list them.
TRAIN_FLAGS = [
    ("--config CONFIG", "a config file, or a shipped config's name (below; .py optional)"),
    ("--workdir DIR", f"where the run writes (default: {RUNS_DIR}/<config name> in the "
                      "current directory)"),
    ("--resume", "continue the run in the workdir from its newest checkpoint"),
    ("--config.KEY=VALUE", "set a config key (any key, repeat for more; below)"),
    ("--help, --helpshort", "this page")]


def shipped_configs(config_dir: Path, sft: bool) -> list[tuple[str, str]]:
    """(name, the first line of its docstring) of each config file in `config_dir`: the SFT
    ones (experiments/sft.py's, named *sft*) or the others (run.py's)."""
    out = []
    for path in sorted(config_dir.glob("*.py")):
        if ("sft" in path.stem.split("_")) != sft:
            continue
        try:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        except (SyntaxError, ValueError, OSError):
            doc = ""
        out.append((path.stem, doc.strip().split("\n")[0]))
    return out


def _show(value: object) -> str:
    if isinstance(value, str):
        return '""' if value == "" else value
    return f"{value:g}" if isinstance(value, float) else str(value)


def help_page(usage: str, about: str, examples: list[str], flag_lines: list[tuple[str, str]],
              configs: list[tuple[str, str]] | None = None,
              keys: list[tuple[str, ...]] | None = None, more: str = "",
              keys_title: str = "most used keys (--config.KEY=VALUE; the default, which a "
                                "config file may set otherwise):") -> str:
    """A script's --help page: its usage line, what it does, examples, its flags, the shipped
    configs it takes (name and first docstring line) and, under `keys_title`, the keys most
    often changed (name, default, meaning)."""
    def table(rows: list[tuple[str, ...]]) -> list[str]:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1]
                for row in rows]

    lines = [f"usage: {usage}", "", about, "", *(f"  {e}" for e in examples), "", "flags:",
             *table(flag_lines)]
    if configs:
        lines += ["", "shipped configs (experiments/configs/, --config NAME):", *table(configs)]
    if keys:
        lines += ["", keys_title, *table(keys)]
    return "\n".join(lines + (["", more] if more else [])) + "\n"


def common_keys() -> list[tuple[str, str, str]]:
    """COMMON_KEYS as (key, its default in schema.default_config, meaning)."""
    from starpo_jax.run.schema import default_config

    config = default_config()
    rows = []
    for key, meaning in COMMON_KEYS:
        value = config
        for part in key.split("."):
            value = value[part]
        rows.append((key, _show(value), meaning))
    return rows


def show_help(argv: list[str], usage: Callable[[], str] | None) -> None:
    """Prints usage() and exits 0 when argv asks for help (wants_help); else does nothing."""
    if usage is not None and wants_help(argv):
        sys.stdout.write(usage())
        sys.stdout.flush()
        sys.exit(0)


class _UsageError(Exception):
    """absl's app.UsageError, out of app.run's reach (it would print the whole usage text)."""


def run_app(main: Callable[[list[str]], None], argv: list[str] | None = None,
            errors: tuple[type[Exception], ...] = (ValueError, FileNotFoundError),
            define_flags: Callable[[], None] | None = None,
            config_dir: Path | None = None, parsed: list[str] | None = None,
            usage: Callable[[], str] | None = None, workdir: bool = False) -> None:
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
    config_dir are then those given to it). `usage`: the help page's text (help_page), printed
    for --help / --helpshort / -h, exit 0. `workdir`: the script's --workdir (default
    runs/<config name>) and --resume are checked before the flags are parsed
    (check_workdir_arg).
    """
    from absl import app

    def guarded(argv: list[str]) -> None:
        try:
            main(argv)
        except app.UsageError as error:
            raise _UsageError(f"{error} (--help lists the flags)") from error

    config_file = None if config_dir is None else config_path(argv or sys.argv)
    with _one_line(errors, config_file, argv or sys.argv):
        if parsed is None:
            _define(argv, define_flags, config_dir, usage, workdir)
        app.run(guarded, argv=argv, flags_parser=(
            (lambda _: parsed) if parsed is not None else
            (lambda args: _parse_flags(args, config_file))))


def parse_first(check: Callable[[], None], argv: list[str] | None = None,
                errors: tuple[type[Exception], ...] = (ValueError, FileNotFoundError),
                define_flags: Callable[[], None] | None = None,
                config_dir: Path | None = None, usage: Callable[[], str] | None = None,
                workdir: bool = False) -> list[str]:
    """run_app's parsing, for a script to call before it imports JAX, jumanji and flax (seconds):
    shows the help page or checks the workdir as run_app does (`usage`, `workdir`), defines and
    parses the flags, then calls `check()` (the flags' config checked without JAX, e.g.
    run_config.check_config), each mistake the one `error:` line run_app prints. Returns the
    arguments left, for run_app(..., parsed=...)."""
    from absl import app

    config_file = None if config_dir is None else config_path(argv or sys.argv)
    with _one_line(errors, config_file, argv or sys.argv):
        _define(argv, define_flags, config_dir, usage, workdir)
        app.define_help_flags()  # app.run's own (--help, --helpshort), defined once
        rest = _parse_flags(argv or sys.argv, config_file)
        check()
    return rest


def _define(argv: list[str] | None, define_flags: Callable[[], None] | None,
            config_dir: Path | None, usage: Callable[[], str] | None = None,
            workdir: bool = False) -> None:
    from starpo_jax.run.overrides import use_for_config_flags

    show_help(argv or sys.argv, usage)  # first: the page, whatever else argv holds
    use_for_config_flags()  # --config.KEY=VALUE read as --set and --grid read it
    if config_dir is not None:
        check_config_file(argv or sys.argv, config_dir)
    if workdir:
        check_workdir_arg(argv or sys.argv)
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
def _one_line(errors: tuple[type[Exception], ...], config_file: str | None,
              argv: list[str]) -> Iterator[None]:
    """The user's mistakes raised inside, as one `error:` line and exit 1 (see run_app)."""
    from absl import app, flags

    try:
        yield
    except (*errors, _UsageError) as error:
        sys.exit(f"error: {error}")
    except app.UsageError as error:  # parse_first's (run_app's own are _UsageError)
        sys.exit(f"error: {error} (--help lists the flags)")
    except Exception as error:
        if flags.FLAGS.is_parsed():
            raise  # after parsing: a bug, with its traceback
        if line := _raised_at(error, config_file):
            sys.exit(f"error: config file {config_file!r} failed at line {line}: "
                     f"{type(error).__name__}: {error}")
        if not isinstance(error, (KeyError, AttributeError)):
            raise
        sys.exit(f"error: {_unknown_override(str(error.args[0]), argv)}")


def _unknown_override(detail: str, argv: list[str]) -> str:
    """config_flags' report of an unknown `--config.a.b` key ("'b'" and, on its own line,
    `Did you mean "c" instead of "b"?`) as one line naming the whole key as given, worded as
    the schema's unknown keys are: "...: 'a.b' (did you mean 'a.c'?)"."""
    detail = detail.replace("\\n", "\n").replace("\\'", "'")
    name, _, rest = detail.partition("\n")
    name = name.strip().strip("'\"")
    full = name
    for arg in argv:  # the --config.<key> that holds the unknown part, as the user wrote it
        if arg.startswith("--config.") and name in (parts := arg[9:].split("=")[0].split(".")):
            full = ".".join(parts[: parts.index(name) + 1])
    close = re.search(r'Did you mean "([^"]+)" instead of', rest)
    if close:
        hint = full.rpartition(".")[0] + "." if "." in full else ""
        return f"unknown --config override key: {full!r} (did you mean {hint + close[1]!r}?)"
    rest = " ".join(rest.split())
    return f"unknown --config override key: {full!r}" + (f" ({rest})" if rest else "")
