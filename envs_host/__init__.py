"""Python text environments stepped on the host (the original's protocol), beside envs_jax.

Importing this package registers the adapters whose libraries are importable; it does not
import JAX (process pools spawn workers that import it).
"""

from envs_host.base import EnvSettings, HostEnv, HostEnvError
from envs_host.pool import EnvPool, Failure, PoolConfig
from envs_host.registry import (factory, known, make, names, namespaces, register,
                                 register_namespace)

# Importing an adapter registers its names (its library is imported only by an instance).
import envs_host.reasoning_gym_env  # noqa: E402, F401
import envs_host.textarena_env  # noqa: E402, F401
import envs_host.webshop  # noqa: E402, F401
import envs_host.openenv_client  # noqa: E402, F401

__all__ = ["EnvPool", "EnvSettings", "Failure", "HostEnv", "HostEnvError", "PoolConfig",
           "factory", "known", "make", "names", "namespaces", "register",
           "register_namespace"]
