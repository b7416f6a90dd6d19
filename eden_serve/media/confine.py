"""What a sandboxed decoder process may do (:mod:`.sandbox`): resource limits, and a seccomp filter
that allows only the system calls decoding takes.

The filter is an allow-list; every other call fails with EPERM (``clone3`` with ENOSYS, so that the C
library creates threads with ``clone``). So the child cannot open a file or a socket, run a program,
start a process (``clone`` only with ``CLONE_THREAD``), signal any process (an ``abort()`` still
ends it: the C library then stops it with a fault), or raise its limits again (``prlimit64`` only to
read them), whoever it runs as. It uses libseccomp through
:mod:`pyseccomp`; where either is missing, the child runs with the limits alone, and says so once.
"""

from __future__ import annotations

import errno
import os
import resource
import signal

# Address space a child may add to what it holds when forked, besides the frames: a decoder's
# reference frames and threads' stacks.
MEMORY_BYTES = 1 << 30
CPU_SECONDS = 120  # a decoder's threads together: a child past the worker's deadline is killed sooner
CLONE_THREAD = 0x00010000
ALLOWED = (
    "read", "write", "readv", "writev", "pread64", "recvfrom", "sendto", "recvmsg", "sendmsg", "close", "fstat", "newfstatat",
    "lseek", "mmap", "munmap", "mprotect", "mremap", "brk", "madvise", "futex", "set_robust_list", "rseq", "rt_sigprocmask",
    "rt_sigaction", "rt_sigreturn", "sigaltstack", "exit", "exit_group", "getpid", "gettid", "sched_getaffinity",
    "sched_yield", "clock_gettime", "clock_nanosleep", "nanosleep", "poll", "ppoll", "getrandom", "membarrier",
)


def _address_space() -> int:
    with open("/proc/self/statm") as status:
        return int(status.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def limit(keep: int, frames_bytes: int) -> None:
    """No file descriptor but ``keep`` and the standard ones, and the resource limits."""
    os.closerange(3, keep)
    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write to a file fails instead
    space = _address_space() + frames_bytes + MEMORY_BYTES
    for name, value in (("RLIMIT_CORE", 0), ("RLIMIT_FSIZE", 0), ("RLIMIT_NOFILE", 16), ("RLIMIT_AS", space),
                        ("RLIMIT_CPU", CPU_SECONDS)):
        resource.setrlimit(getattr(resource, name), (value, value))


def seccomp_filter():
    """The filter, not yet loaded; None where pyseccomp or libseccomp is missing."""
    try:
        import pyseccomp as seccomp

        rules = seccomp.SyscallFilter(seccomp.ERRNO(errno.EPERM))
    except (ImportError, OSError, RuntimeError):
        return None
    for name in ALLOWED:
        rules.add_rule(seccomp.ALLOW, name)
    rules.add_rule(seccomp.ALLOW, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_THREAD, CLONE_THREAD))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    rules.add_rule(seccomp.ALLOW, "prlimit64", seccomp.Arg(2, seccomp.EQ, 0))
    return rules


def confine(keep: int, frames_bytes: int, rules) -> None:
    """Confines this (just forked) process: :func:`limit`, then ``rules`` (:func:`seccomp_filter`'s,
    None: none)."""
    limit(keep, frames_bytes)
    if rules is not None:
        rules.load()
