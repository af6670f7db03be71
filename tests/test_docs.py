"""The documentation cannot drift from the code: the shell and Python blocks of README.md and
docs/quickstart.md run as written, in order (the tiny random model in place of SmolLM2, the
default model), the quickstart's expected console line has the run's shape, install commands
name extras that exist, the development page's test commands are CI's, and every relative
link (and #anchor) in README.md and docs/ resolves, and docs/configuration.md's tables name
every key of the config schema and no other."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
QUICKSTART = ROOT / "docs" / "quickstart.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
TINY = "--config.model.source=tiny-random"
# Run before a Python block: configs made by config_for / default_config name the tiny model.
TINY_PRELUDE = """\
import starpo_jax.run.schema as _run_config
_default_config = _run_config.default_config
def _tiny_default_config():
    config = _default_config()
    config.model.source = "tiny-random"
    return config
_run_config.default_config = _tiny_default_config
"""
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def blocks(path: Path) -> list[tuple[str, str]]:
    """(language, text) of each fenced block of `path`, in order."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(path.read_text())]


def shell_commands(text: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments and blanks dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def _install(command: str) -> bool:
    return command.startswith(("pip ", "python3 -m venv"))


def _tests(command: str) -> bool:
    """The test command: checked against CI's (test_the_test_commands_are_ci_s), not run
    from inside the tests."""
    return command.startswith("python -m pytest")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # http(s):, mailto:
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading #{anchor} in {path.name}")
    assert not broken, f"{page.name}: {broken}"


def test_the_docs_pages_are_linked_from_the_readme_or_another_page():
    linked = {(page.parent / t.partition("#")[0]).resolve() for page in PAGES
              for t in LINK.findall(page.read_text()) if t.partition("#")[0]}
    assert {p for p in PAGES if p != README} <= linked


def test_the_readme_stays_short():
    """The README is for users (what it is, install, the quickstart, links); the rest is in
    docs/."""
    assert len(README.read_text().splitlines()) <= 200


def test_install_commands_name_what_exists():
    """The install blocks are not run (they download); what they name is checked instead: the
    extras exist in pyproject.toml, jax is a dependency, and the embedded model's wheel is
    the one the code fetches."""
    from starpo_jax.models.embedded import WHEEL_REQUIREMENT

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    installs = [c for page in (README, QUICKSTART) for lang, text in blocks(page)
                if lang == "bash" for c in shell_commands(text) if _install(c)]
    assert installs, "the README says how to install"
    for command in installs:
        for name in re.findall(r'"\.\[([\w,]+)\]"', command):
            assert set(name.split(",")) <= extras, command
        if '"jax[' in command:
            assert any(d.startswith("jax") for d in project["dependencies"]), command
    assert WHEEL_REQUIREMENT in README.read_text()


def table_keys(text: str) -> set[str]:
    """The config keys the key column of a page's tables names: `section.key` names that key
    and makes `section` the row's section for the bare names after it (`clip_high`),
    `section.*` names the whole section, a bare name before any dotted one a top-level key."""
    keys = set()
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        section = ""
        for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
            if "." in name:
                section = name.partition(".")[0]
                keys.add(name)
            else:
                keys.add(f"{section}.{name}" if section else name)
    return keys


def flat_keys(config, prefix: str = "") -> set[str]:
    """Leaf keys, dotted; a section of the user's keys (schema.FREE_FORM, e.g. env.kwargs) is
    one key."""
    from starpo_jax.run.schema import FREE_FORM

    return {key for name, value in config.items()
            for key in (flat_keys(value, f"{prefix}{name}.")
                        if hasattr(value, "keys") and prefix + name not in FREE_FORM
                        else {prefix + name})}


def test_the_configuration_page_tables_every_key_of_the_schema_and_no_other():
    from starpo_jax.run.schema import default_config

    schema = flat_keys(default_config())
    named = table_keys((ROOT / "docs" / "configuration.md").read_text())
    whole = {key[:-2] for key in named if key.endswith(".*")}
    assert whole <= {key.partition(".")[0] for key in schema}, whole
    missing = sorted(key for key in schema if key not in named
                     and key.partition(".")[0] not in whole)
    unknown = sorted(key for key in named if not key.endswith(".*") and key not in schema)
    assert not missing, f"docs/configuration.md's tables lack {missing}"
    assert not unknown, f"docs/configuration.md's tables name keys the schema lacks: {unknown}"
    assert table_keys("| `loss.clip_low`, `agg` | x |\n| `seed`, `eval.*` | y |") == {
        "loss.clip_low", "loss.agg", "seed", "eval.*"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_of_every_page_names_what_exists(page):
    """The pages' blocks not run here still parse (Python) and name scripts and config files
    that exist (shell)."""
    for lang, text in blocks(page):
        if lang == "python":
            compile(text, f"{page.name} block", "exec")
        elif lang == "bash":
            for command in shell_commands(text):
                for script in re.findall(r"(?:^|\s)(experiments/\S+\.py)", command):
                    assert (ROOT / script).is_file(), command
                for name in re.findall(r"--config[ =](\S+\.py)", command):
                    assert (ROOT / "experiments" / "configs" / name).is_file(), command


@pytest.mark.parametrize("page", [README, ROOT / "docs" / "development.md"],
                         ids=["README.md", "development.md"])
def test_the_test_commands_are_ci_s(page):
    ci = (ROOT / ".ci" / "run").read_text()
    fast = [c for lang, text in blocks(page) for c in shell_commands(text) if "not slow" in c]
    assert fast and all(c in ci for c in fast)


def test_the_serial_command_imports_only_files_that_mark_serial(tmp_path):
    """CI's second command (-m "serial and not slow") skips test files with no serial mark
    (tests/conftest.py); every other selection collects every file."""
    import conftest

    class Config:
        def __init__(self, expr: str):
            self.expr = expr

        def getoption(self, name: str, default=None):
            assert name == "markexpr"
            return self.expr

    marked, plain = tmp_path / "test_marked.py", tmp_path / "test_plain.py"
    marked.write_text("import pytest\n\n\n@pytest.mark.serial\ndef test_a():\n    pass\n")
    plain.write_text("def test_b():\n    pass\n")
    assert conftest.pytest_ignore_collect(plain, Config("serial and not slow")) is True
    assert conftest.pytest_ignore_collect(plain, Config("serial")) is True
    assert conftest.pytest_ignore_collect(marked, Config("serial and not slow")) is None
    for expr in ("not serial and not slow", "", "slow", "serial or slow", "optimized"):
        assert conftest.pytest_ignore_collect(plain, Config(expr)) is None, expr
    assert conftest.pytest_ignore_collect(tmp_path / "notes.txt", Config("serial")) is None


def test_the_readme_quickstart_command_is_the_quickstart_page_s():
    def runs(page: Path) -> list[str]:
        return [c for lang, text in blocks(page) if lang == "bash"
                for c in shell_commands(text) if "experiments/run.py" in c]
    assert runs(README)[0] == runs(QUICKSTART)[0]


def _environment() -> dict[str, str]:
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1"}


def _run_shell(command: str, cwd: Path) -> str:
    """One documented command in `cwd`: `python experiments/X.py` with this interpreter and
    the repository's script, run.py and sft.py on the tiny model. Returns its stdout."""
    argv = shlex.split(command)
    assert argv[0] == "python" and argv[1].startswith("experiments/"), command
    argv = [sys.executable, str(ROOT / argv[1]), *argv[2:]]
    if Path(argv[1]).name in ("run.py", "sft.py"):
        argv.append(TINY)
    done = subprocess.run(argv, cwd=cwd, env=_environment(), capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _run_python(code: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-c", TINY_PRELUDE + code], cwd=cwd,
                          env=_environment(), capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"{code}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _run_page(page: Path, cwd: Path) -> list[tuple[str, str, str]]:
    """Every shell and Python block of `page` in order in `cwd`: (language, block, stdout)."""
    out = []
    for lang, text in blocks(page):
        if lang == "bash":
            stdout = "".join(_run_shell(c, cwd) for c in shell_commands(text)
                             if not _install(c) and not _tests(c))
        elif lang == "python":
            stdout = _run_python(text, cwd)
        else:
            assert lang == "", f"{page.name}: a ```{lang} block the test does not run"
            continue
        out.append((lang, text, stdout))
    return out


def _trend(text: str) -> tuple[str, list[str]]:
    """The steps and metric names of a trend line ("trend, steps 1-5 -> 12-16: success ...")."""
    line = next(x for x in text.splitlines() if x.startswith("trend, steps"))
    steps, _, parts = line.partition(": ")
    return steps, [part.split()[0] for part in parts.split(", ")]


@pytest.mark.slow
@pytest.mark.parametrize("page", [README, QUICKSTART], ids=["README.md", "quickstart.md"])
def test_the_blocks_run_in_order(page, tmp_path):
    ran = _run_page(page, tmp_path)
    assert [lang for lang, _, _ in ran].count("python") >= 1
    first = next(stdout for lang, text, stdout in ran if "experiments/run.py" in text)
    # The expected output the page shows: the same steps and metrics (other numbers: tiny model),
    # on the line after `done in`.
    assert _trend(first) == _trend(page.read_text())
    lines = first.splitlines()
    trend_at = next(i for i, line in enumerate(lines) if line.startswith("trend, steps"))
    assert lines[trend_at - 1].startswith("done in ")
    workdir = tmp_path / "runs" / "quickstart"
    for name in ("config.json", "metrics.jsonl", "tensorboard", "checkpoints", "samples"):
        assert (workdir / name).exists(), name
