"""Rollouts: the policy playing its environments. jax_env.py runs JAX envs inside the compiled
step; host.py runs Python envs (host_text.py renders their text) between compiled turns; both
generate with sampling.py and return the same `Rollout`. policies.py and demonstrations.py
play scripted replies (baselines, SFT data) through the same loops."""

from starpo_jax.rollout.host import host_rollout
from starpo_jax.rollout.jax_env import Rollout, buffer_length, rollout

__all__ = ["Rollout", "buffer_length", "host_rollout", "rollout"]
