# Sourced by the scripts that run on a GPU machine with JAX but no package index (this project's
# device machines; experiments/bench/gpu_prepare.sh writes what travels beside the tree):
#   source experiments/bench/gpu_env.sh        # installs .gpu/whl, sets PYTHONPATH and caches
#   join_gguf                                  # the embedded SmolLM2 GGUF from .gpu/a + .gpu/b
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export STARPO_JAX_CACHE=/tmp/starpo_cache XLA_PYTHON_CLIENT_PREALLOCATE=false
# JAX's persistent compilation cache: a second run of the same program (another seed, a resumed
# run) skips the ~3 minutes a SmolLM2 train step takes to compile there
export JAX_COMPILATION_CACHE_DIR=/tmp/xla_cache
mkdir -p "$STARPO_JAX_CACHE" "$JAX_COMPILATION_CACHE_DIR"

join_gguf() {  # .gpu/a may come in an earlier call that copied it to /tmp/gpu_parts
    local gguf=$STARPO_JAX_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf part_a=.gpu/a
    [ -d "$part_a" ] || part_a=/tmp/gpu_parts
    cat "$part_a"/part* .gpu/b/part* > "$gguf"
    sha256sum -c <(sed "s#  .*#  $gguf#" "$part_a/sha256") || exit 1
}
