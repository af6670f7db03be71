"""Imports jumanji without its notebook side effect; imported first by envs_jax/__init__.py.

Imported inside a Jupyter kernel, jumanji runs `%matplotlib ipympl`, which raises unless the
optional ipympl widget package is installed (and swaps the kernel's backend for a widget one if
it is). Importing it once here with IPython hidden from that check makes `import envs_jax` work
in a notebook and keeps the kernel's own matplotlib backend.
"""

import builtins

_ipython = getattr(builtins, "__IPYTHON__", None)
if _ipython:
    del builtins.__IPYTHON__
    try:
        import jumanji  # noqa: F401
    finally:
        builtins.__IPYTHON__ = _ipython
