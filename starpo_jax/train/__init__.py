"""One training iteration: the state and its initialisation (state.py), the learner built
without an env or codec (learner.py: prepare, update, learn; batch.py its typed batches), the
metrics (metrics.py), the compiled step of a JAX env (step.py: rollout + learner, the key
schedule), the teacher-forced forwards (forward.py, shared_prefix.py) and the collapse metrics
(collapse.py)."""

from starpo_jax.train.learner import make_learner
from starpo_jax.train.metrics import SKIPPED_UPDATES, Metrics, rollout_metrics
from starpo_jax.train.state import TrainState, init_train_state
from starpo_jax.train.step import make_train_fns, make_train_step, step_keys

__all__ = ["SKIPPED_UPDATES", "Metrics", "TrainState", "init_train_state", "make_learner",
           "make_train_fns", "make_train_step", "rollout_metrics", "step_keys"]
