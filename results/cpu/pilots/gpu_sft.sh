#!/usr/bin/env bash
# Issue 31's pilot on a GPU machine (the device machine of a session): many solver
# demonstrations into LoRA adapters, the start's held-out evaluation, then StarPO-S GRPO from it.
#
#   bash results/cpu/pilots/gpu_sft.sh            # .gpu/ as experiments/bench/gpu_check.sh says
#
# Writes to $OUT: pack/adapters_<k>.npz + pack/meta.json (results/cpu/pilots/adapters.py pack:
# the adapters and config, which `adapters.py unpack` turns back into a workdir here), sft.tgz
# and rl.tgz (the workdirs without checkpoints, logs). Each phase runs under a time limit;
# SIGTERM makes sft.py / run.py save after the current step.
set -uo pipefail
out=${OUT:-/tmp/gpu_out}
w=${WORK:-/tmp/w}
SFT_SECONDS=${SFT_SECONDS:-250} EVAL_SECONDS=${EVAL_SECONDS:-100}
DEADLINE=${DEADLINE:-560}  # RL runs until this many seconds into the script
ROWS=${ROWS:-64} RANK=${RANK:-32} LR=${LR:-5e-4}
mkdir -p "$out" "$w"
if [ -z "${PY:-}" ]; then
    source experiments/bench/gpu_env.sh
    join_gguf
fi
py=${PY:-python3}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>/dev/null
date +%T
echo "=== SFT: solver demonstrations, LoRA rank $RANK, lr $LR, $ROWS a step, ${SFT_SECONDS}s"
timeout -k 60 -s TERM "$SFT_SECONDS" $py experiments/sft.py --config sokoban_sft.py \
    --workdir "$w/sft" --config.sft.policy=solver --config.lora.rank="$RANK" \
    --config.optim.actor_lr="$LR" --config.rollout.groups="$ROWS" \
    --config.optim.micro_batches=4 --config.steps=2000 --config.eval_every=0 \
    --config.sample_every=0 --config.checkpoint_every=100 --config.eval.episodes=64 \
    --config.eval.seed=0 --config.eval.modes=greedy,sampled --config.eval.pass_k=1 \
    > "$w/sft.log" 2>&1
tail -4 "$w/sft.log"; date +%T
echo "=== pack"
$py results/cpu/pilots/adapters.py pack "$w/sft" "$out/pack" 2>&1 | grep -v WARN
echo "=== SFT start: held-out evaluation (64 states, greedy and sampled)"
timeout "$EVAL_SECONDS" $py experiments/evaluate.py --workdir "$w/sft" > "$w/sft_eval.log" 2>&1
grep -v WARN "$w/sft_eval.log" | tail -12; date +%T
tar czf "$out/sft.tgz" -C "$w" --exclude=checkpoints sft sft.log sft_eval.log
RL_SECONDS=$((DEADLINE - SECONDS))
echo "=== StarPO-S GRPO from it: 4 x 8, keep 0.5, lr 2e-5, ${RL_SECONDS}s"
timeout -k 60 -s TERM "$RL_SECONDS" $py experiments/run.py \
    --config results/cpu/pilots/sokoban_shape.py:2e-5,4,8,0.5,20 --workdir "$w/rl" \
    --config.model.init_from="$w/sft" --config.optim.micro_batches=1 \
    --config.optim.remat=true > "$w/rl.log" 2>&1
grep -v WARN "$w/rl.log" | grep -v "^ " | tail -30; date +%T
tar czf "$out/rl.tgz" -C "$w" --exclude=checkpoints rl rl.log
ls -la "$out" "$out/pack"
