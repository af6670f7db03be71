"""starpo-jax: StarPO / StarPO-S multi-turn RL for LLM agents as one compiled JAX program."""

from starpo_jax.xla_cpu import add_cpu_flags as _add_cpu_flags

_add_cpu_flags()  # before JAX starts its CPU backend (starpo_jax/xla_cpu.py)

__version__ = "0.1.0"
