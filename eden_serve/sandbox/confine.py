"""What a sandboxed decoder process may do (:mod:`.zygote`): resource limits, and a seccomp filter
that allows only the system calls decoding takes.

The filter is an allow-list; every other call fails with EPERM (``clone3`` with ENOSYS, so that the C
library creates threads with ``clone``). So the child cannot open a file or a socket, run a program,
start a process (``clone`` only with ``CLONE_THREAD``), signal any process (an ``abort()`` still
ends it: the C library then stops it with a fault), or raise its limits again (``prlimit64`` only to
read them), whoever it runs as; ``fcntl`` only duplicates a file (within its 16), as mapping one takes. It uses libseccomp through
:mod:`pyseccomp`; where either is missing, the child runs with the limits alone, and says so once.

A child's tasks (its threads) are capped at :data:`MAX_TASKS`: by a pids cgroup of its own where this
process may make one (:class:`Tasks`: root, or a delegated cgroup), else by ``RLIMIT_NPROC`` over
the tasks its user runs already (which root, and a process with ``CAP_SYS_RESOURCE``, pass).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import resource
import signal
import time
from pathlib import Path

# Address space a child may add to what it holds when forked, besides the frames: a decoder's
# reference frames and threads' stacks.
MEMORY_BYTES = 1 << 30
CPU_SECONDS = 120  # a decoder's threads together: a child past the worker's deadline is killed sooner
MAX_TASKS = 16  # a child's threads, its decoder's (sandbox.decoder.DECODER_THREADS) among them
CLONE_THREAD = 0x00010000
ALLOWED = (
    "read", "write", "readv", "writev", "pread64", "recvfrom", "sendto", "recvmsg", "sendmsg", "close", "fstat", "newfstatat",
    "lseek", "mmap", "munmap", "mprotect", "mremap", "brk", "madvise", "futex", "set_robust_list", "rseq", "rt_sigprocmask",
    "rt_sigaction", "rt_sigreturn", "sigaltstack", "exit", "exit_group", "getpid", "gettid", "sched_getaffinity",
    "sched_yield", "clock_gettime", "clock_nanosleep", "nanosleep", "poll", "ppoll", "getrandom", "membarrier",
)


def cpu_seconds(pid: int) -> float:
    """The user and system seconds process ``pid`` has run (all its threads, not its children), as
    the kernel counts them: what :data:`CPU_SECONDS` limits."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _address_space() -> int:
    with open("/proc/self/statm") as status:
        return int(status.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _user_tasks() -> int:
    """The tasks (threads) of this process's real user now: what ``RLIMIT_NPROC`` counts."""
    uid, count = os.getuid(), 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:  # ended meanwhile
            continue
        if int(fields.get("Uid", "-1 ").split()[0]) == uid:
            count += int(fields.get("Threads", "1"))
    return count


class Tasks:
    """The pids cgroups of one zygote's children, ``MAX_TASKS`` tasks each, under the pids cgroup the
    zygote runs in (cgroup v1 or v2); :meth:`make` is None where no cgroup can be made there."""

    PREFIX = "eden-sandbox-"

    def __init__(self):
        parent = pids_cgroup()
        self.base = None if parent is None else self.of(os.getpid(), parent)
        self.made = itertools.count()
        if parent is None:
            return
        try:
            self.base.mkdir(exist_ok=True)
        except OSError:
            self.base = None
            return
        for stale in parent.glob(f"{self.PREFIX}*"):  # of zygotes killed before they removed their own
            pid = stale.name[len(self.PREFIX):]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                remove(stale)

    @classmethod
    def of(cls, pid: int, parent: Path) -> Path:
        """Where the zygote ``pid``'s groups are."""
        return parent / f"{cls.PREFIX}{pid}"

    def make(self) -> Path | None:
        """A new child's group (the groups of children gone are removed first)."""
        if self.base is None:
            return None
        for old in self.base.iterdir():
            if old.is_dir():
                _rmdir(old)
        group = self.base / str(next(self.made))
        try:
            group.mkdir()
            (group / "pids.max").write_text(str(MAX_TASKS))
        except OSError:
            _rmdir(group)
            return None
        return group

    def close(self) -> None:
        if self.base is not None:
            remove(self.base)

    @staticmethod
    def place(group: Path | None, pid: int) -> None:
        """The child ``pid``'s tasks capped before it is handed a job (so before the next
        :meth:`make` would find its group empty and remove it): in ``group``, else by
        ``RLIMIT_NPROC`` at the tasks its user runs now plus :data:`MAX_TASKS`."""
        if group is not None:
            try:
                (group / "cgroup.procs").write_text(str(pid))
                return
            except OSError:
                pass
        tasks = _user_tasks() + MAX_TASKS
        resource.prlimit(pid, resource.RLIMIT_NPROC, (tasks, tasks))


def pids_cgroup() -> Path | None:
    """The pids cgroup this process runs in (cgroup v1, or v2 with the pids controller), or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        folder = Path("/sys/fs/cgroup/pids" if "pids" in controllers.split(",") else "/sys/fs/cgroup", path.lstrip("/"))
        if "pids" in controllers.split(",") or (controllers == "" and "pids" in _read(folder / "cgroup.controllers")):
            return folder
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:  # still holds a task: removed at the next sweep
        pass


def remove(base: Path, wait: float = 1.0) -> None:
    """A zygote's groups, once their children have ended (``wait`` seconds at most: the spare child
    ends as its socket closes; what is left goes when the next zygote starts)."""
    deadline = time.monotonic() + wait
    while True:
        for group in base.glob("*"):
            if group.is_dir():
                _rmdir(group)
        _rmdir(base)
        if not base.exists() or time.monotonic() > deadline:
            return
        time.sleep(0.02)


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
    # Python's mmap duplicates the file it maps so: a kept child maps each later job's frames confined.
    rules.add_rule(seccomp.ALLOW, "fcntl", seccomp.Arg(1, seccomp.EQ, fcntl.F_DUPFD_CLOEXEC))
    return rules


def confine(keep: int, frames_bytes: int, rules) -> None:
    """Confines this (just forked) process: :func:`limit`, then ``rules`` (:func:`seccomp_filter`'s,
    None: none). Its tasks were capped as it was forked (:meth:`Tasks.place`)."""
    limit(keep, frames_bytes)
    if rules is not None:
        rules.load()
