"""Building an experiment: one config in, a ready-to-step experiment out (users reach these
names through the facade, `from starpo_jax import api`).

    from starpo_jax.run import experiment
    config = experiment.config_for("bandit", "grpo")  # an ml_collections ConfigDict
    config.model.source = "tiny-random"
    exp = experiment.build(config)                    # env, model, tokenizer, codec, state, step
    metrics = exp.step()                              # one StarPO iteration -> {name: float}
    exp.state.step                                    # the TrainState (int32 step counter inside)

`build` checks the whole config first (unknown keys, bad values: named, with what is valid)
and only then loads the model and compiles. The key of iteration t is fold_in(key(seed), t)
(train/step.py), so the numbers depend only on (config, seed, step): a resumed run repeats a run
never stopped.
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from typing import Any, Callable

import jax
from flax import nnx

import envs_host
import envs_jax
from starpo_jax.train.collapse import drop_uncomputed
from starpo_jax.config import TrainConfig
from starpo_jax.run import announce
from starpo_jax.run.evaluation import EvalConfig, Evaluator
from starpo_jax.sizing import autofit, speed
from starpo_jax.sizing.memory import (MemoryPlan, budget, host_available_bytes, release_freed_heap,
                               step_plan)
from starpo_jax.models import load_pretrained
from starpo_jax.models.config import resolve_matmul_precision
from starpo_jax.models.lora import adapted
from starpo_jax.phases import StepProgress
from starpo_jax.rollout.jax_env import buffer_length
from starpo_jax.run.schema import (AUTO, DTYPES, ENV_SETTINGS, SECTIONS,  # noqa: F401 (API)
                                   ConfigDict, auto_knobs, check_config, config_for,
                                   config_from_train_config,
                                   default_config, eval_config, make_env, merged_config,
                                   paper_eval,
                                   read_run_config, require_valid, train_config)
from starpo_jax.models.sharding import make_mesh, shard_state
from starpo_jax.run.checkpoint import load_init_weights
from starpo_jax.text import build_codec
from starpo_jax.train.step import TrainState, init_train_state, make_train_step, shared_width

def _codec(full: ConfigDict, train: TrainConfig, tokenizer: Any, env: Any) -> Any:
    """The codec of `env` for the policy's tokenizer, with the run's mode and prompt."""
    template = {k: v for k, v in full.prompt.items() if k != "verify" and v is not None}
    return build_codec(tokenizer, env, mode=train.rollout.mode,
                       max_actions_per_turn=train.rollout.max_actions_per_turn,
                       max_actions_per_traj=train.rollout.max_actions_per_traj,
                       max_tokens=train.rollout.announced_tokens, verify=full.prompt.verify,
                       single_turn=train.rollout.context_window_mode == "single_turn", **template)


@dataclasses.dataclass
class Experiment:
    """A built experiment. `step()` advances `state` by one compiled StarPO iteration."""

    config: ConfigDict
    train: TrainConfig
    env: envs_jax.TextEnv
    model: Any  # Decoder: its graph and initial weights
    tokenizer: Any
    codec: Any  # Codec
    state: TrainState
    train_step: Callable[[TrainState, jax.Array], tuple[TrainState, dict[str, jax.Array]]]
    key: jax.Array  # the run's key; iteration t uses fold_in(key, t)
    init_key: jax.Array  # the critic head's initialisation key
    mesh: jax.sharding.Mesh | None = None  # set when the run spans several devices
    progress: StepProgress | None = None  # the step's phase clock (config.progress_after)
    # The memory knobs still to choose (auto_knobs) and, once chosen, the choice.
    auto: tuple[str, ...] = ()
    memory: autofit.Choice | None = None
    _steps: dict = dataclasses.field(default_factory=dict, repr=False)  # see use()
    # TrainConfig -> its GradientAnalysis, built on the first step that analyses (analyse()).
    _analyses: dict = dataclasses.field(default_factory=dict, repr=False)

    def step(self, key: jax.Array | None = None) -> dict[str, float]:
        """One iteration (rollout, filter, update) -> its metrics as host floats. `key`
        defaults to the run's key; the state's step counter is folded in either way. The
        first call chooses the unset memory knobs (check_memory; self.memory.line() says
        what and why) unless the step is not this Experiment's own (a step function swapped in
        with dataclasses.replace runs as given: it cannot be compiled again with other knobs)."""
        if self.auto and self.memory is None and self.sizes_its_step:
            check_memory(self)
        if self.progress is not None:
            self.progress.start(self.steps_done + 1)
        key = self.key if key is None else key
        analysed = self.analyse(key)  # before the step, which donates the state
        self.state, metrics = self.train_step(self.state, key)
        return {**drop_uncomputed({name: float(value)
                                   for name, value in jax.device_get(metrics).items()}),
                **analysed}

    def analyse(self, key: jax.Array) -> dict[str, float]:
        """RAGEN-2's gradient analysis of the step about to run (config.gradient_analysis,
        starpo_jax.train.gradient_analysis: its own program, compiled on first use), when due;
        {} otherwise."""
        section = self.config.get("gradient_analysis")
        if section is None or not section.every or self.steps_done % section.every:
            return {}
        from starpo_jax.train.gradient_analysis import GradientAnalysis
        if self.train not in self._analyses:
            with announce.phase("gradient analysis", ": compiling its program, then running it"):
                self._analyses[self.train] = GradientAnalysis.of(self)
                return self._analyses[self.train](self.state, key)
        return self._analyses[self.train](self.state, key)

    def fresh_state(self) -> TrainState:
        """The step-0 state of this config (the compiled step is reused)."""
        state = init_train_state(self.train, self.init_key, model=self.model)
        return state if self.mesh is None else shard_state(state, self.model, self.mesh)

    def use(self, train: TrainConfig) -> None:
        """Steps with `train` from now on (another setting of the memory knobs: the state is
        the same). Each TrainConfig's jitted step is kept: going back to one reuses its
        compile."""
        if train not in self._steps:
            after = self.config.progress_after if self.progress is None else self.progress.after
            clock = _phase_clock(after, self.config.steps, train, self.mesh,  # the model's
                                 self.estimated_step_seconds(train, speed.REFERENCE))  # own CPU
            self._steps[train] = clock, make_train_step(
                train, self.env, self.codec, model=self.model, mesh=self.mesh, phase_clock=clock,
                eos_id=self.tokenizer.eos_token_id, pad_id=self.tokenizer.pad_token_id)
        self.train = train
        self.progress, self.train_step = self._steps[train]

    @property
    def own_step(self) -> bool:
        """Whether train_step is the step this Experiment compiled for `train` (not a function
        swapped in, which can be neither sized nor compiled again with other knobs)."""
        return self._steps.get(self.train, (None, None))[1] is self.train_step

    @property
    def sizes_its_step(self) -> bool:
        """Whether check_memory applies: config.check_memory is on and the step is one program
        this Experiment compiled (its own_step, and not a host env's, whose rollout runs on the
        host)."""
        return (self.config.check_memory and self.own_step
                and not envs_host.known(self.config.env.name))

    @property
    def steps_done(self) -> int:
        return int(self.state.step)

    def evaluator(self) -> Evaluator:
        """The evaluator of this experiment (build_evaluator; an SFT experiment adds its
        held-out loss)."""
        return build_evaluator(self)

    def estimated_step_seconds(self, train: TrainConfig | None = None,
                               rate: speed.MatmulRate | None = None) -> float | None:
        """autofit's step-time model (fitted to a 2-core CPU's measured phases, every reply at
        its full budget) for the step of `train` (default: the current one), in seconds at the
        f32 matmul rate `rate` (default: this machine's, timed once per process:
        speed.matmul_rate; speed.REFERENCE: the fitted CPU's); None where the model does not
        apply (a host env's rollout steps Python envs, a multi-device mesh, an accelerator)."""
        if (envs_host.known(self.config.env.name) or self.mesh is not None
                or jax.default_backend() != "cpu"):
            return None
        train = self.train if train is None else train
        modelled = autofit.relative_time(step_shape(self, train), train,
                                         autofit.Settings.of(train))
        return speed.step_seconds(modelled, speed.matmul_rate() if rate is None else rate)


# A step whose modelled time (autofit's, fitted to a slow 2-core CPU) is under this share of
# progress_after gets no phase marks: it would print no progress line even on a machine this
# many times slower than the model's, and a program without host callbacks is one JAX's
# persistent compilation cache keeps (compile_cache.py), so --resume, evaluate.py and the
# next point of a sweep load the step instead of compiling it.
PROGRESS_MARGIN = 0.25


def _phase_clock(after: float, steps: int, train: TrainConfig, mesh: jax.sharding.Mesh | None,
                 estimate: float | None = None) -> StepProgress | None:
    # Each mark is a host round trip inside the step: kept to CPU runs whose steps may take
    # minutes; on accelerators the step stays free of callbacks.
    if not after or mesh is not None or jax.default_backend() != "cpu":
        return None
    if estimate is not None and estimate < PROGRESS_MARGIN * after:
        return None
    return StepProgress(after, train.rollout.chunks, steps)


def run_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """(init key, run key) of a run with `seed`: the critic's initialisation and the key whose
    fold_in(key, t) is iteration t's (and whose EVAL_STREAM holds the held-out states)."""
    init_key, key = jax.random.split(jax.random.PRNGKey(seed))
    return init_key, key


def build(config: ConfigDict | TrainConfig, **top: Any) -> Experiment:
    """Checks `config` (a ConfigDict like default_config(), or a TrainConfig plus top-level keys
    in `top`), then loads the model, builds the env and codec, the initial state and the
    jitted step. Raises ValueError naming a bad key or value before anything is compiled.
    Memory knobs left unset are chosen by check_memory (or the first step()), not here. Each
    phase says what it does as it starts (starpo_jax.run.announce: "loading model ...")."""
    if isinstance(config, TrainConfig):
        config = config_from_train_config(config, **top)
    elif top:
        raise TypeError(f"keyword arguments {sorted(top)} only go with a TrainConfig")
    train = train_config(config)
    full = merged_config(config)
    host = envs_host.known(full.env.name)
    if host and (jax.process_count() > 1 or jax.device_count() > 1):
        raise ValueError(f"env.name = {full.env.name!r} is a host env; host envs train on one "
                         f"device, this run sees {jax.device_count()}")
    # The prelude of every run, JAX or host env: the model, its starting weights, the keys.
    with announce.phase(f"loading model {full.model.source}"):
        model, tok = load_pretrained(full.model.source, full.model.dtype)
    if full.model.init_from:
        with announce.phase(f"loading the starting weights: {full.model.init_from}'s newest "
                            "checkpoint"):
            model = load_init_weights(model, full.model.init_from, full.model.source,
                                      full.model.dtype)
    model.config = dataclasses.replace(model.config, matmul_precision=resolve_matmul_precision(
        full.model.matmul_precision, jax.default_backend()))
    init_key, key = run_keys(full.seed)
    # With LoRA the model gains its adapters here (the key init_train_state would use), so that
    # the evaluator and the rollout read the same graph.
    model = adapted(model, train.lora, jax.random.fold_in(init_key, 1))
    with announce.phase(f"building the {full.env.name} env, prompts and train state"):
        return _assemble(full, train, model, tok, key, init_key, host)


def _assemble(full: ConfigDict, train: TrainConfig, model: Any, tok: Any, key: jax.Array,
              init_key: jax.Array, host: bool) -> Experiment:
    """build's Experiment around a loaded model: env, codec, initial state and jitted step."""
    if host:
        from starpo_jax.run import host_train  # the host pool and text layer: host runs only
        env, text, step = host_train.build_step(full, train, model, tok)
        exp = Experiment(config=full, train=train, env=env, model=model, tokenizer=tok,
                         codec=text, state=None, train_step=step, key=key, init_key=init_key)
        exp.state = exp.fresh_state()
        return exp
    env = make_env(full)
    codec = _codec(full, train, tok, env)
    mesh = None
    if jax.process_count() > 1 or jax.device_count() > 1:
        require_valid("mesh.tp", full.mesh.tp, jax.device_count() % full.mesh.tp == 0,
                 f"a divisor of the {jax.device_count()} devices")
        mesh = make_mesh(full.mesh.tp)
        # Every process holds the same key; placed replicated on the global mesh so that the
        # step's argument spans all processes (a process-local array cannot).
        key = jax.device_put(key, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    exp = Experiment(config=full, train=train, env=env, model=model, tokenizer=tok, codec=codec,
                     state=None, train_step=None, key=key, init_key=init_key, mesh=mesh,
                     auto=auto_knobs(full))
    exp.state = exp.fresh_state()
    exp.use(train)
    release_freed_heap()  # what loading the weights freed
    return exp


def memory_plan(exp: Experiment, available: Callable[[], int | None] = host_available_bytes,
                ) -> MemoryPlan:
    """Compiles `exp`'s step (its first call then reuses the executable) and sizes XLA's memory
    plan against the free memory of the devices it runs on (starpo_jax.sizing.memory)."""
    return step_plan(exp.train_step, exp.state, exp.key, available=available)


def shrink_hint(train: TrainConfig) -> str:
    """The settings that make a step need less memory, with their values in `train`."""
    o, r = train.optim, train.rollout
    rows = train.kept_rows // train.minibatches
    return (f"Settings that shrink it: optim.micro_batches (now {o.micro_batches}; a divisor of "
            f"the {rows} rows of a mini-batch), optim.remat=True (now {o.remat}), "
            f"rollout.cache_dtype='bfloat16' (now {r.cache_dtype!r}), rollout.chunks (now "
            f"{r.chunks}; a divisor of rollout.groups = {r.groups}), a smaller "
            f"optim.minibatch_rows (now {o.minibatch_rows}), or smaller rollout.groups / "
            "group_size / reply_tokens / max_turns. check_memory=False runs it anyway.")


def check_memory(exp: Experiment, anywhere: Callable[[bool], bool] = bool,
                 available: Callable[[], int | None] = host_available_bytes,
                 smallest: Callable[[int], int] = int) -> MemoryPlan:
    """Compiles the step and sizes it against the free memory (`available()`: bytes, the
    host's MemAvailable on CPU); returns its plan. With memory knobs unset (exp.auto), first
    chooses them (starpo_jax.sizing.autofit; exp.memory holds the choice, exp.train and the step
    take it). Raises MemoryError, naming the settings that shrink the step, when it does not
    fit (chosen settings: within autofit.MARGIN of the free memory). Multi-process runs:
    anywhere(flag) = whether flag is set on any process, smallest(n) = the least n of all
    processes (starpo_jax.run.distributed), so that all choose alike and stop together."""
    chosen = exp.auto and exp.memory is None
    if chosen:
        free, where, _ = budget(available)
        if free is None:  # nothing to size against: the fastest settings stay
            exp.auto, chosen = (), False
        else:
            exp.memory = _choose(exp, smallest(free), where, available)
    with announce.phase("compiling the train step") if not chosen else nullcontext():
        plan = memory_plan(exp, available)  # a chosen step: its compile is reused
    release_freed_heap()  # what compiling freed
    if anywhere(not plan.fits):
        here = str(plan) if not plan.fits else f"on another process (this one: {plan})"
        raise MemoryError(f"the compiled train step would not fit: {here}. "
                          f"{shrink_hint(exp.train)}")
    return plan


def pin_memory(exp: Experiment, settings: dict[str, Any]) -> None:
    """Gives exp's unset memory knobs the values in `settings` ({"optim.micro_batches": 4,
    ...}, an earlier choice: autofit.Choice.record()["settings"]); check_memory then checks
    them as set ones. A resumed run (experiments/run.py) steps as the run it continues."""
    values = autofit.Settings.of(exp.train).values()
    values.update({k: settings[k] for k in exp.auto if k in settings})
    exp.use(autofit.Settings(*values.values()).apply(exp.train))
    exp.auto = ()


def step_shape(exp: Experiment, train: TrainConfig | None = None) -> autofit.StepShape:
    """What autofit's estimates need of `exp`'s step of `train` (default: its current one)."""
    train = exp.train if train is None else train
    return autofit.StepShape.of(train, exp.model.config, buffer_length(exp.codec, train.rollout),
                                sum(x.nbytes for x in jax.tree.leaves(exp.state)),
                                shared_width(train, exp.codec, exp.mesh))


def expected_step_seconds(exp: Experiment,
                          available: Callable[[], int | None] = host_available_bytes,
                          ) -> float | None:
    """exp.estimated_step_seconds() before anything is compiled: with memory knobs left unset,
    for the settings check_memory compiles first (autofit.choose's first pick: the fastest
    candidate whose estimated plan fits the free memory; the compiles may then choose a slower
    one). None where the step-time model does not apply."""
    if exp.estimated_step_seconds() is None or not (exp.auto and exp.memory is None
                                                    and exp.sizes_its_step):
        return exp.estimated_step_seconds()
    free = budget(available)[0]
    if free is None:  # check_memory keeps the fastest settings
        return exp.estimated_step_seconds()
    shape = step_shape(exp)
    candidates = autofit.options(exp.train, exp.auto, shape)
    need = lambda s: shape.state_bytes + max(autofit.estimate(shape, s))  # noqa: E731
    fits = [s for s in candidates if need(s) <= (1 - autofit.MARGIN) * free]
    first = fits[0] if fits else min(reversed(candidates), key=need)
    return exp.estimated_step_seconds(first.apply(exp.train))


def _choose(exp: Experiment, free: int, where: str,
            available: Callable[[], int | None]) -> autofit.Choice:
    """autofit.choose over exp's unset knobs; exp then steps with the chosen settings, through
    the jitted step their compile was made for (so it is not compiled again)."""
    base = exp.train

    def plan_of(settings: autofit.Settings) -> int:
        exp.use(settings.apply(base))
        with announce.phase("compiling the train step", f" with {settings.describe(exp.auto)} "
                            "(choosing the memory settings left unset)"):
            return memory_plan(exp, available).needed

    shape = step_shape(exp)
    try:
        choice = autofit.choose(autofit.options(base, exp.auto, shape), shape, plan_of, free, where,
                                exp.auto, shrink_hint(base))
    except MemoryError:
        exp.use(base)
        raise
    exp.use(choice.settings.apply(base))
    return choice


def build_evaluator(exp: Experiment) -> Evaluator:
    """The Evaluator of `exp`'s eval section: codecs for the OOD envs built like the training
    one (same tokenizer, mode and prompt), held-out keys from the run's key. Nothing compiles
    until its first evaluation; eval.seed set: the held-out states of that seed's run. For a
    host env, a host_train.HostEvaluator (same interface)."""
    config = eval_config(exp.config)
    key = eval_run_key(exp, config)
    if envs_host.known(exp.config.env.name):
        from starpo_jax.run import host_train

        return host_train.build_evaluator(exp, config, key)
    envs = eval_envs(exp, config)
    return Evaluator(nnx.graphdef(exp.model), exp.tokenizer, envs, exp.train.rollout, config,
                     key, eos_id=exp.tokenizer.eos_token_id, pad_id=exp.tokenizer.pad_token_id)


def eval_run_key(exp: Experiment, config: EvalConfig) -> jax.Array:
    """The run key whose EVAL_STREAM holds the held-out states: exp's, or eval.seed's run's."""
    return exp.key if config.seed is None else run_keys(config.seed)[1]


def eval_envs(exp: Experiment, config: EvalConfig) -> dict[str, tuple[Any, Any]]:
    """name -> (env, codec) of each eval env of a JAX-env experiment: the training env's own,
    the others' codecs built like it (same tokenizer, mode and prompt)."""
    envs = {}
    for name in config.envs:
        env = exp.env if name == exp.config.env.name else envs_jax.make(name)
        codec = exp.codec if env is exp.env else _codec(exp.config, exp.train, exp.tokenizer, env)
        envs[name] = (env, codec)
    return envs


# ---------------------------------------------------------------- SFT warm start (starpo_jax.run.sft)


def demonstrations(exp: Experiment, policy: str | Callable[[Any, jax.Array], jax.Array],
                   key: jax.Array, groups: int | None = None) -> Any:
    """A Rollout of demonstrations in `exp`'s env, codec and rollout shape (`groups` initial
    states, default rollout.groups, x group_size rows): `policy` is a name
    (policies.POLICY_NAMES) or a function (env_state, key) -> actions [A] int32 (-1 padded).
    demonstrations.transcripts(out, exp.tokenizer, exp.codec) turns it into chat transcripts."""
    from starpo_jax.rollout.demonstrations import build_reply_encoder, demonstrate
    r = exp.train.rollout
    if isinstance(policy, str):
        policy = _policy(exp, policy, exp.env)
    encoder = build_reply_encoder(exp.tokenizer, exp.env, exp.codec,
                                  max_actions_per_turn=r.max_actions_per_turn)
    shape = dataclasses.replace(r, groups=groups or r.groups, chunks=1)
    return jax.jit(lambda k: demonstrate(exp.env, exp.codec, shape, policy, encoder, k,
                                         eos_id=exp.tokenizer.eos_token_id,
                                         pad_id=exp.tokenizer.pad_token_id))(key)


def _policy(exp: Experiment, name: str, env: Any) -> Callable[[Any, jax.Array], jax.Array]:
    from starpo_jax.rollout.policies import make_policy
    r = exp.train.rollout
    return make_policy(name, env, max_actions_per_turn=r.max_actions_per_turn,
                       max_turns=r.max_turns, max_actions_per_traj=r.max_actions_per_traj)


def policy_baseline(exp: Experiment, policy: str) -> dict[str, float]:
    """The scripted `policy`'s (policies.POLICY_NAMES) evaluation on exp's held-out states:
    one demonstration per initial state of each eval env (build_evaluator's states: the same
    reset keys and sampling key), as val/<env>/<mode>/<metric> (evaluation.eval_metrics; every
    mode holds the same rollouts: a scripted policy has no temperature). Envs the policy cannot
    play (no solver for a two-box Sokoban) are left out. For reference rows next to a policy's
    evaluation (the random policy, the solver)."""
    from starpo_jax.rollout.demonstrations import build_reply_encoder, demonstrate
    from starpo_jax.run.evaluation import eval_metrics, heldout_keys, metric_env
    config = eval_config(exp.config)
    reset_key, sample_key = heldout_keys(eval_run_key(exp, config))
    shape = dataclasses.replace(exp.train.rollout, groups=config.episodes, group_size=1)
    metrics = {}
    for name, (env, codec) in eval_envs(exp, config).items():
        try:
            play = _policy(exp, policy, env)
        except ValueError:  # this policy has no version for this env
            continue
        encoder = build_reply_encoder(exp.tokenizer, env, codec,
                                      max_actions_per_turn=shape.max_actions_per_turn)
        out = jax.jit(lambda k, rk: demonstrate(
            env, codec, shape, play, encoder, k, eos_id=exp.tokenizer.eos_token_id,
            pad_id=exp.tokenizer.pad_token_id, reset_key=rk))(sample_key, reset_key)
        values = jax.device_get(eval_metrics(out, 1))
        metrics.update({f"val/{metric_env(name)}/{mode}/{k}": float(v) for mode in config.modes
                        for k, v in values.items()})
    return metrics
