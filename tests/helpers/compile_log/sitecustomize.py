"""Development tool, not a test: logs the XLA compile events of every Python process a test run
starts (the pytest workers, run.py subprocesses, notebook kernels), one JSON line per event with
the test that was running (`PYTEST_CURRENT_TEST`, which subprocesses inherit):

    COMPILE_LOG=/tmp/compile.jsonl PYTHONPATH=tests/helpers/compile_log \\
        python -m pytest -q -n 2 --dist loadfile -m "not serial and not slow"
    python tests/helpers/compile_log/summary.py /tmp/compile.jsonl

Python imports this module at start-up when its folder is on PYTHONPATH. It hooks JAX's
monitoring module as it is imported, so JAX's own configuration from the environment (which
conftest.py sets before importing JAX) is untouched."""

import importlib.abc
import importlib.util
import json
import os
import sys
import threading

LOG = os.environ.get("COMPILE_LOG")


def _listen(monitoring) -> None:
    lock = threading.Lock()

    def write(event: str, value: float) -> None:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
        line = json.dumps({"pid": os.getpid(), "test": test, "event": event, "value": value})
        try:
            with lock, open(LOG, "a") as f:
                f.write(line + "\n")
        except OSError:  # a test that fills the disk on purpose (RLIMIT_FSIZE)
            pass

    monitoring.register_event_duration_secs_listener(lambda e, d, **_: write(e, d))
    monitoring.register_event_listener(lambda e, **_: write(e, 1.0))


class _Hook(importlib.abc.MetaPathFinder):
    """Registers the listeners once jax._src.monitoring has been executed."""

    def find_spec(self, name, path, target=None):
        if name != "jax._src.monitoring":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _listen(module)

        spec.loader.exec_module = exec_module
        return spec


if LOG:
    sys.meta_path.insert(0, _Hook())
