#!/usr/bin/env bash
# Issue 31's pilot on a GPU machine (the device machine of a session): many solver
# demonstrations into LoRA adapters, the start's held-out evaluation, then StarPO-S runs from it
# (RUNS, run_solverstart.sh's items, until DEADLINE; ~1 s a step and a ~3 min compile there).
#
#   bash results/cpu/pilots/gpu_sft.sh            # .gpu/ from experiments/bench/gpu_prepare.sh
#   STEPS=200 RUNS="grpo:1:5e-5:mean_std:32" DEADLINE=560 bash results/cpu/pilots/gpu_sft.sh 2>&1 \
#       | grep --line-buffered -v WARN | tee $OUT/log.txt   # line-buffered: a cut call keeps it
#
# Writes to $OUT: pack/adapters_<k>.npz + pack/meta.json (results/cpu/pilots/adapters.py pack:
# the adapters and config, which `adapters.py unpack` turns back into a workdir here), sft.tgz
# and rl.tgz (the workdirs without checkpoints, logs). Each phase runs under a time limit;
# SIGTERM makes sft.py / run.py save after the current step. A start trained earlier skips the
# SFT: its pack (40 MB) does not fit in one call beside the GGUF's second half, so an earlier
# call on the same warm machine carries it as .gpu/pack and copies it to /tmp/gpu_pack.
set -uo pipefail
out=${OUT:-/tmp/gpu_out}
w=${WORK:-/tmp/w}
SFT_SECONDS=${SFT_SECONDS:-330}
DEADLINE=${DEADLINE:-560}  # the script ends by this many seconds (RL stopped 70 s before)
RUNS=${RUNS:-grpo:0}  # run_solverstart.sh's items: METHOD:SEED[:LR[:MODE[:RANK[:SHAPE]]]]
# STEPS (run_solverstart.sh's run length) passes through; RL_EXTRA: more run.py arguments;
# SFT_EXTRA: more sft.py arguments (e.g. "--config.steps=25": a weaker start, with headroom);
# PARALLEL=1 runs the space-separated RUNS lanes side by side (one process at a time per lane,
# sharing the GPU) instead of in order; a lane is items joined by commas, run in order, so its
# later items (other seeds of the same program) find their compile in the cache (gpu_env.sh):
#   PARALLEL=1 RUNS="grpo:1:5e-5:mean_std:32,grpo:2:5e-5:mean_std:32 gigpo:0:5e-5:mean_std:32"
# WARM=1 compiles each lane's first program while the SFT trains: a one-step run of it from the
# base model (the same shapes as from the SFT start, so the same program) fills JAX's persistent
# compilation cache, and the lane's real run finds its step and evaluation compiled there.
# A call on a warm machine whose earlier call trained the SFT ($WORK/sft has a checkpoint) skips
# it and resumes the lanes' runs where that call stopped them.
# One step of 4 x 8 leaves the H100 mostly idle (~1 s, latency-bound decoding). Measured once,
# 8 lanes at once: none finished compiling within 540 s (load average 68 on the machine's 16
# cores; one alone compiles in ~170 s), so run at most 2-3 lanes.
# A run stopped at its deadline has 60 s to save, then the workdirs are packed: the RL phase
# ends 70 s before DEADLINE so that the call (time limit >= DEADLINE + 10 s) keeps rl.tgz.
mkdir -p "$out" "$w"
if [ -z "${PY:-}" ]; then
    source experiments/bench/gpu_env.sh
    join_gguf
fi
py=${PY:-python3}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>/dev/null
date +%T
pack=.gpu/pack  # adapters packed earlier (adapters.py pack), carried, or copied to /tmp/gpu_pack
[ -d "$pack" ] || pack=/tmp/gpu_pack
warm_pids=()
if [ "${WARM:-0}" = 1 ] && [ ! -d "$w/sft/checkpoints" ]; then
    for lane in $RUNS; do
        first=${lane%%,*}
        echo "=== compile warm-up: $first, one step from the base model"
        START="" RUNS_DIR=/tmp/warm STEPS=1 DEADLINE=$((DEADLINE - 70 - SECONDS)) PY=$py \
            EXTRA="--config.optim.micro_batches=1 --config.optim.remat=true ${RL_EXTRA:-}" \
            bash results/cpu/pilots/run_solverstart.sh "$first" \
            > "$w/warm_${first//:/_}.log" 2>&1 &
        warm_pids+=($!)
    done
fi
if [ -d "$w/sft/checkpoints" ]; then
    echo "=== SFT start: $w/sft, trained by an earlier call on this machine"
elif [ -f "$pack/meta.json" ]; then
    echo "=== SFT start: the packed adapters in $pack"
    $py results/cpu/pilots/adapters.py unpack "$pack" "$w/sft" 2>&1 | grep -v WARN
else
    echo "=== SFT: sokoban_sft_solver.py (solver demonstrations into LoRA), ${SFT_SECONDS}s at most"
    # shellcheck disable=SC2086  # SFT_EXTRA: arguments, split on spaces
    timeout -k 60 -s TERM "$SFT_SECONDS" $py experiments/sft.py --config sokoban_sft_solver.py \
        --workdir "$w/sft" ${SFT_EXTRA:-} > "$w/sft.log" 2>&1
    grep -v WARN "$w/sft.log" | grep -v "^step" | tail -12; date +%T
    $py results/cpu/pilots/adapters.py pack "$w/sft" "$out/pack" 2>&1 | grep -v WARN
    tar czf "$out/sft.tgz" -C "$w" --exclude=checkpoints sft sft.log
fi
if [ ${#warm_pids[@]} -gt 0 ]; then
    wait "${warm_pids[@]}"
    grep -h "^===\|^step" "$w"/warm_*.log; date +%T
fi
echo "=== StarPO-S from it: ${RUNS} (run_solverstart.sh), until $((DEADLINE - 70))s"
rl() {
    START="$w/sft" RUNS_DIR="$w/rl" DEADLINE=$((DEADLINE - 70 - SECONDS)) PY=$py \
        EXTRA="--config.optim.micro_batches=1 --config.optim.remat=true ${RL_EXTRA:-}" \
        bash results/cpu/pilots/run_solverstart.sh "$@"
}
if [ "${PARALLEL:-0}" = 1 ]; then
    for lane in $RUNS; do
        # shellcheck disable=SC2086  # the lane's items, split on the commas
        rl ${lane//,/ } > "$w/rl_${lane//[:,]/_}.log" 2>&1 &
    done
    wait
    cat "$w"/rl_*.log > "$w/rl.log"
else
    rl $RUNS > "$w/rl.log" 2>&1
fi
grep -v WARN "$w/rl.log" | grep "^===\|^step\|greedy" | tail -80; date +%T
tar czf "$out/rl.tgz" -C "$w" --exclude=checkpoints rl rl.log
ls -la "$out" "$out/pack"
