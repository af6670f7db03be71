"""The install extras resolve: the `gpu` extra asks for JAX's CUDA 12 build within the core
jax range (the jaxlib and jax-cuda12-plugin that jax[cuda12] pins to jax's own version are then
admitted too), checked offline from pyproject.toml and the installed jax's metadata; the slow
tier resolves it against the package index (pip --dry-run: nothing is installed)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _jax(requirements: list[str]) -> Requirement:
    [jax] = [r for r in map(Requirement, requirements) if r.name == "jax"]
    return jax


def _versions(low: str, high: str) -> list[Version]:
    """Every x.y.z from low to high (z up to 12): what a range check walks through."""
    lo, hi = Version(low), Version(high)
    return [v for minor in range(lo.minor, hi.minor + 1) for micro in range(13)
            if lo <= (v := Version(f"{lo.major}.{minor}.{micro}")) <= hi]


def test_the_gpu_extra_is_jax_cuda12_within_the_core_jax_range():
    core = _jax(PROJECT["dependencies"])
    gpu = _jax(PROJECT["optional-dependencies"]["gpu"])
    assert gpu.extras == {"cuda12"} and not core.extras
    walked = _versions("0.9.0", "0.12.12")
    admitted = [v for v in walked if v in gpu.specifier]
    assert admitted, f"the gpu extra admits no jax release: {gpu}"
    # The core range exactly: none it refuses (pip would fail or leave the tested range), none
    # it admits left out.
    assert admitted == [v for v in walked if v in core.specifier], (gpu, core)


def test_jax_cuda12_pins_its_plugin_and_jaxlib_to_an_admitted_release():
    """The installed jax (in the core range) has the cuda12 extra, and what it pulls in is of
    its own release: admitted by the gpu extra's range and by jax's own jaxlib requirement."""
    dist = importlib.metadata.distribution("jax")
    version = Version(dist.version)
    assert version in _jax(PROJECT["dependencies"]).specifier
    assert version in _jax(PROJECT["optional-dependencies"]["gpu"]).specifier
    assert "cuda12" in dist.metadata.get_all("Provides-Extra")
    pulled = {}
    for text in dist.requires or []:
        requirement = Requirement(text)
        marker = requirement.marker or Marker("extra == ''")
        if marker.evaluate({"extra": "cuda12"}) and requirement.name != "jax":
            pulled[requirement.name] = requirement
    assert {"jaxlib", "jax-cuda12-plugin"} <= set(pulled), pulled
    for name in ("jaxlib", "jax-cuda12-plugin"):
        assert version in pulled[name].specifier, (name, str(pulled[name]), version)
    installed = Version(importlib.metadata.version("jaxlib"))
    assert installed in pulled["jaxlib"].specifier, "the CPU jaxlib here is the release too"


@pytest.mark.slow  # the slow tier (README): asks the package index, ~1 min
def test_pip_resolves_the_gpu_extra(tmp_path):
    """pip --dry-run resolves the gpu extra together with the core jax pin on the index this
    machine uses: jax, jaxlib and jax-cuda12-plugin of one release in the core range."""
    core = str(_jax(PROJECT["dependencies"]))
    [gpu] = PROJECT["optional-dependencies"]["gpu"]
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
                           "--ignore-installed", "--report", str(report), core, gpu],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    chosen = {item["metadata"]["name"].lower(): Version(item["metadata"]["version"])
              for item in json.loads(report.read_text())["install"]}
    assert chosen["jax"] in _jax(PROJECT["dependencies"]).specifier
    assert chosen["jaxlib"] == chosen["jax-cuda12-plugin"] == chosen["jax"], chosen
