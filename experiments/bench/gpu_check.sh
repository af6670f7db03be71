#!/usr/bin/env bash
# The train step on a GPU machine that has JAX but no package index (this project's device
# machines): what docs/performance.md's GPU table was measured with.
#
#   bash experiments/bench/gpu_check.sh probe   # versions; cuDNN attention against the blockwise
#   bash experiments/bench/gpu_check.sh bench   # SmolLM2 at the quickstart and paper shapes
# (every model here, tiny-random too, takes its tokenizer from the GGUF: only `bench` has it)
#
# What the machine lacks travels beside the working tree, prepared on a machine with pip
# (`bash experiments/bench/gpu_prepare.sh` writes all of it):
#   .gpu/whl/   wheels of the pure-Python packages the image lacks (jumanji and the packages it
#               imports, tensorboardX, ml-collections, gguf), `pip download --no-deps`;
#   .gpu/a/, .gpu/b/   the embedded SmolLM2 GGUF (98 MB) split in two (`split -n 2`), each part
#               under one transfer's size limit; `bench` joins them and checks the sha256 in
#               .gpu/a/sha256 (.gpu/a may come in an earlier call that copies it to
#               /tmp/gpu_parts: a machine keeps /tmp between calls, not the carried paths).
# The image's own JAX, Flax, optax and transformers are used (their versions are printed).
set -uo pipefail
mode=${1:?probe or bench}
out=${OUT:-/tmp/gpu_out}
mkdir -p "$out"
source experiments/bench/gpu_env.sh
python3 - <<'EOF'
import importlib, jax
for name in ("jax", "jaxlib", "flax", "optax", "chex", "orbax.checkpoint", "transformers",
             "jumanji", "numpy"):
    module = importlib.import_module(name)
    print(name, getattr(module, "__version__", "?"))
print(jax.devices())
EOF
if [ "$mode" = probe ]; then
    timeout 120 python3 - <<'EOF2'
import jax, jax.numpy as jnp
from starpo_jax.models import layers
# cuDNN's fused attention (bfloat16, the GPU default) against the blockwise path, causal mask
# with left padding as the update's rows have.
b, t, h, kvh, hd = 4, 256, 9, 3, 64
keys = jax.random.split(jax.random.PRNGKey(0), 3)
q = jax.random.normal(keys[0], (b, t, h, hd), jnp.bfloat16)
k, v = (jax.random.normal(x, (b, kvh, t, hd), jnp.bfloat16) for x in keys[1:])
pos = jnp.arange(t)
start = jnp.array([0, 10, 100, 200])[:, None, None]
visible = (pos[None, None, :] <= pos[None, :, None]) & (pos[None, None, :] >= start)
real = (pos[None, :] >= start[:, :, 0])
for impl in ("cudnn", "xla"):
    fused = jax.jit(lambda *a: layers._fused_attention(*a, impl))(q, k, v, visible)
    block = jax.jit(lambda *a: layers.attention(*a, causal=True, backend="xla"))(q, k, v, visible)
    diff = jnp.abs(fused.astype(jnp.float32) - block.astype(jnp.float32)) * real[..., None, None]
    print(f"fused[{impl}] vs blockwise, bfloat16: max |diff| {float(diff.max()):.4f}")
EOF2
    exit 0
fi
join_gguf
run() {  # a label, a time limit, then bench/step.py's arguments
    local label=$1 limit=$2
    shift 2
    echo "=== $label: experiments/bench/step.py $*"
    timeout "$limit" python3 experiments/bench/step.py "$@" --json "$out/$label.json" 2>&1 \
        | tail -40
}
run quickstart 150 --config quickstart.py --runs 4
run quickstart_bf16 150 --config quickstart.py --runs 4 --set model.dtype=bfloat16
# autofit's candidate search at this shape outruns the limit on a GPU (~200 s a compile): the
# memory knobs are set.
run paper 300 --paper --runs 1 --set optim.micro_batches=16 --set optim.remat=true \
    --set rollout.chunks=2 --set rollout.cache_dtype=float32
