"""Static configuration of one StarPO / StarPO-S training step, of its evaluation (EvalConfig)
and of the collapse monitor (MonitorConfig).

Every config is a frozen, keyword-only dataclass (hashable: it parameterises compiled code) and
validates itself in `__post_init__`, naming the field, the bad value and what would be valid.
Defaults are the original's (RAGEN's) code defaults for StarPO-S; `TrainConfig.vanilla()` gives
vanilla StarPO (KL 0.001, symmetric clip 0.2, no filter).

    config = TrainConfig(algo="grpo", rollout=RolloutConfig(groups=8, group_size=16))

No JAX here, nor in what this imports: a config is checked before the heavy stack loads
(starpo_jax.run.schema). So the names the checks accept live here, and filtering, losses,
evaluation, monitor and models import them. The advantage estimators are checked against
starpo_jax.estimators, the JAX-free table of their metadata (the built-ins', and those users
register at run time with starpo_jax.algo.advantages.register_advantage_estimator).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from starpo_jax.checks import (check_bool, check_choice, check_int, check_number, fail, is_int,
                               is_number, require)
from starpo_jax.estimators import estimator_names, estimator_spec

ALGOS = ("ppo", "grpo")
MODES = ("think", "nothink")
GRPO_MODES = ("mean_std", "mean", "none")
STEP_MODES = ("mean_std", "mean")
# AdvantageConfig fields -> the estimator parameter each is passed as (when the estimator's
# signature names it).
ESTIMATOR_PARAMS = {"gamma": "gamma", "lam": "lam", "gamma_turn": "gamma_turn",
                    "grpo_mode": "mode", "whiten": "whiten_advantages",
                    "step_gamma": "step_gamma", "step_mode": "step_mode", "omega": "omega"}
REWARD_PLACEMENTS = ("trajectory", "turn")
KL_KINDS = ("k1", "k3", "mse", "abs")
AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
# The weights the rollout samples with (models/sampler_weights.py).
SAMPLER_DTYPES = ("model", "bfloat16")
# The projections LoRA may target (models/lora.py); "all-linear": all of them, as the original.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# The dtypes a model may compute and store in (models/config.py's ModelConfig).
MODEL_DTYPES = ("float32", "bfloat16", "float16")
# The dtypes a run may store its weights, KV cache or LoRA base in (model.dtype,
# rollout.cache_dtype, lora.base_dtype): one tuple, named for each use below.
RUN_DTYPES = ("float32", "bfloat16")
# The matmul precisions a model may trace with (jax.default_matmul_precision's names; models/
# config.py's ModelConfig.matmul_precision), and model.matmul_precision's: "auto" = "highest" on
# a GPU or TPU (float32 that means float32; XLA's default there is TF32 / bfloat16 passes),
# XLA's default on a CPU (exact float32 already); "default" = XLA's default on every backend.
MATMUL_PRECISIONS = ("default", "high", "highest")
RUN_MATMUL_PRECISIONS = ("auto", *MATMUL_PRECISIONS)
# The named models load_pretrained knows (models/loading.py), besides paths.
EMBEDDED_NAME = "smollm2-135m-instruct"
TINY_RANDOM_NAME = "tiny-random"
# The evaluator's modes (starpo_jax.run.evaluation).
EVAL_MODES = ("greedy", "sampled")
# The validation protocol (RAGEN's, config/base.yaml: es_manager.val, val_kwargs, seed.val,
# trainer.val_before_train / test_freq): VAL_STATES held-out initial states x 1 rollout each,
# sampled at temperature 0.5, drawn from the fixed seed VAL_SEED (RAGEN's seed.val), before
# training and every 10 steps. A table or figure of record evaluates RECORD_STATES or more
# (RAGEN v1 validated on 256; starpo_jax.analysis.report marks fewer "not a figure of record").
VAL_STATES, VAL_SEED, RECORD_STATES = 512, 123, 256
# Out-of-distribution variants evaluated by default next to the training env (RAGEN's).
OOD_VARIANTS = {"bandit": ("bandit_test",), "sokoban": ("sokoban_large", "sokoban_new_vocab"),
                "countdown": ("countdown_5",), "sudoku": ("sudoku_medium",),
                "sudoku_4x4": ("sudoku_4x4_medium",)}
# The collapse monitor's actions (starpo_jax.run.monitor).
ACTIONS = ("warn", "stop", "raise_filter")
# The uncertainty filter's choices (starpo_jax.algo.filtering).
FILTER_STRATEGIES = ("top_k", "top_k_abs", "top_p", "min_p")
FILTER_METRICS = ("reward_variance", "reward", "reward_sum", "entropy", "entropy_variance",
                  "length")
# The metrics ranked by a per-trajectory value other than the score (`select_groups`' values).
VALUE_METRICS = ("entropy", "entropy_variance", "length")
LOSS_SCALINGS = ("none", "linear", "sqrt")
# RAGEN's agent_proxy.reward_normalization (ctx_manager._normalize_score_tensor): which
# trajectories share a normalisation, and how (starpo_jax.algo.reweighting).
REWARD_NORM_GROUPINGS = ("state", "batch", "inductive")
REWARD_NORM_METHODS = ("identity", "mean_std", "mean", "asym_clip")
# RAGEN-2's gradient analysis (starpo_jax.train.gradient_analysis): how groups are bucketed by
# their reward std.
BUCKET_MODES = ("quantile", "fixed_rv")
FILTER_MODES = ("std", "std_rev")
TOP_P_WEIGHTS = ("linear", "softmax")
CACHE_DTYPES = RUN_DTYPES
# What the model sees at each turn (RAGEN's agent_proxy.context_window_mode; starpo_jax.rollout.jax_env).
CONTEXT_WINDOW_MODES = ("full", "limited_multi_turn", "single_turn")
LORA_BASE_DTYPES = RUN_DTYPES


def num_kept_groups(num_groups: int, keep_ratio: float) -> int:
    """K = max(1, int(keep_ratio * num_groups)), for num_groups >= 1 and keep_ratio in (0, 1]."""
    if not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"num_groups must be a positive int; got {num_groups!r}")
    if not isinstance(keep_ratio, (int, float)) or not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must be a number in (0, 1]; got {keep_ratio!r}")
    return max(1, int(keep_ratio * num_groups))


def kept_bound(num_groups: int, config: FilterConfig) -> int:
    """Kmax: the static number of groups filtering.select_groups returns (see that module's
    docstring)."""
    if config.strategy == "top_k":
        bound = num_kept_groups(num_groups, config.keep_ratio)
    elif config.strategy == "top_k_abs":
        bound = min(config.keep_groups, num_groups)
    else:
        bound = num_groups
    return bound if config.max_groups is None else min(bound, config.max_groups)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """How trajectories are sampled: P groups x N rollouts, up to max_turns turns each.

    reply_tokens is the per-turn generation budget (forced prefix not counted);
    announced_tokens is the "Max response length: N words (tokens)" the prompt states, kept
    apart as the original does (it announces 100 and generates up to 400; the codec is built
    with it). max_turns, the action budgets and announced_tokens are each env's own in the
    original (envs_jax.EnvSettings; starpo_jax.api fills them from the env unless set); the
    defaults here are the grid games'. The token buffer of a row holds the first prompt and
    max_turns x (forced prefix + reply + next environment message); its size is computed from
    the codec by the rollout.
    """

    groups: int = 8  # P: initial states per step
    group_size: int = 16  # N: rollouts per initial state
    max_turns: int = 5
    max_actions_per_turn: int = 5
    max_actions_per_traj: int = 10
    reply_tokens: int = 400  # the original's response_length
    announced_tokens: int = 100
    mode: str = "think"  # "think": replies start with <think>; "nothink": with <answer>
    # Sampling. The trainer scores tokens under softmax(logits / temperature), the sampler's
    # distribution; top_p / top_k truncate sampling only (as veRL), which makes a truncated
    # rollout slightly off-policy: rollout/logprob_diff_* does not show that part.
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    format_penalty: float = -0.1  # added to a turn's reward when its reply is badly formatted
    # The N rollouts of a group start from the same state; False (the original's current code)
    # gives each its own stream of env randomness (Bandit payouts, FrozenLake slips), True
    # copies the initial state's stream to all N (the original's first release).
    shared_env_randomness: bool = False
    # Storage of the KV cache ("bfloat16" halves it; attention still runs in float32).
    cache_dtype: str = "float32"
    # The weights the rollout samples with (models/sampler_weights.py): "model" the policy's own
    # (a LoRA policy's adapters merged in), "bfloat16" those cast to bfloat16 and computed in
    # bfloat16 with a bfloat16 cache (faster; the sampler / trainer mismatch it adds shows in
    # rollout/logprob_diff_*).
    sampler_dtype: str = "model"
    # The train step rolls the groups out in this many sequential chunks (each with its own
    # key): the KV cache and the sampler's buffers exist for groups / chunks groups at a time.
    chunks: int = 1
    # What the model sees at turn t (RAGEN's agent_proxy keys): "full" the whole conversation;
    # "limited_multi_turn" the system message and the last max_context_window turns as
    # messages; "single_turn" one user message with the previous turns' history as text. The
    # two limited modes train on one sample per (trajectory, turn): its context and its reply.
    # max_context_window: turns shown, the current one included; -1 every turn (the original's
    # default).
    context_window_mode: str = "full"
    max_context_window: int = -1
    # World-model replies (SPA; rollout/world_model.py): score each turn's <observation> and
    # <prediction> blocks against the env's coordinates of the state before and after it
    # (world_model/* metrics; think mode, an env with coordinates); prediction_reward is added
    # to the turn's reward when its prediction is right (so it enters the score, the
    # advantages and the filter's reward std; 0 = off).
    world_model: bool = False
    prediction_reward: float = 0.0

    def __post_init__(self) -> None:
        o = "rollout"
        for name in ("groups", "group_size", "max_turns", "max_actions_per_turn",
                     "max_actions_per_traj", "reply_tokens", "announced_tokens"):
            check_int(f"{o}.{name}", getattr(self, name))
        check_choice(f"{o}.mode", self.mode, MODES)
        check_number(f"{o}.temperature", self.temperature, 0.0, 100.0, low_open=True)
        check_number(f"{o}.top_p", self.top_p, 0.0, 1.0, low_open=True)
        check_int(f"{o}.top_k", self.top_k, low=0)
        check_number(f"{o}.format_penalty", self.format_penalty, -100.0, 0.0)
        check_choice(f"{o}.cache_dtype", self.cache_dtype, CACHE_DTYPES)
        check_choice(f"{o}.sampler_dtype", self.sampler_dtype, SAMPLER_DTYPES)
        check_int(f"{o}.chunks", self.chunks)
        check_bool(f"{o}.shared_env_randomness", self.shared_env_randomness)
        check_bool(f"{o}.world_model", self.world_model)
        check_number(f"{o}.prediction_reward", self.prediction_reward, -100.0, 100.0)
        if self.prediction_reward and not self.world_model:
            fail(f"{o}.prediction_reward", self.prediction_reward,
                 "0 unless rollout.world_model = True (it pays the probe's right predictions)")
        check_choice(f"{o}.context_window_mode", self.context_window_mode, CONTEXT_WINDOW_MODES)
        k = self.max_context_window
        if not isinstance(k, int) or isinstance(k, bool) or k == 0 or k < -1:
            fail(f"{o}.max_context_window", k, "-1 (every earlier turn) or an int >= 1")
        if self.groups % self.chunks:
            fail(f"{o}.chunks", self.chunks, f"a divisor of rollout.groups = {self.groups}")

    @property
    def batch_size(self) -> int:
        """B = P * N trajectories per step."""
        return self.groups * self.group_size

    @property
    def turn_samples(self) -> bool:
        """The update trains on one sample per (trajectory, turn) (the limited context modes)."""
        return self.context_window_mode != "full"

    @property
    def window_turns(self) -> int:
        """Turns a context shows at most, the current one included (max_turns when unlimited)."""
        k = self.max_context_window
        return self.max_turns if k < 0 else min(k, self.max_turns)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FilterConfig:
    """StarPO-S uncertainty filter: which groups (by in-group reward std) the update sees.

    strategy (RAGEN-2's rollout_filter_strategy; exact rules in starpo_jax/algo/filtering.py):
    "top_k" keeps max(1, int(keep_ratio * P)) groups (the StarPO-S paper's filter, and the
    default); "top_k_abs" keep_groups groups; "top_p" the fewest top-ranked groups whose share
    of the summed std reaches top_p (top_p_weights "linear": sum >= top_p * total - top_p_eps,
    or none if never; "softmax": cumulative softmax(std) mass >= top_p); "min_p" the groups with
    std >= min_p * the largest (std_rev: <= the smallest / min_p). include_zero: may groups of
    zero std be kept (False: never). mode "std" ranks the largest std first (the original's
    filter_type "largest"), "std_rev" the smallest. Only the active strategy's parameter is
    read. RAGEN-2's recommendation: strategy="top_p", top_p=0.9, "linear", include_zero=False.

    metric (the original's rollout_filter_metric): what the groups are ranked by,
    "reward_variance" (the in-group std, the default), "reward" / "reward_sum" (the mean /
    sum of the group's scores), "entropy" / "entropy_variance" (the mean / std over the group
    of each trajectory's mean sampled-token entropy, the sampler's), "length" (the mean count of
    sampled tokens). loss_scaling (the original's filter_loss_scaling) multiplies the
    advantages by the share of the P groups really kept ("linear") or its square root
    ("sqrt"); "none" leaves them.

    The batch has a static number of groups (TrainConfig.kept_groups): top_k's count,
    keep_groups, or for top_p / min_p all P groups, of which those not kept are masked out of
    the loss. max_groups (None = no cap) caps that number: fewer rows to compute, and when more
    groups pass the rule only the highest-ranked max_groups are kept.
    """

    strategy: str = "top_k"
    keep_ratio: float = 0.25  # top_k; 1.0 = filter off
    keep_groups: int = 2  # top_k_abs
    top_p: float = 0.9  # top_p; 1.0 keeps every candidate
    top_p_weights: str = "linear"
    top_p_eps: float = 0.01  # linear top_p's slack (the original's selection_eps)
    min_p: float = 0.5  # min_p
    include_zero: bool = True
    mode: str = "std"  # "std" keeps the most uncertain groups, "std_rev" the least
    max_groups: int | None = None
    metric: str = "reward_variance"
    loss_scaling: str = "none"
    # The run's, not the step's (experiments/run.py; the original's
    # rollout_filter_empty_stop_steps, on by default): save and stop after this many steps in a
    # row whose filter kept no group (0 = never).
    empty_stop_steps: int = 5

    def __post_init__(self) -> None:
        o = "filter"
        check_int(f"{o}.empty_stop_steps", self.empty_stop_steps, low=0)
        check_choice(f"{o}.strategy", self.strategy, FILTER_STRATEGIES)
        check_choice(f"{o}.metric", self.metric, FILTER_METRICS)
        check_choice(f"{o}.loss_scaling", self.loss_scaling, LOSS_SCALINGS)
        check_number(f"{o}.keep_ratio", self.keep_ratio, 0.0, 1.0, low_open=True)
        check_int(f"{o}.keep_groups", self.keep_groups)
        check_number(f"{o}.top_p", self.top_p, 0.0, 1.0, low_open=True)
        check_choice(f"{o}.top_p_weights", self.top_p_weights, TOP_P_WEIGHTS)
        check_number(f"{o}.top_p_eps", self.top_p_eps, 0.0, 1e6)
        check_number(f"{o}.min_p", self.min_p, 0.0, 1.0, low_open=True)
        check_bool(f"{o}.include_zero", self.include_zero)
        check_choice(f"{o}.mode", self.mode, FILTER_MODES)
        if self.max_groups is not None:
            check_int(f"{o}.max_groups", self.max_groups)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdvantageConfig:
    """How advantages are estimated.

    `estimator` names an estimator of the registry (`advantages.register_advantage_estimator`:
    "gae", "bi_level_gae", "grpo", and any registered later); None picks the algorithm's own
    ("gae" for PPO, "grpo" for GRPO). An estimator is called with the fields below that its
    signature names (grpo_mode as `mode`, whiten as `whiten_advantages`). GRPO normalises
    trajectory scores within each group (`grpo_mode`: "mean_std"; "mean" is Dr.GRPO's, without
    the std normalisation). `reward_placement`: the score sits on the last reply
    token of the trajectory ("trajectory", the original's) or each turn's reward on the last
    token of that turn ("turn").

    Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): grpo_mode "mean" is GRPO
    without the std normalisation (the original's `norm_adv_by_std_in_grpo: False`, which its
    config comments call Dr.GRPO); the other half of Dr.GRPO is LossConfig.agg.

    GiGPO ("gigpo"): grpo_mode is its episode-level normalisation; step_gamma discounts the
    turn rewards into each turn's return, step_mode ("mean_std" / "mean") normalises that
    within the turns that start from the same env state, and omega weighs the step-level
    advantage against the episode-level one.

    A field set away from its default must be a parameter of the chosen estimator
    (ESTIMATOR_PARAMS): TrainConfig refuses e.g. gamma_turn with "grpo", naming it.

    RAGEN-2's switches (exact rules: starpo_jax/algo/reweighting.py), all off by default as in
    the original: reward_normalization_grouping / _method (its agent_proxy.reward_normalization:
    the trajectory scores normalised within "state" groups, the "batch" or the env tag's
    trajectories, "inductive", before any estimator sees them; "identity" = off);
    soft_advantage_reweight (GRPO only: each kept group's advantages times its score std over
    the largest kept group's); grpo_advantage_length_weight (GRPO only: each row's advantages
    divided by its reply-token count over the mean count); zero_task_advantage (advantages 0:
    only the entropy bonus and the KL term train the actor; a critic still learns its returns).
    """

    estimator: str | None = None
    gamma: float = 1.0
    lam: float = 1.0
    gamma_turn: float = 0.95  # bi-level GAE's turn-level discount
    grpo_mode: str = "mean_std"
    reward_placement: str = "trajectory"
    whiten: bool | None = None  # None: the estimator's own default (GAE yes, GRPO no)
    step_gamma: float = 0.95  # GiGPO's turn-return discount
    step_mode: str = "mean_std"  # GiGPO's step-level normalisation
    omega: float = 1.0  # GiGPO's step-level weight
    reward_normalization_grouping: str = "state"
    reward_normalization_method: str = "identity"
    soft_advantage_reweight: bool = False
    grpo_advantage_length_weight: bool = False
    zero_task_advantage: bool = False

    def __post_init__(self) -> None:
        o = "advantage"
        check_choice(f"{o}.reward_normalization_grouping", self.reward_normalization_grouping,
                     REWARD_NORM_GROUPINGS)
        check_choice(f"{o}.reward_normalization_method", self.reward_normalization_method,
                     REWARD_NORM_METHODS)
        for name in ("soft_advantage_reweight", "grpo_advantage_length_weight",
                     "zero_task_advantage"):
            check_bool(f"{o}.{name}", getattr(self, name))
        if self.reward_normalization_method != "identity" and self.reward_placement == "turn":
            # The original asserts use_turn_scores == False: it normalises trajectory scores.
            fail(f"{o}.reward_normalization_method", self.reward_normalization_method,
                 "'identity' with advantage.reward_placement = 'turn' (the original normalises "
                 "trajectory scores only)")
        if self.estimator is not None:
            check_choice(f"{o}.estimator", self.estimator, estimator_names())
        for name in ("gamma", "lam", "gamma_turn", "step_gamma"):
            check_number(f"{o}.{name}", getattr(self, name), 0.0, 1.0)
        check_choice(f"{o}.grpo_mode", self.grpo_mode, GRPO_MODES)
        check_choice(f"{o}.step_mode", self.step_mode, STEP_MODES)
        check_number(f"{o}.omega", self.omega, 0.0, 1e3)
        check_choice(f"{o}.reward_placement", self.reward_placement, REWARD_PLACEMENTS)
        if self.whiten not in (None, True, False):
            fail(f"{o}.whiten", self.whiten, "None, True or False")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossConfig:
    """PPO losses: clip-higher surrogate, optional dual clip, value clip, entropy bonus, KL.

    kl_coef = 0 removes the KL term entirely: no reference parameters are kept and no
    reference forward is traced.

    agg reduces the per-token losses (policy, entropy, KL, value) to one number
    (losses.aggregate): "token_mean" (the original's default), "seq_mean_token_mean",
    "seq_mean_token_sum" (which the original's config comment labels Dr.GRPO) and
    "seq_mean_token_sum_norm": each row's token sum over a constant, the reply-token budget
    rollout.max_turns x rollout.reply_tokens, then the mean over rows: Dr.GRPO's constant
    normaliser (verl's mode of that name divides by the padded response width of the batch,
    and at RAGEN's micro-batch size 1 averages over the rows). Dr.GRPO = this with
    AdvantageConfig.grpo_mode "mean". The two token-sum modes differ by that constant factor
    only, which AdamW all but ignores (up to its eps and the grad-norm clip).
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = 3.0
    agg: str = "token_mean"
    entropy_coef: float = 0.001
    kl_coef: float = 0.0
    kl_kind: str = "k3"
    value_clip: float | None = 0.5

    def __post_init__(self) -> None:
        o = "loss"
        check_number(f"{o}.clip_low", self.clip_low, 0.0, 1.0, high_open=True)
        check_number(f"{o}.clip_high", self.clip_high, 0.0, 100.0)
        if self.dual_clip is not None:
            check_number(f"{o}.dual_clip", self.dual_clip, 1.0, 1e6, low_open=True)
        check_choice(f"{o}.agg", self.agg, AGG_MODES)
        check_number(f"{o}.entropy_coef", self.entropy_coef, 0.0, 10.0)
        check_number(f"{o}.kl_coef", self.kl_coef, 0.0, 100.0)
        check_choice(f"{o}.kl_kind", self.kl_kind, KL_KINDS)
        if self.value_clip is not None:
            check_number(f"{o}.value_clip", self.value_clip, 0.0, 1e6, low_open=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW for actor and critic, after global-norm clipping; PPO epochs and mini-batches.

    rollout_reuse (Online-k): k update rounds on one rollout batch; each round recomputes the
    old log-probs, values and advantages with the current parameters, then runs ppo_epochs
    passes over the kept rows in mini-batches of `minibatch_rows` rows (the original's
    ppo_mini_batch_size, 32: vanilla StarPO's 128 rows make 4 updates, StarPO-S's 32 kept rows
    one). Fewer kept rows than that are one mini-batch of all of them. k = 1 is the original's
    default and best.

    Memory knobs (results unchanged up to float rounding): micro_batches splits each mini-batch
    into that many row slices whose gradients are summed before its one update (gradient
    accumulation, normalised by the whole mini-batch), and the forwards without a gradient (old
    and reference log-probs, the critic's values) run over the kept rows in as many slices;
    remat recomputes each decoder layer's activations in the backward pass of the actor and
    critic instead of storing them.

    shared_prefix (results unchanged up to float rounding): those forwards and the update's run
    each group's first prompt once per slice of rows rather than once per row, the rows
    attending to its keys and values (train/shared_prefix.py); False runs every row whole.
    """

    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    ppo_epochs: int = 1
    minibatch_rows: int = 32
    rollout_reuse: int = 1
    logit_chunk: int = 128  # reply tokens per chunk when computing [*, V] logits
    micro_batches: int = 1
    remat: bool = False
    shared_prefix: bool = True

    def __post_init__(self) -> None:
        o = "optim"
        for name in ("actor_lr", "critic_lr"):
            check_number(f"{o}.{name}", getattr(self, name), 0.0, 10.0, low_open=True)
        check_number(f"{o}.weight_decay", self.weight_decay, 0.0, 10.0)
        check_number(f"{o}.max_grad_norm", self.max_grad_norm, 0.0, 1e6, low_open=True)
        for name in ("ppo_epochs", "minibatch_rows", "rollout_reuse", "logit_chunk",
                     "micro_batches"):
            check_int(f"{o}.{name}", getattr(self, name))
        for name in ("remat", "shared_prefix"):
            check_bool(f"{o}.{name}", getattr(self, name))


@dataclasses.dataclass(frozen=True, kw_only=True)
class CollapseConfig:
    """RAGEN-2's template-collapse metrics (starpo_jax.train.collapse): every `every` steps (0 = off,
    nothing compiled in; the original computes them every 5), each first-turn reply is scored
    under each of the step's P first prompts, `micro_rows` (reply, prompt) pairs per forward
    (the original's micro_batch_size; a memory knob, results unchanged)."""

    every: int = 0
    micro_rows: int = 16

    def __post_init__(self) -> None:
        check_int("collapse.every", self.every, low=0)
        check_int("collapse.micro_rows", self.micro_rows)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoraConfig:
    """LoRA fine-tuning (the original's `lora` section: rank 0 = off, alpha 64, "all-linear";
    its paper trains with rank 64). With rank r > 0 every targeted projection W [in, out] of
    actor and critic gets W x + (x A B) * alpha / r, A [in, r], B [r, out] zero at the start;
    only the adapters (and the critic's value head) are trained, the base weights are frozen
    and shared by actor, critic and the KL reference (the base: the adapters switched off).

    targets: "all-linear" or comma-separated names from LORA_TARGETS. base_dtype: storage of
    the frozen base weights ("bfloat16" halves them; matmuls still run in the model's compute
    dtype); None keeps the loaded model's.
    """

    rank: int = 0
    alpha: float = 64.0
    targets: str = "all-linear"
    base_dtype: str | None = None

    def __post_init__(self) -> None:
        o = "lora"
        check_int(f"{o}.rank", self.rank, low=0)
        check_number(f"{o}.alpha", self.alpha, 0.0, 1e6, low_open=True)
        names = self.target_modules if isinstance(self.targets, str) else ()
        if not names or len(set(names)) != len(names) or not set(names) <= set(LORA_TARGETS):
            fail(f"{o}.targets", self.targets, f"'all-linear' or comma-separated distinct names "
                  f"from {LORA_TARGETS}")
        if self.base_dtype is not None:
            check_choice(f"{o}.base_dtype", self.base_dtype, LORA_BASE_DTYPES)
            if self.rank == 0:
                fail(f"{o}.base_dtype", self.base_dtype,
                      "None when lora.rank = 0 (LoRA off: the base weights are trained)")

    @property
    def target_modules(self) -> tuple[str, ...]:
        """The targeted projections' names, in LORA_TARGETS order for "all-linear"."""
        if self.targets.strip() == "all-linear":
            return LORA_TARGETS
        return tuple(part.strip() for part in self.targets.split(",") if part.strip())


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything `make_train_step` needs besides the env, codec and model."""

    algo: str = "ppo"
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    filter: FilterConfig = dataclasses.field(default_factory=FilterConfig)
    advantage: AdvantageConfig = dataclasses.field(default_factory=AdvantageConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    collapse: CollapseConfig = dataclasses.field(default_factory=CollapseConfig)
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        check_choice("config.algo", self.algo, ALGOS)
        for name, kind in (("rollout", RolloutConfig), ("filter", FilterConfig),
                           ("advantage", AdvantageConfig), ("loss", LossConfig),
                           ("optim", OptimConfig), ("collapse", CollapseConfig),
                           ("lora", LoraConfig)):
            if not isinstance(getattr(self, name), kind):
                fail(f"config.{name}", getattr(self, name), f"a {kind.__name__}")
        if self.collapse.every and self.rollout.turn_samples:
            # The original computes them only in the full mode (collapse_metrics.py).
            fail("collapse.every", self.collapse.every,
                  f"0 (off): rollout.context_window_mode = "
                  f"{self.rollout.context_window_mode!r} has no whole conversation to score")
        if self.collapse.every and self.rollout.groups < 2:
            fail("collapse.every", self.collapse.every,
                  f"0 (off): the metrics compare prompts and rollout.groups = "
                  f"{self.rollout.groups} gives one")
        for name in ("soft_advantage_reweight", "grpo_advantage_length_weight"):
            if getattr(self.advantage, name) and self.estimator != "grpo":
                fail(f"advantage.{name}", True, f"False with estimator {self.estimator!r}: the "
                     "original applies it to GRPO's advantages only (estimator 'grpo')")
        if self.filter.strategy == "top_k_abs" and self.filter.keep_groups > self.rollout.groups:
            fail("filter.keep_groups", self.filter.keep_groups,
                  f"an int in [1, rollout.groups = {self.rollout.groups}]")
        rows, per = self.kept_rows, self.optim.minibatch_rows
        if rows > per and rows % per:
            fail("optim.minibatch_rows", per,
                  f"a divisor of the {rows} kept rows (kept groups x group_size"
                  f"{' x max_turns' if self.rollout.turn_samples else ''}), or >= {rows}")
        rows //= self.minibatches
        if rows % self.optim.micro_batches:
            fail("optim.micro_batches", self.optim.micro_batches,
                  f"a divisor of the {rows} rows of a mini-batch")
        self.check_estimator()

    def check_estimator(self) -> None:
        """Raises ValueError unless the advantage estimator suits `algo` (a critic for PPO,
        none for GRPO) and reads every advantage field set away from its default, from the
        estimators' metadata (starpo_jax.estimators, which registering an estimator extends)."""
        estimator = self.estimator
        spec = estimator_spec(estimator)
        critic = spec.critic
        if self.algo == "grpo" and critic:
            fail("advantage.estimator", estimator, "one without a critic for algo 'grpo' "
                  "(e.g. 'grpo'), or algo 'ppo'")
        if self.algo == "ppo" and not critic:
            # The critic trains on the estimator's returns; critic-free ones have none.
            fail("advantage.estimator", estimator, "one with a critic for algo 'ppo' "
                  "('gae', 'bi_level_gae'), or algo 'grpo'")
        accepted = spec.params
        for field in dataclasses.fields(AdvantageConfig):
            param = ESTIMATOR_PARAMS.get(field.name)
            value = getattr(self.advantage, field.name)
            if param is not None and param not in accepted and value != field.default:
                names = [f for f, p in ESTIMATOR_PARAMS.items() if p in accepted]
                fail(f"advantage.{field.name}", value,
                      f"its default: estimator {estimator!r} does not read it (it reads: "
                      f"{', '.join(names) or 'none of them'})")

    @property
    def estimator(self) -> str:
        """The advantage estimator's registry name (advantage.estimator, or the algo's own)."""
        if self.advantage.estimator is not None:
            return self.advantage.estimator
        return "gae" if self.algo == "ppo" else "grpo"

    @property
    def kept_rows(self) -> int:
        """Rows the update trains on: kept groups x group_size (x max_turns with turn samples:
        one row per trajectory and turn, as the original's ppo_mini_batch_size counts them)."""
        turns = self.rollout.max_turns if self.rollout.turn_samples else 1
        return self.kept_groups * self.rollout.group_size * turns

    @property
    def minibatches(self) -> int:
        """Mini-batches per epoch: kept rows / minibatch_rows, at least 1."""
        return max(1, self.kept_rows // self.optim.minibatch_rows)

    @property
    def single_update(self) -> bool:
        """Exactly one update per rollout (one mini-batch, one epoch, k = 1): the PPO ratio is
        1 by construction, so no separate old-log-prob forward is needed."""
        o = self.optim
        return self.minibatches == 1 and o.ppo_epochs == 1 and o.rollout_reuse == 1

    @property
    def kept_groups(self) -> int:
        """Kmax groups in the filtered batch, a static bound (filtering.kept_bound); the
        variable-count strategies mask the groups not kept out of the loss."""
        return kept_bound(self.rollout.groups, self.filter)

    def vanilla(self) -> TrainConfig:
        """This config turned into vanilla StarPO: KL 0.001, symmetric clip 0.2, no filter
        (whatever the filter's strategy: every group kept, zero-std ones too): VANILLA_LOSS,
        and the filter section replaced by FilterConfig(**VANILLA_FILTER) (its empty_stop_steps,
        the run's, kept)."""
        kept = {"empty_stop_steps": self.filter.empty_stop_steps}
        return dataclasses.replace(self, filter=FilterConfig(**VANILLA_FILTER, **kept),
                                   loss=dataclasses.replace(self.loss, **VANILLA_LOSS))


# What TrainConfig.vanilla() sets (the `vanilla` switch of a run config, which refuses a config
# that sets any of these keys, or any other key of the filter section, to another value).
VANILLA_LOSS = {"kl_coef": 0.001, "clip_low": 0.2, "clip_high": 0.2}
VANILLA_FILTER = {"keep_ratio": 1.0}  # the whole section: every other field at its default
# (but empty_stop_steps, the run's: TrainConfig.vanilla keeps it)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """What an evaluation runs: envs x modes, `episodes` held-out initial states each."""

    envs: tuple[str, ...]
    # The protocol's sampled mode first (RAGEN's numbers), then greedy (deterministic).
    modes: tuple[str, ...] = ("sampled", "greedy")
    episodes: int = VAL_STATES  # held-out initial states per env (RAGEN's es_manager.val)
    pass_k: int = 1  # sampled mode: rollouts per initial state (RAGEN's val group_size)
    temperature: float = 0.5  # sampled mode (RAGEN's validation temperature)
    samples: int = 4  # conversations per (env, mode) in samples_text
    # The held-out states (and sampling noise) of the run with this seed; None = the run's own.
    # The fixed default gives every run and every training seed the same states: paired
    # comparisons across runs, seeds and resumes.
    seed: int | None = VAL_SEED
    # Rows (states x rollouts) rolled out at once; None = the training rollout's rows per chunk
    # (rollout.groups x group_size / chunks: what the memory check sized). Results do not depend
    # on it (starpo_jax.run.evaluation: per-state reset keys, per-row sampling keys).
    batch: int | None = None

    def __post_init__(self) -> None:
        require("eval.envs", self.envs, bool(self.envs) and all(
            isinstance(e, str) and e for e in self.envs), "one or more env names")
        require("eval.envs", self.envs, len(set(self.envs)) == len(self.envs),
                "env names, none twice")
        require("eval.modes", self.modes, bool(self.modes) and set(self.modes) <= set(EVAL_MODES)
                and len(set(self.modes)) == len(self.modes), f"distinct modes from {EVAL_MODES}")
        for name, low in (("episodes", 1), ("pass_k", 1), ("samples", 0)):
            check_int(f"eval.{name}", getattr(self, name), low)
        require("eval.seed", self.seed, self.seed is None or is_int(self.seed, 0),
                "None (the run's seed) or an int >= 0")
        require("eval.batch", self.batch, self.batch is None or is_int(self.batch, 1),
                "None (the training rollout's rows per chunk) or an int >= 1")
        t = self.temperature
        require("eval.temperature", t, is_number(t) and 0 < t <= 100,
                "a number in (0, 100] (the greedy mode takes the argmax)")


def default_eval_envs(train_env: str) -> tuple[str, ...]:
    """The training env followed by its out-of-distribution variants (none for most envs)."""
    return (train_env,) + OOD_VARIANTS.get(train_env, ())


@dataclasses.dataclass(frozen=True, kw_only=True)
class MonitorConfig:
    """The `monitor` section of an experiment config (a run-level setting, not a TrainConfig).

    action: "warn" logs alerts; "stop" saves a checkpoint and ends the run (exit 0);
    "raise_filter" does the same and writes the halved filter.keep_ratio to resume with.
    """

    enabled: bool = True
    drop: float = 0.5  # fall of reward std / entropy from its peak that alerts, as a fraction
    reward_drop: float = 0.2  # fall of mean reward from its peak beyond which it has "dropped"
    spike: float = 5.0  # grad norm over this multiple of the recent median is a spike
    warmup: int = 5  # steps before peaks are tracked and alerts can fire
    smoothing: float = 0.7  # EMA weight of the past (0: raw values)
    # steps in a row with no valid reply (rollout/action_is_valid = 0) that alert, no warmup;
    # a run's first step with none is a notice at once, which takes no action (0: neither)
    no_valid_steps: int = 2
    action: str = "warn"

    def __post_init__(self) -> None:
        o = "monitor"
        check_bool(f"{o}.enabled", self.enabled)
        check_number(f"{o}.drop", self.drop, 0.0, 1.0, low_open=True, high_open=True)
        check_number(f"{o}.reward_drop", self.reward_drop, 0.0, 1.0)
        check_number(f"{o}.spike", self.spike, 1.0, 1e6, low_open=True)
        check_int(f"{o}.warmup", self.warmup, low=0)
        check_number(f"{o}.smoothing", self.smoothing, 0.0, 1.0, high_open=True)
        check_int(f"{o}.no_valid_steps", self.no_valid_steps, low=0)
        check_choice(f"{o}.action", self.action, ACTIONS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GradientAnalysisConfig:
    """The `gradient_analysis` section of an experiment config (a run-level setting, not a
    TrainConfig: the train step is the same program with it on or off).

    RAGEN-2's gradient analysis (starpo_jax.train.gradient_analysis): every `every` steps (0 =
    off, the original's gradient_analysis_mode False; it analyses every 50 when on), before the
    step's update, the policy-gradient norms of the step's kept rows, bucketed by their group's
    reward std: "quantile" (the kept groups by ascending std into min(num_buckets, groups)
    buckets of equal size, the remainder in the last) or "fixed_rv" (std in [0, 1), [1, 2), ...,
    [5, inf): six buckets, num_buckets not read), plus the bucket "all".
    """

    every: int = 0
    num_buckets: int = 6
    bucket_mode: str = "quantile"

    def __post_init__(self) -> None:
        o = "gradient_analysis"
        check_int(f"{o}.every", self.every, low=0)
        check_int(f"{o}.num_buckets", self.num_buckets)
        check_choice(f"{o}.bucket_mode", self.bucket_mode, BUCKET_MODES)
