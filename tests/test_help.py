"""The scripts' --help pages are a user's: usage line, examples, every flag the script defines,
the shipped configs it takes (each with its docstring's one-line summary), the keys changed
most often with their real defaults and where the whole key table lives; status 0, printed
before JAX loads. Every shipped config has a one-line summary that the pages show."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from starpo_jax.run import cli
from starpo_jax.run.cli import CONFIG_DIR
from starpo_jax.run.schema import default_config

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
# Runs a script as `python experiments/<script>` does; prints at exit which of the heavy
# modules were imported by then.
_AT_EXIT = ("import atexit, runpy, sys; atexit.register(lambda: print('imported:', sorted("
            "m for m in ('jax', 'jumanji', 'flax') if m in sys.modules), file=sys.stderr)); "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
CONFIGS = sorted(CONFIG_DIR.glob("*.py"))


def _page(script: str, *argv: str) -> str:
    """The help page `script` prints for argv: status 0, nothing else on stderr, no JAX."""
    done = subprocess.run([sys.executable, "-c", _AT_EXIT, str(EXPERIMENTS / script), *argv],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.strip() == "imported: []", done.stderr[-2000:]
    assert done.stdout.startswith(f"usage: python experiments/{script} "), done.stdout[:500]
    return done.stdout


def _defined_flags(script: str) -> list[str]:
    """The flags the script defines (flags.DEFINE_* / config_flags.DEFINE_*), by name."""
    tree = ast.parse((EXPERIMENTS / script).read_text())
    return [node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr.startswith("DEFINE_") and node.args
            and isinstance(node.args[0], ast.Constant)]


def _table(page: str, heading: str) -> dict[str, str]:
    """The rows of the page's table under the line starting with `heading`: first column ->
    the rest of the row."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading)) + 1
    rows = {}
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        first, _, rest = line.strip().partition("  ")
        rows[first] = rest.strip()
    return rows


def _summary(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())).split("\n")[0]


@pytest.mark.parametrize("script, flag", [
    ("run.py", "--help"), ("run.py", "--helpshort"), ("run.py", "-h"), ("sft.py", "--help"),
    ("evaluate.py", "--helpshort"), ("sweep.py", "--help")])
def test_help_is_a_users_page(script, flag):
    page = _page(script, flag)
    assert page == _page(script, "--config.steps=nope", flag, "--workdir="), (
        "the page comes first, whatever else is on the command line")
    assert "\\\n" not in page.replace(" \\\n    ", ""), "no mangled continuation lines"
    for name in _defined_flags(script):
        shown = {"vmap": "--no-vmap", "config": "--config"}.get(name, f"--{name}")
        assert shown in page, f"{script}'s --{name} is not on its help page"
    for doc in re.findall(r"docs/[\w-]+\.md", page):
        assert (ROOT / doc).is_file(), doc
    assert "starpo_jax." not in page and "_main" not in page, "no developer names"
    if script in ("run.py", "sft.py", "sweep.py"):
        configs = _table(page, "shipped configs")
        sft = script == "sft.py"
        assert configs == {p.stem: _summary(p) for p in CONFIGS
                           if ("sft" in p.stem.split("_")) == sft}
        assert "quickstart" in configs or sft
    if script in ("run.py", "sft.py"):
        assert "docs/configuration.md" in page
        assert "(default: runs/<config name>" in page


def test_the_run_page_lists_the_most_used_keys_with_their_defaults():
    page = _page("run.py", "--help")
    keys = _table(page, "most used keys")
    config = default_config()
    assert list(keys) == [key for key, _ in cli.COMMON_KEYS]
    for key in ("steps", "seed", "algo", "model.source", "model.init_from", "rollout.groups",
                "rollout.group_size", "optim.actor_lr", "lora.rank", "eval_every"):
        value = config
        for part in key.split("."):
            value = value[part]
        shown = keys[key].split("  ")[0]
        expected = {"": '""'}.get(value, f"{value:g}" if isinstance(value, float) else str(value))
        assert shown == expected, (key, shown, value)
    assert keys["steps"].startswith("200 ") and keys["optim.actor_lr"].startswith("1e-06 ")


def test_the_sft_page_s_defaults_are_the_sft_section_s():
    """sft.py's SFT_KEYS against starpo_jax.run.sft.SFT_DEFAULTS and POLICY_NAMES, read from
    the sources (importing them loads JAX)."""
    def constant(path: Path, name: str):
        tree = ast.parse(path.read_text())
        return next(ast.literal_eval(node.value) for node in tree.body
                    if isinstance(node, ast.Assign) and node.targets[0].id == name)

    defaults = constant(ROOT / "starpo_jax" / "run" / "sft.py", "SFT_DEFAULTS")
    policies = constant(ROOT / "starpo_jax" / "rollout" / "policies.py", "POLICY_NAMES")
    keys = _table(_page("sft.py", "--help"), "most used keys")
    for name, value in defaults.items():
        shown = '""' if value == "" else str(value)
        assert keys[f"sft.{name}"].split("  ")[0] == shown, name
    assert f"{', '.join(policies[:-1])} or {policies[-1]}" in keys["sft.policy"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_has_a_one_line_summary(path):
    doc = ast.get_docstring(ast.parse(path.read_text()))
    first, _, rest = doc.partition("\n")
    assert first.endswith(".") and 20 <= len(first) <= 80, first
    assert rest == "" or rest.startswith("\n"), "the summary is its own paragraph"
    imports_sft = "from starpo_jax.run.sft import" in path.read_text()
    assert imports_sft == ("sft" in path.stem.split("_")), "listed on the right script's page"


def test_help_through_run_app_exits_0_before_main():
    called = []
    with pytest.raises(SystemExit) as exit_:
        cli.run_app(called.append, ["x.py", "--config", "missing.py", "-h"],
                    usage=lambda: "usage: x\n", config_dir=CONFIG_DIR)
    assert exit_.value.code == 0 and not called
    assert cli.wants_help(["x.py", "--helpshort"]) and not cli.wants_help(["x.py", "--", "-h"])
