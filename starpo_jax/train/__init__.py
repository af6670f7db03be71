"""One training iteration: the state, the compiled step (step.py: rollout, advantages, filter,
update), the teacher-forced forwards (forward.py, shared_prefix.py) and the collapse metrics
(collapse.py)."""

from starpo_jax.train.step import (SKIPPED_UPDATES, Metrics, TrainState, init_train_state,
                                   make_train_fns, rollout_metrics)

__all__ = ["SKIPPED_UPDATES", "Metrics", "TrainState", "init_train_state", "make_train_fns",
           "rollout_metrics"]
