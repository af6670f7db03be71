"""Malformed configs, flags and model files through the real entry points (experiments/run.py,
evaluate.py, sweep.py, api.build): each gives one line on stderr, `error: ...` (a flag that
does not parse too, not absl's two-line FATAL message) naming the key or file and what is
valid, exit status 1 (the project's convention: cli.run_app), no traceback, and nothing
written. run.py's `main` runs in this process (absl's flags are reset between cases);
evaluate.py and sweep.py, which define flags of the same names, run once each in a subprocess
for their wiring and otherwise through the functions their `main` calls. Run as scripts, run.py,
evaluate.py and export.py report a bad config before they import JAX, flax or jumanji."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
from absl import flags  # noqa: E402

from starpo_jax import api  # noqa: E402
from starpo_jax.analysis import sweep as sweep_lib, sweep_run as sweep_runner  # noqa: E402
from starpo_jax.analysis.suite import load_config  # noqa: E402
from starpo_jax.run import loop as runner  # noqa: E402
from starpo_jax.models.embedded import embedded_gguf_path  # noqa: E402
from helpers.scripts import script  # noqa: E402
from helpers.tiny import tiny_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

CONFIG_NAMES = "bandit_grpo.py"  # part of the "what is valid" of a missing config file


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """Broken model files and config files, built once."""
    root = tmp_path_factory.mktemp("bad")
    gguf = embedded_gguf_path().read_bytes()
    (root / "header_cut.gguf").write_bytes(gguf[: 64 * 1024])  # ends inside the metadata
    (root / "data_cut.gguf").write_bytes(gguf[: 8 * 2**20])  # the tensors cut
    (root / "zip.gguf").write_bytes(b"PK\x03\x04 not a gguf")
    (root / "empty.gguf").write_bytes(b"")
    from starpo_jax.models import load_pretrained
    from starpo_jax.models.export import save_pretrained

    model, tok = load_pretrained("tiny-random")
    whole = save_pretrained(model, model.config, tok, root / "hf_whole")
    for name, drop in (("hf_no_weights", ["model.safetensors"]),
                       ("hf_no_config", ["config.json"]),
                       ("hf_no_tokenizer", ["tokenizer.json", "tokenizer_config.json",
                                            "special_tokens_map.json", "vocab.json",
                                            "merges.txt"])):
        shutil.copytree(whole, root / name)
        for file in drop:
            (root / name / file).unlink(missing_ok=True)
    for name, text in (("hf_bad_json", "{not json"),
                       ("hf_partial_config", '{"architectures": ["Qwen2ForCausalLM"]}'),
                       ("hf_bad_arch", '{"architectures": ["GPT2LMHeadModel"]}')):
        shutil.copytree(whole, root / name)
        (root / name / "config.json").write_text(text)
    shutil.copytree(whole, root / "hf_cut_weights")
    weights = root / "hf_cut_weights" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    configs = {
        "syntax.py": "def get_config(:\n",
        "no_get_config.py": "X = 1\n",
        "unknown_key.py": ("from starpo_jax.api import default_config\n\ndef get_config():\n"
                           "    c = default_config()\n    c.stepz = 3\n    return c\n"),
        "raises.py": "def get_config():\n    raise RuntimeError('broken on purpose')\n",
        "bad_type.py": ("from starpo_jax.api import default_config\n\ndef get_config():\n"
                        "    c = default_config()\n    c.rollout.groups = 'four'\n"
                        "    return c\n"),
    }
    for name, text in configs.items():
        (root / name).write_text(text)
    return root


def _run_main(argv: list[str]) -> tuple[int, str]:
    """experiments/run.py's main with `argv` in this process: (exit status, stderr)."""
    err, status = io.StringIO(), 0
    saved = sys.argv
    sys.argv = ["run.py", *argv]
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            script("run")["main"]()
    except SystemExit as exit_:
        if isinstance(exit_.code, str):  # sys.exit("error: ...") prints it and exits 1
            err.write(exit_.code + "\n")
            status = 1
        else:
            status = exit_.code or 0
    finally:
        sys.argv = saved
        flags.FLAGS.unparse_flags()
        for name in [n for n in flags.FLAGS if n.startswith("config.")]:
            delattr(flags.FLAGS, name)  # the overrides config_flags defined while parsing
    return status, err.getvalue()


def _one_line(stderr: str) -> str:
    """The error line: stderr must be exactly one, bar absl's `Pass --helpshort` hint."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    return lines[0]


# run.py: (extra argv after --config bandit_ppo.py unless it gives its own --config,
#          substrings of the error line). "{files}" is the fixture's directory.
RUN_CASES = [
    (["--config.steps=abc"], ["error: flag --config.steps=abc: 'abc' is not of type int"]),
    (["--config.steps=0"], ["config.steps = 0", "an int >= 1"]),
    (["--config.seed=-1"], ["config.seed = -1", "an int >= 0"]),
    (["--config.rollout.groups=0"], ["rollout.groups = 0", "an int >= 1"]),
    (["--config.rollout.temperature=-1"], ["rollout.temperature = -1", "(0.0, 100.0]"]),
    (["--config.rollout.top_p=1.5"], ["rollout.top_p = 1.5", "(0.0, 1.0]"]),
    (["--config.rollout.cache_dtype=int8"], ["rollout.cache_dtype = 'int8'", "bfloat16"]),
    (["--config.rollout.chunks=3"], ["rollout.chunks = 3", "a divisor of rollout.groups"]),
    (["--config.rollout.mode=nothink"], ["unknown --config override key", "mode"]),
    (["--config.filter.keep_ratio=0"], ["filter.keep_ratio = 0", "(0.0, 1.0]"]),
    (["--config.filter.mode=max"], ["filter.mode = 'max'", "std_rev"]),
    (["--config.loss.clip_hgh=0.3"], ["unknown --config override key", "clip_hgh"]),
    (["--config.loss.kl_kind=k9"], ["loss.kl_kind = 'k9'", "'k3'"]),
    (["--config.optim.actor_lr=nan"], ["optim.actor_lr = nan", "a number in (0.0, 10.0]"]),
    (["--config.optim.minibatch_rows=3"], ["optim.minibatch_rows = 3", "a divisor"]),
    (["--config.advantage.gamma=2"], ["advantage.gamma = 2", "[0.0, 1.0]"]),
    (["--config.algo=dpo"], ["config.algo = 'dpo'", "'grpo'"]),
    (["--config.nothink=maybe"], ["--config.nothink=maybe"]),
    (["--config.mesh.tp=0"], ["config.mesh.tp = 0", "an int >= 1"]),
    (["--config.env.name=chess"], ["config.env.name = 'chess'", "'sokoban'"]),
    (["--config.eval.envs=sokoban,chess"], ["eval.envs", "frozen_lake"]),
    (["--config.eval.episodes=0"], ["eval.episodes = 0", "an int >= 1"]),
    (["--config.monitor.enabled=3"], ["--config.monitor.enabled=3"]),
    (["--config.model.dtype=float16"], ["model.dtype = 'float16'", "'bfloat16'"]),
    (["--config.model.source=llama-7b"], ["model.source = 'llama-7b'", "'tiny-random'"]),
    (["--config.model.source={files}/missing.gguf"], ["missing.gguf'", "a .gguf file"]),
    (["--config.model.source="], ["model.source = ''", "'tiny-random'"]),
    (["--config.model.source={files}/header_cut.gguf"], ["header_cut.gguf", "truncated"]),
    (["--config.model.source={files}/data_cut.gguf"], ["data_cut.gguf", "truncated"]),
    (["--config.model.source={files}/zip.gguf"], ["zip.gguf", "not a GGUF file"]),
    (["--config.model.source={files}/empty.gguf"], ["empty.gguf", "not a GGUF file"]),
    (["--config.model.source={files}/hf_no_weights"], ["hf_no_weights", "model.safetensors"]),
    (["--config.model.source={files}/hf_no_config"], ["hf_no_config", "config.json"]),
    (["--config.model.source={files}/hf_bad_json"], ["hf_bad_json", "config.json"]),
    (["--config.model.source={files}/hf_partial_config"], ["config.json", "hidden_size"]),
    (["--config.model.source={files}/hf_bad_arch"], ["config.json", "GPT2LMHeadModel", "Qwen2"]),
    (["--config.model.source={files}/hf_cut_weights"], ["model.safetensors", "truncated"]),
    (["--config.model.source={files}/hf_no_tokenizer"], ["hf_no_tokenizer", "tokenizer.json"]),
    (["--config", "missing_config.py"], ["missing_config.py", CONFIG_NAMES]),
    (["--config", "{files}/syntax.py"], ["syntax.py", "SyntaxError"]),
    (["--config", "{files}/no_get_config.py"], ["no_get_config.py", "get_config"]),
    (["--config", "{files}/raises.py"], ["raises.py' failed at line 2", "broken on purpose"]),
    (["--config", "{files}/bad_type.py"], ["bad_type.py' failed at line 5", "'groups'", "int"]),
    (["--config", "{files}/unknown_key.py"], ["'stepz'", "did you mean 'steps'"]),
    (["--bogus"], ["bogus"]),
    (["extra"], ["unexpected arguments", "extra"]),
    (["--config="], ["config file ''", "not found", CONFIG_NAMES]),
    (["--workdir="], ["--workdir is empty", "leave it out for runs/bandit_ppo (the default)"]),
    (["--resume"], ["nothing to resume in ", "; run without --resume to start"]),
    (["--config.env.module=no_such_pkg.envs"],
     ["config.env.module = 'no_such_pkg.envs' is invalid", "No module named 'no_such_pkg'"]),
    (["--config.logging.wandb_project="], ["logging.wandb_project = ''", "a W&B project name"]),
    # A game the untrained model cannot answer: refused without its warm start (loop.run).
    (["--config", "frozen_lake_cpu.py"],
     ["config.model.init_from = ''", "`python experiments/sft.py --config frozen_lake_sft.py "
      "--workdir runs/frozen_lake_sft`", "`--config.model.init_from=runs/frozen_lake_sft`"]),
]


@pytest.mark.parametrize("argv, expected", RUN_CASES, ids=[" ".join(c[0]) for c in RUN_CASES])
def test_run_rejects(files, tmp_path, argv, expected):
    argv = [a.replace("{files}", str(files)) for a in argv]
    workdir = tmp_path / "w"
    if not any(a == "--config" or a.startswith("--config=") for a in argv):
        argv = ["--config", "bandit_ppo.py", *argv]
    if not any(a.startswith("--workdir") for a in argv):
        argv += ["--workdir", str(workdir)]
    status, stderr = _run_main(argv)
    assert status == 1, stderr
    line = _one_line(stderr)
    for text in expected:
        assert text.replace("{files}", str(files)) in line, line
    assert not workdir.exists(), "nothing is written before the config is valid"


def test_run_on_a_workdir_that_is_a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("not a directory")
    for resume in ([], ["--resume"]):
        status, stderr = _run_main(["--config", "bandit_ppo.py", "--workdir", str(path), *resume])
        assert status == 1
        assert _one_line(stderr) == (f"error: workdir {path} is a file, not a directory: pass "
                                     "another --workdir")
    assert path.read_text() == "not a directory"


def test_run_without_a_config(tmp_path):
    status, stderr = _run_main(["--workdir", str(tmp_path / "w")])
    assert status == 1
    assert "--config is required" in _one_line(stderr)


def _error_line(error: BaseException) -> str:
    """What cli.run_app prints for an error the script's main reports."""
    return _one_line(f"error: {error}\n")


# evaluate.py's main calls evaluate_workdir(workdir, step, overrides) and reports ValueError and
# FileNotFoundError: (workdir setup, overrides, substrings of the error line).
EVAL_CASES = [
    ("none", {}, ["config.json does not exist", "expected the --workdir of a run of "
                  "experiments/run.py"]),
    ("file", {}, ["is a file, not a directory", "expected the --workdir of a run"]),
    ("no_checkpoints", {}, ["checkpoints does not exist", "no checkpoint saved"]),
    ("bad_json", {}, ["config.json is not valid JSON", "experiments/run.py"]),
    ("hand_edited", {}, ["config.rollout.groups = 'four' is invalid", "an int"]),
    ("foreign_key", {}, ["unknown config key 'rollout.groupz'", "did you mean"]),
    ("ok", {"steps": 3}, ["only eval.* keys may be overridden", "['steps']"]),
    ("ok", {"eval.episodes": 0}, ["eval.episodes = 0 is invalid", "an int >= 1"]),
    ("ok", {"eval.modes": "greedy,best"}, ["eval.modes", "'sampled'"]),
    ("ok", {"eval.envs": "chess"}, ["eval.envs = 'chess'", "frozen_lake"]),
    ("ok", {"eval.epsiodes": 3}, ["unknown config key 'eval.epsiodes'", "'eval.episodes'"]),
    ("empty_checkpoints", {}, ["checkpoints holds no checkpoint"]),
]


@pytest.mark.parametrize("setup, overrides, expected", EVAL_CASES,
                         ids=[f"{c[0]}-{','.join(c[1])}" for c in EVAL_CASES])
def test_evaluate_rejects(tmp_path, setup, overrides, expected):
    config = tiny_config().to_dict()
    workdir = tmp_path / "file" if setup == "file" else tmp_path
    if setup == "file":
        workdir.write_text("")
    elif setup != "none":
        text = json.dumps(config)
        if setup == "bad_json":
            text = text[: len(text) // 2]
        elif setup == "hand_edited":
            text = text.replace('"groups": 2', '"groups": "four"')
        elif setup == "foreign_key":
            text = text.replace('"groups": 2', '"groupz": 2')
        (tmp_path / "config.json").write_text(text)
    if setup == "empty_checkpoints":
        (tmp_path / "checkpoints").mkdir()
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises((ValueError, FileNotFoundError)) as error:
        runner.evaluate_workdir(workdir, None, overrides)
    line = _error_line(error.value)
    for text in expected:
        assert text in line, line
    assert sorted(tmp_path.rglob("*")) == before, "nothing is written"


# sweep.py's main calls sweep(config, grid, seeds, workdir) and reports ValueError.
SWEEP_CASES = [
    (["model.source=tiny-random,llama-7b"], "0", ["model.source = 'llama-7b'", "'tiny-random'"]),
    (["env.name=bandit,chess"], "0", ["env.name = 'chess'", "'sokoban'"]),
    (["filter.keep_ratio=0.5,2"], "0", ["filter.keep_ratio = 2.0", "(0.0, 1.0]"]),
    (["rollout.groups=two"], "0", ["'two' is not of type int"]),
    (["filter.keep_ratio"], "0", ["expected KEY=VALUE", "filter.keep_ratio=0.25,1.0"]),
    (["seed=1,2"], "0", ["'seed' cannot be swept", "--seeds"]),
    ([], "0,-1", ["'-1' is not a seed", "ints >= 0"]),
]


@pytest.mark.parametrize("grid, seeds, expected", SWEEP_CASES,
                         ids=[" ".join(c[0]) + f" seeds={c[1]}" for c in SWEEP_CASES])
def test_sweep_rejects(tmp_path, grid, seeds, expected):
    def never_build(config):
        raise AssertionError("built before every setting was checked")

    with pytest.raises(ValueError) as error:
        sweep_runner.sweep(tiny_config(), grid, sweep_lib.parse_seeds(seeds), tmp_path,
                    build=never_build)
    line = _error_line(error.value)
    for text in expected:
        assert text in line, line
    assert not list(tmp_path.iterdir()), "nothing is written"


# api.build, the notebook entry point: a ConfigDict, a nested dict or a TrainConfig.
BUILD_CASES = [
    ({"steps": "ten"}, ["config.steps = 'ten' is invalid", "an int"]),
    ({"steps": 2.5}, ["config.steps = 2.5 is invalid", "an int"]),
    ({"nothink": "yes"}, ["config.nothink = 'yes' is invalid", "True or False"]),
    ({"loss": {"dual_clip": "x"}}, ["config.loss.dual_clip = 'x' is invalid", "a number"]),
    ({"rollout": 3}, ["config key 'rollout' = 3 must be a section", "'groups'"]),
    ({"rollout": {"group_size": 0}}, ["rollout.group_size = 0 is invalid", "an int >= 1"]),
    ({"rollout": {"groups": 4, "chunks": 3}}, ["rollout.chunks = 3", "a divisor"]),
    ({"model": {"source": 3}}, ["config.model.source = 3 is invalid", "a string"]),
    ({"modle": {}}, ["unknown config key 'modle'", "did you mean 'model'"]),
]


@pytest.mark.parametrize("change, expected", BUILD_CASES,
                         ids=[json.dumps(c[0]) for c in BUILD_CASES])
def test_build_rejects(change, expected):
    config = tiny_config().to_dict()
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key].update(value)
        else:
            config[key] = value
    with pytest.raises(ValueError) as error:
        api.build(config)
    line = _error_line(error.value)
    for text in expected:
        assert text in line, line


def test_build_with_a_train_config_rejects_unknown_top_keys():
    with pytest.raises(ValueError, match="unknown config key 'stepz'"):
        api.build(api.train_config(tiny_config()), stepz=3)


@pytest.mark.parametrize("script, argv, expected", [
    ("evaluate.py", ["--workdir", "{tmp}/none"], "config.json does not exist"),
    ("evaluate.py", ["--workdir", "{tmp}", "--config.eval.episodes=x"],
     "error: flag --config.eval.episodes=x"),
    ("sweep.py", ["--config", "missing.py", "--workdir", "{tmp}/s"],
     "config file 'missing.py' not found"),
    ("sweep.py", ["--config", "bandit_grpo.py", "--final_steps=0", "--workdir", "{tmp}/s"],
     "--final_steps=0: must be >= 1"),
])
def test_other_scripts_on_the_command_line(tmp_path, script, argv, expected):
    """The wiring of evaluate.py and sweep.py: one line, exit 1, no traceback (subprocesses)."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / script), *argv],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 1, done.stderr[-2000:]
    assert expected in _one_line(done.stderr)
    assert not list(tmp_path.iterdir()), "nothing is written"


# Run as scripts, the entry points parse and check the config before they import JAX, flax or
# jumanji (seconds): the error line comes first. `imported:` (stdout, at exit) lists those of
# them that were imported by then.
_AT_EXIT = ("import atexit, runpy, sys; atexit.register(lambda: print('imported:', sorted("
            "m for m in ('jax', 'jumanji', 'flax') if m in sys.modules))); "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


@pytest.mark.parametrize("script, argv, expected, heavy", [
    ("run.py", ["--config.steps=abc"], "error: flag --config.steps=abc: 'abc' is not of type int",
     []),
    ("run.py", ["--config.rollout.groups=0"], "rollout.groups = 0 is invalid", []),
    ("run.py", ["--config.env.name=sokobn"], "config.env.name = 'sokobn' is invalid", []),
    ("run.py", ["--config.stepz=1"], "unknown --config override key", []),
    ("evaluate.py", ["--workdir", "{tmp}/none"], "config.json does not exist", []),
    ("evaluate.py", ["--workdir", "{tmp}/run"], "config.steps = 0 is invalid", []),
    ("export.py", ["--workdir", "{tmp}/none", "--out", "{tmp}/out"],
     "config.json does not exist", []),
    # Deferred to train_config, after the heavy imports (a user's estimators come with JAX).
    ("run.py", ["--config.advantage.estimator=nope"], "advantage.estimator = 'nope'", ["jax"]),
])
def test_scripts_check_the_config_before_the_heavy_imports(tmp_path, script, argv, expected,
                                                           heavy):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"steps": 0}))
    if script == "run.py":
        argv = ["--config", "quickstart.py", *argv, "--workdir", "{tmp}/w"]
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    done = subprocess.run([sys.executable, "-c", _AT_EXIT, str(ROOT / "experiments" / script),
                           *argv], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 1, done.stderr[-2000:]
    assert expected in _one_line(done.stderr)
    imported = ast.literal_eval(done.stdout.split("imported:")[1].strip())
    assert imported == heavy if not heavy else set(heavy) <= set(imported)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"], "nothing is written"


WARM_STARTS = {"sokoban_cpu.py": "sokoban_sft.py", "frozen_lake_cpu.py": "frozen_lake_sft.py",
               "coord_sokoban_cpu.py": "coord_sokoban_sft.py",
               "coord_frozen_lake_cpu.py": "coord_frozen_lake_sft.py"}


@pytest.mark.parametrize("name", sorted(WARM_STARTS))
def test_a_game_the_untrained_model_cannot_answer_needs_its_warm_start(tmp_path, name):
    """The CPU configs of the grid games refuse RL from the untrained model (every reply
    invalid: minutes a step for nothing) before JAX is imported, in one line naming the SFT
    command that makes the start, the override that uses it and the one that runs anyway."""
    from starpo_jax.run.schema import check_config

    sft = WARM_STARTS[name]
    stem = sft[:-3]
    done = subprocess.run([sys.executable, "-c", _AT_EXIT, str(ROOT / "experiments" / "run.py"),
                           "--config", name, "--workdir", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stdout.split("imported:")[1].strip() == "[]", "refused before JAX loads"
    assert _one_line(done.stderr) == (
        f"error: config.model.init_from = '' is invalid: this config trains a game the untrained "
        f"model does not answer in format (model.require_init_from = {sft!r}: every reply "
        f"invalid, nothing to learn); valid: a warm start, made first by `python "
        f"experiments/sft.py --config {sft} --workdir runs/{stem}`, then "
        f"`--config.model.init_from=runs/{stem}` (a --resume passes the run's own again; "
        f"--config.model.require_init_from= runs from the untrained model anyway)")
    assert not (tmp_path / "w").exists()
    assert (ROOT / "experiments" / "configs" / sft).is_file()
    config = load_config(name)
    api.train_config(config)  # api.build still takes it (a bench of the shape)
    started = config.copy_and_resolve_references()
    started.model.init_from = str(tmp_path)  # a workdir of sft.py: holds config.json
    (tmp_path / "config.json").write_text("{}")
    check_config(started)
    config.model.require_init_from = ""  # the override: runs from the untrained model
    check_config(config)


def test_check_config_defers_only_the_estimator():
    """run_config.check_config (no JAX) checks what train_config does but the estimator."""
    from starpo_jax.run.schema import check_config

    config = api.config_for("bandit", "grpo")
    config.advantage.estimator = "nope"
    check_config(config)
    with pytest.raises(ValueError, match="advantage.estimator = 'nope' is invalid"):
        api.train_config(config)
    config.advantage.estimator = "gae"  # a critic's estimator with GRPO
    check_config(config)
    with pytest.raises(ValueError, match="one without a critic"):
        api.train_config(config)
    config.advantage.estimator = None
    config.rollout.groups = 0
    with pytest.raises(ValueError, match="rollout.groups = 0 is invalid"):
        check_config(config)
