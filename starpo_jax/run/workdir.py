"""A run's workdir: one run at a time, writable, and holding what its config.json says.

    check_resumable(workdir)                    # --resume: the workdir holds a run
    with WorkdirLock(workdir):                  # a second run on the workdir fails at once
        check_config(workdir / "config.json", config.to_dict(), resume, RESUMABLE)
        check_free_space(workdir, checkpoint_bytes)
        write_atomically(workdir / "config.json", text)

Every failure here is a RunFault: one line saying what is wrong and how to go on, for the
command line to print without a traceback (experiments/run.py).

The lock is an flock(2) on <workdir>/run.lock, which the kernel drops when its process ends,
however it ends: a killed or crashed run never leaves the workdir locked. The file names its
holder and is removed when the run releases it; a run that finds the name of a holder that is
gone (it did not end cleanly) takes the lock over and says so.

check_workdir makes the checks that need only the file system (a workdir that is a file,
--resume of a workdir that holds no run, checkpoints without --resume, a live run's lock), for
a script to make before it imports JAX; this module imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any, Callable

LOCK_FILE = "run.lock"


class RunFault(RuntimeError):
    """A fault of the run's surroundings (workdir, disk, a diverged update) in one line: what
    happened, what was kept, and how to go on."""


def read_json_object(path: Path) -> dict:
    """The JSON object in `path` (a workdir's config.json): ValueError saying what else it
    holds (not text, not JSON, or JSON that is not an object)."""
    try:
        saved = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(str(error)) from None
    if not isinstance(saved, dict):
        raise ValueError(f"a JSON {type(saved).__name__}, not an object")
    return saved


_held: dict[Path, int] = {}  # workdir -> nesting depth of this process's WorkdirLocks on it


class WorkdirLock:
    """Exclusive use of `workdir` by this process (re-entrant within it); creates the workdir.

    Raises RunFault when another live process holds it, or when the workdir cannot be created
    or written (checked here, before anything slow happens). `say` reports a lock taken over
    from a holder that ended without releasing it.
    """

    def __init__(self, workdir: Path, say: Callable[[str], None] = print):
        self.workdir, self._say = Path(workdir).absolute(), say
        self._fd: int | None = None

    def __enter__(self) -> WorkdirLock:
        if self.workdir in _held:
            _held[self.workdir] += 1
            return self
        path = self.workdir / LOCK_FILE
        check_directory(self.workdir)
        self._created = not self.workdir.exists()
        while True:
            try:
                self.workdir.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:
                raise RunFault(f"workdir {self.workdir} is not writable "
                               f"({error.strerror or error}): fix its permissions or pass "
                               "another --workdir") from None
            if not _flock(fd, fcntl.LOCK_EX):
                holder = _read(fd) or "another process"
                os.close(fd)
                raise _in_use(self.workdir, holder)
            if _is_file_of(fd, path):
                break
            os.close(fd)  # locked as its holder released and removed it: lock the new file
        previous = _read(fd)
        if previous:
            self._say(f"workdir {self.workdir}: taking over the lock of {previous}, which ended "
                      "without releasing it (killed or crashed)")
        try:
            _write(fd, f"run pid {os.getpid()} on {socket.gethostname()}, since "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
        except OSError as error:
            os.close(fd)
            raise RunFault(f"workdir {self.workdir} is not writable ({error.strerror}): free "
                           "space, fix its permissions or pass another --workdir") from None
        self._fd = fd
        _held[self.workdir] = 1
        return self

    def __exit__(self, *exc: Any) -> None:
        _held[self.workdir] -= 1
        if _held[self.workdir] or self._fd is None:
            return
        del _held[self.workdir]
        try:
            _write(self._fd, "")  # empty: released cleanly, nothing to take over
        except OSError:
            pass  # the kernel still drops the lock below; the next run reports a takeover
        with contextlib.suppress(OSError):  # removed while locked (see _is_file_of)
            (self.workdir / LOCK_FILE).unlink()
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
        # A run that stopped before writing anything (e.g. a bad model file) leaves no workdir.
        if self._created and not any(self.workdir.iterdir()):
            with contextlib.suppress(OSError):
                self.workdir.rmdir()

    def release(self) -> None:
        """Releases the lock now, however deeply this process holds it: for a process about to
        end without unwinding (stops.StopRequests' exit before the run's first step)."""
        while self.workdir in _held and self._fd is not None:
            self.__exit__(None, None, None)


def _in_use(workdir: Path, holder: str) -> RunFault:
    return RunFault(f"workdir {workdir} is in use by {holder}: wait for that run to end, or "
                    "pass another --workdir")


def _flock(fd: int, kind: int) -> bool:
    """flock(fd, kind) without waiting, tried a few times over 0.1 s (another process's
    check_workdir holds a shared lock for an instant); False when it stays held."""
    for attempt in range(5):
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt < 4:
                time.sleep(0.025)
    return False


def _is_file_of(fd: int, path: Path) -> bool:
    """Whether `fd` is still the file at `path`: a releasing run removes its lock file while it
    holds it, so a run that opened the file before and locked it after must open it again."""
    try:
        now, held = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def check_directory(workdir: Path) -> None:
    """RunFault when the workdir path names something that is not a directory."""
    if Path(workdir).exists() and not Path(workdir).is_dir():
        raise RunFault(f"workdir {workdir} is a file, not a directory: pass another --workdir")


def newest_checkpoint(workdir: Path) -> int | None:
    """The newest step saved under <workdir>/checkpoints, read from the directory names (orbax
    commits a save by renaming it to <step>/), None when there is none."""
    try:
        steps = [int(p.name) for p in (Path(workdir) / "checkpoints").iterdir()
                 if p.name.isdigit() and p.is_dir()]
    except OSError:  # no checkpoints directory (or not one)
        return None
    return max(steps, default=None)


def check_unlocked(workdir: Path) -> None:
    """RunFault, naming the holder, when a live run holds the workdir's lock (this process's
    own lock excepted); creates nothing."""
    if Path(workdir).absolute() in _held:
        return
    try:
        fd = os.open(Path(workdir) / LOCK_FILE, os.O_RDONLY)
    except OSError:  # no lock file: no run holds it (or one WorkdirLock will name)
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released by the close below
        except BlockingIOError:
            raise _in_use(workdir, _read(fd) or "another process") from None
    finally:
        os.close(fd)


def check_workdir(workdir: Path, resume: bool, lock: bool = True) -> None:
    """The workdir checks that read only the file system, each a one-line error, for a script
    to make before it imports JAX and builds the run (which makes them again), in the run's
    order: RunFault for a workdir that is a file, with `lock` (the process that will take the
    lock) for one in use by a live run (what a second run on it must hear first), and for
    --resume of one that holds no run; FileExistsError for one that holds checkpoints, without
    --resume."""
    check_directory(workdir)
    if lock:
        check_unlocked(workdir)
    if resume:
        check_resumable(workdir)
    elif (step := newest_checkpoint(workdir)) is not None:
        raise FileExistsError(f"{workdir} already holds checkpoints (newest: step {step}); "
                              "pass --resume or another --workdir")


def check_resumable(workdir: Path) -> None:
    """RunFault unless `workdir` holds a run to resume (its config.json): --resume of a new or
    empty workdir is a mistake (a mistyped path), not a fresh start."""
    check_directory(workdir)
    if not (Path(workdir) / "config.json").is_file():
        raise RunFault(f"nothing to resume in {workdir}; run without --resume to start")


def _read(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 4096).decode(errors="replace").strip()


def _write(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)
    os.fsync(fd)


def write_atomically(path: Path, text: str) -> None:
    """path's content becomes `text` all at once (a kill leaves the old file or the new one)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def flat_keys(tree: dict, prefix: str = "") -> dict:
    """{"filter": {"keep_ratio": 0.25}} -> {"filter.keep_ratio": 0.25}."""
    out = {}
    for key, value in tree.items():
        out.update(flat_keys(value, f"{prefix}{key}.") if isinstance(value, dict)
                   else {prefix + key: value})
    return out


def check_config(path: Path, config: dict, resume: bool, resumable: tuple[str, ...],
                 has_checkpoints: bool, defaults: dict | None = None) -> None:
    """Before resuming: `config` (the run's, as a nested dict) agrees with the one saved at
    `path` in every key but those under `resumable`. A key the saved config lacks (a workdir
    written before the key existed) agrees when its value here is its default in `defaults`
    (the schema's defaults as a nested dict): the run behaves as it did. Raises RunFault naming
    the keys that differ with both values, or saying that config.json is missing or not JSON."""
    if not resume:
        return
    if not path.exists():
        if has_checkpoints:
            raise RunFault(f"{path} is missing, so the checkpoints beside it cannot be checked "
                           "against this config: put it back, or pass another --workdir")
        check_resumable(path.parent)
    try:
        saved = read_json_object(path)
    except ValueError as error:
        raise RunFault(f"{path} is not a run config ({error}): was it edited by hand or cut "
                       "short? Restore it, or pass another --workdir") from None
    saved, config = flat_keys(saved), flat_keys(config)
    free = lambda key: any(key == r or key.startswith(r + ".") for r in resumable)  # noqa: E731
    missing = object()
    for key, value in flat_keys(defaults or {}).items():
        if key not in saved and config.get(key, missing) == value:
            saved[key] = value
    changed = sorted(k for k in set(saved) | set(config)
                     if not free(k) and saved.get(k, missing) != config.get(k, missing))
    if changed:
        shown = "; ".join(f"{k}: {saved.get(k, '(absent)')!r} there, "
                          f"{config.get(k, '(absent)')!r} here" for k in changed[:4])
        more = f" (and {len(changed) - 4} more)" if len(changed) > 4 else ""
        raise RunFault(f"--resume with a config that differs from {path} in {changed}: {shown}"
                       f"{more}. Resume with the config that made the workdir (only "
                       f"{list(resumable)} may change), or pass another --workdir")


def check_free_space(workdir: Path, needed: int) -> None:
    """RunFault when the workdir's disk has less than `needed` bytes free (a checkpoint's size:
    the first save would fail)."""
    free = shutil.disk_usage(workdir).free
    if free < needed:
        raise RunFault(f"workdir {workdir} has {free / 2**20:.0f} MiB free, a checkpoint of this "
                       f"run takes about {needed / 2**20:.0f} MiB: free space or pass another "
                       "--workdir")
