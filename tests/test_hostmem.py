"""starpo_jax.hostmem: when a command re-executes itself with glibc's huge-page tunable, that
the re-executed process has it, and that it removes the page faults it is there to remove."""

import os
import subprocess
import sys

import pytest

from starpo_jax import hostmem

GLIBC = (2, 36)


@pytest.mark.parametrize(
    "environ, mode, glibc, expected",
    [
        ({}, "madvise", GLIBC, hostmem.TUNABLE),
        ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "madvise", GLIBC,
         "glibc.malloc.arena_max=2:" + hostmem.TUNABLE),
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", GLIBC, None),  # the user's
        ({"GLIBC_TUNABLES": hostmem.TUNABLE}, "madvise", GLIBC, None),  # re-executed already
        ({hostmem.OPT_OUT: "0"}, "madvise", GLIBC, None),
        ({hostmem.OPT_OUT: "1"}, "madvise", GLIBC, hostmem.TUNABLE),
        ({}, "always", GLIBC, None),  # the kernel uses huge pages anyway
        ({}, "never", GLIBC, None),
        ({}, None, GLIBC, None),  # no THP (not Linux)
        ({}, "madvise", (2, 34), None),  # the tunable is glibc 2.35's
        ({}, "madvise", None, None),  # musl and others
    ],
)
def test_tunables_only_where_they_help(environ, mode, glibc, expected):
    assert hostmem.tunables_with_huge_pages(environ, mode, glibc) == expected


def test_thp_mode_reads_the_bracketed_choice(tmp_path):
    path = tmp_path / "enabled"
    path.write_text("always [madvise] never\n")
    assert hostmem.thp_mode(str(path)) == "madvise"
    path.write_text("[always] madvise never\n")
    assert hostmem.thp_mode(str(path)) == "always"
    assert hostmem.thp_mode(str(tmp_path / "missing")) is None


def _applies() -> bool:
    return hostmem.tunables_with_huge_pages({}, hostmem.thp_mode(), hostmem.glibc_version()) \
        is not None


def _python(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("GLIBC_TUNABLES", hostmem.OPT_OUT, hostmem.ADDED_MARK)}
    done = subprocess.run([sys.executable, "-c", code], env={**environ, **env},
                          capture_output=True, text=True, timeout=300, check=True)
    return done.stdout


REEXEC = ("import os; print('before', flush=True); from starpo_jax import hostmem; "
          "hostmem.reexec_with_huge_pages(); print(os.environ.get('GLIBC_TUNABLES'))")


def test_reexec_adds_the_tunable_once_and_keeps_the_arguments():
    lines = _python(REEXEC).split()
    if _applies():
        # the first process printed "before", then was replaced by one that ran the same -c code
        assert lines == ["before", "before", hostmem.TUNABLE]
    else:
        assert lines == ["before", "None"]
    assert _python(REEXEC, **{hostmem.OPT_OUT: "0"}).split() == ["before", "None"]


def test_environ_without_huge_pages_undoes_only_what_was_added():
    added = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:" + hostmem.TUNABLE,
             hostmem.ADDED_MARK: "1", "PATH": "/bin"}
    assert hostmem.environ_without_huge_pages(added) == {
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "PATH": "/bin"}
    only = {"GLIBC_TUNABLES": hostmem.TUNABLE, hostmem.ADDED_MARK: "1"}
    assert hostmem.environ_without_huge_pages(only) == {}
    users = {"GLIBC_TUNABLES": hostmem.TUNABLE}  # set by the user, not by reexec: kept
    assert hostmem.environ_without_huge_pages(users) == users


FAULTS = """
import resource, jax, jax.numpy as jnp
x = jnp.ones((18432, 1024), jnp.float32)  # 72 MiB: 18432 pages of 4 KiB
double = jax.jit(lambda x: x * 2.0)
double(x).block_until_ready()
counts = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    out = double(x)
    out.block_until_ready()
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del out
print(min(counts))
"""


@pytest.mark.skipif(not _applies(), reason="no glibc >= 2.35 with THP in madvise mode here")
def test_huge_pages_remove_the_page_faults_of_xla_buffers():
    plain = int(_python(FAULTS, **{hostmem.OPT_OUT: "0"}))
    huge = int(_python(REEXEC.replace("print(os.environ.get('GLIBC_TUNABLES'))", "")
                       + "\n" + FAULTS).split()[-1])
    assert plain >= 18432 * 0.9  # every page of each call's fresh output faults in 4 KiB pages
    assert huge <= plain / 8, (plain, huge)
