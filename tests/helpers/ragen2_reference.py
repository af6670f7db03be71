"""NumPy ports, written for these tests from reading the original (mll-lab-nu/RAGEN @ 20daedc),
of the RAGEN-2 switches starpo_jax reimplements: what tests/test_ragen2_switches.py and
tests/test_gradient_analysis.py check the JAX code against. Loops and dicts as the original
has them, not vectorised: a port, not a second implementation of ours.

- normalize_score_tensor: ragen/llm_agent/ctx_manager.py, ContextManager._normalize_score_tensor
  (the last-token accumulated score, penalties already in).
- grpo_outcome_advantage: ragen/trainer/core_algos.py, compute_grpo_outcome_advantage with
  return_group_std=True (no episode ids: the full context mode).
- soft_advantage_reweight, grpo_length_weight, zero_task_advantage, filter_loss_scaling:
  ragen/trainer/agent_trainer.py, RayAgentTrainer.fit's advantage block, in its order.
- split_into_buckets: ragen/trainer/rollout_filter.py, RolloutFilter.split_into_buckets (its
  masks; torch.argsort's order of equal stds is unspecified: a stable sort here).
- empty_stop_steps: agent_trainer.py's consecutive_empty_filtered_steps rule.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-6


def _torch_std(x: np.ndarray) -> float:
    """torch.Tensor.std(): unbiased; nan for one element (as torch)."""
    return float(np.std(x, ddof=1)) if x.size > 1 else float("nan")


def normalize_score_tensor(scores, group_tags, method: str) -> np.ndarray:
    """scores [B] (score + penalty), group_tags [B] (group_id, env tag or 1) -> [B]."""
    if method == "mean_std":
        def norm(x):
            s = _torch_std(x)
            return (x - x.mean()) / (s + 1e-6) if abs(s) > 1e-6 else np.zeros_like(x)
    elif method == "mean":
        def norm(x):
            return x - x.mean()
    elif method == "asym_clip":
        def norm(x):
            s = _torch_std(x)
            out = (x - x.mean()) / (s + 1e-6) if abs(s) > 1e-6 else np.zeros_like(x)
            return np.clip(out, -1, 3)
    elif method == "identity":
        def norm(x):
            return x
    else:
        raise ValueError(f"Invalid normalization method: {method}")
    group2index: dict = {}
    for i, tag in enumerate(group_tags):
        group2index.setdefault(tag, []).append(i)
    out = np.asarray(scores, np.float64).copy()
    if len(group2index) < out.shape[0]:
        for index in group2index.values():
            out[index] = norm(out[index])
    return out


def group_tags(batch: int, group_size: int, grouping: str) -> list:
    """The tags ctx_manager groups by: "state" each env group's id, "batch" 1, "inductive" the
    env tag (one env per run here)."""
    if grouping == "state":
        return [i // group_size for i in range(batch)]
    if grouping == "batch":
        return [1] * batch
    if grouping == "inductive":
        return ["Bandit"] * batch
    raise ValueError(f"Invalid grouping: {grouping}")


def grpo_outcome_advantage(scores, index, norm_adv_by_std=True, epsilon=1e-6):
    """(per-sample advantage [B], per-sample group std [B])."""
    scores = np.asarray(scores, np.float64).copy()
    id2score: dict = {}
    for i, idx in enumerate(index):
        id2score.setdefault(idx, []).append(scores[i])
    id2mean, id2std = {}, {}
    for idx, values in id2score.items():
        if len(values) == 1:
            id2mean[idx], id2std[idx] = 0.0, 1.0
        else:
            id2mean[idx], id2std[idx] = np.mean(values), np.std(values, ddof=1)
    adv = np.empty_like(scores)
    for i, idx in enumerate(index):
        if norm_adv_by_std:
            adv[i] = (scores[i] - id2mean[idx]) / (id2std[idx] + epsilon)
        else:
            adv[i] = scores[i] - id2mean[idx]
    return adv, np.array([id2std[idx] for idx in index])


def soft_advantage_reweight(advantages, group_std, index):
    """advantages [B, L] x each prompt's std / (max prompt std + 1e-6); (advantages, weights
    per unique uid in sorted order)."""
    unique, inverse = np.unique(np.asarray(index), return_inverse=True)
    prompt_std = np.zeros(len(unique))
    for i in range(len(unique)):
        prompt_std[i] = np.asarray(group_std)[inverse == i][0]
    weight = prompt_std / (prompt_std.max() + 1e-6)
    return np.asarray(advantages) * weight[inverse][:, None], weight


def filter_loss_scaling(advantages, kept_ratio: float, mode: str):
    if mode == "linear":
        return advantages * kept_ratio
    if mode == "sqrt":
        return advantages * kept_ratio ** 0.5
    return advantages


def grpo_length_weight(advantages, response_mask):
    lengths = np.asarray(response_mask, np.float64).sum(-1)
    relative = (lengths + 1e-6) / lengths.mean()
    return np.asarray(advantages) / relative[:, None]


def zero_task_advantage(advantages):
    return np.zeros_like(advantages)


def split_into_buckets(reward_std, group_size: int, bucket_count: int, mode: str) -> dict:
    """reward_std [samples] (each sample its group's std, groups of group_size consecutive
    samples) -> {bucket name: sample mask}, buckets with no sample left out (as the original's
    result)."""
    reward_std = np.asarray(reward_std, np.float64)
    total = reward_std.size
    num_groups = total // group_size
    per_group = reward_std.reshape(num_groups, group_size).mean(axis=1)
    masks = {"all": np.ones(total, bool)}
    if mode == "fixed_rv":
        edges = [0, 1, 2, 3, 4, 5]
        for i, low in enumerate(edges):
            high = edges[i + 1] if i + 1 < len(edges) else None
            group_mask = per_group >= low if high is None else (per_group >= low) & (
                per_group < high)
            masks[f"bucket_{i + 1}"] = np.repeat(group_mask, group_size)
    else:
        num_buckets = min(bucket_count, num_groups) if num_groups > 0 else 0
        per = num_groups // num_buckets if num_buckets > 0 else 0
        remainder = num_groups % num_buckets if num_buckets > 0 else 0
        order = np.argsort(per_group, kind="stable")
        start = 0
        for i in range(num_buckets):
            size = per + (remainder if i == num_buckets - 1 else 0)
            group_mask = np.zeros(num_groups, bool)
            group_mask[order[start:start + size]] = True
            masks[f"bucket_{i + 1}"] = np.repeat(group_mask, group_size)
            start += size
    return {name: mask for name, mask in masks.items() if mask.sum() > 0}


def empty_stop_steps(kept_counts, limit: int) -> tuple[list[int], int | None]:
    """(the consecutive-empty count after each step, the step (1-based) that stops or None)."""
    consecutive, counts = 0, []
    for step, kept in enumerate(kept_counts, start=1):
        if kept == 0:
            consecutive += 1
            counts.append(consecutive)
            if limit > 0 and consecutive >= limit:
                return counts, step
        else:
            consecutive = 0
            counts.append(0)
    return counts, None
