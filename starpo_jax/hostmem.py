"""Huge pages for XLA's CPU buffers: the commands re-execute themselves with glibc's
`glibc.malloc.hugetlb=1` tunable.

XLA's CPU backend takes every output and temporary buffer of a compiled program from malloc.
glibc serves an allocation above its mmap threshold (at most 32 MiB) with a fresh anonymous
mapping and unmaps it when freed, so each step's large buffers (activations, scores, gradients:
gigabytes at the CPU suite's shape) are page-faulted in again on every call, one 4 KiB page at
a time, each zeroed by the kernel. A jitted `x * 2` over a 72 MiB array took 33-41 ms with its
18,432 faults and 8-9 ms in huge pages (`tests/test_hostmem.py` measures the faults). With the
tunable (glibc >= 2.35) malloc advises the kernel to back those mappings with 2 MiB pages
(`madvise(MADV_HUGEPAGE)`): 512x fewer faults, the same memory policy otherwise.

Tunables are read once, when a process starts, so `reexec_with_huge_pages` re-executes the
interpreter with the same arguments and the tunable added to `GLIBC_TUNABLES`, before anything
heavy is imported (a fraction of a second). It does so only where it helps: Linux with glibc >=
2.35 whose transparent huge pages are in "madvise" mode (in "always" mode the kernel already
uses them; in "never" it cannot). `STARPO_JAX_HUGEPAGES=0` turns it off. A notebook cannot
re-execute its kernel: start Jupyter with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` for the same
effect.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping

TUNABLE = "glibc.malloc.hugetlb=1"
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
OPT_OUT = "STARPO_JAX_HUGEPAGES"
#: Set in a re-executed process: TUNABLE in its GLIBC_TUNABLES was added by reexec, not the user.
ADDED_MARK = "STARPO_JAX_HUGEPAGES_ADDED"


def thp_mode(path: str = THP_ENABLED) -> str | None:
    """The kernel's transparent huge page mode ("always", "madvise" or "never"), or None where
    it cannot be read (not Linux, no THP)."""
    try:
        with open(path) as f:
            chosen = re.search(r"\[(\w+)\]", f.read())
    except OSError:
        return None
    return chosen.group(1) if chosen else None


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the C library's glibc, or None for another libc."""
    try:
        name = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        return None
    found = re.fullmatch(r"glibc (\d+)\.(\d+).*", name)
    return (int(found.group(1)), int(found.group(2))) if found else None


def tunables_with_huge_pages(environ: Mapping[str, str], mode: str | None,
                             glibc: tuple[int, int] | None) -> str | None:
    """The GLIBC_TUNABLES value a re-executed process should get, or None to stay as it is:
    already set (by an earlier re-execution or the user), opted out, or no effect expected."""
    current = environ.get("GLIBC_TUNABLES", "")
    if environ.get(OPT_OUT, "1") == "0" or "glibc.malloc.hugetlb" in current:
        return None
    if mode != "madvise" or glibc is None or glibc < (2, 35):
        return None
    return f"{current}:{TUNABLE}" if current else TUNABLE


def reexec_with_huge_pages() -> None:
    """Re-executes this Python process with TUNABLE added (see the module docstring); returns
    without doing anything where it would not help or was done already. Call it first thing in a
    command's `__main__`: the process is replaced, so work done before it is done twice."""
    value = tunables_with_huge_pages(os.environ, thp_mode(), glibc_version())
    if value is None:
        return
    before = os.environ.get("GLIBC_TUNABLES")
    os.environ["GLIBC_TUNABLES"] = value
    os.environ[ADDED_MARK] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    except OSError:  # cannot re-execute (an odd launcher): run on without it
        del os.environ[ADDED_MARK]
        if before is None:
            del os.environ["GLIBC_TUNABLES"]
        else:
            os.environ["GLIBC_TUNABLES"] = before


def environ_without_huge_pages(environ: Mapping[str, str]) -> dict[str, str]:
    """environ less what `reexec_with_huge_pages` added (a user's own tunables are kept): for a
    child process that should run as it would have without this module (bench/step.py's older
    commit, for a side-by-side ratio that includes the huge pages' share)."""
    out = dict(environ)
    if out.pop(ADDED_MARK, None) is None:
        return out
    kept = [t for t in out.pop("GLIBC_TUNABLES", "").split(":") if t and t != TUNABLE]
    if kept:
        out["GLIBC_TUNABLES"] = ":".join(kept)
    return out
