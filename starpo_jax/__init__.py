"""starpo-jax: StarPO / StarPO-S multi-turn RL for LLM agents as one compiled JAX program."""

__version__ = "0.1.0"
