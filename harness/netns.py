"""Two network hosts on one Linux machine, for the tests and benchmarks of the two-host deployment.

    with two_hosts(rate_mbit=100) as hosts, hosts.edge.entered():
        with torchserve(store, models=["eden_encoder.mar"], host=hosts.cloud.address,
                        prefix=hosts.cloud.prefix) as cloud:
            ...  # this thread, and the threads it starts, talk from the edge host, across the link

``cloud`` and ``edge`` are network namespaces joined by a veth pair, each end shaped to the rate by
tbf, so each direction carries at most ``rate_mbit``. Namespace names are unique per run; the
addresses exist only inside them. Everything is removed on leaving the block, on Ctrl-C and on
SIGTERM too. Needs root (``ip netns``, ``tc``); :func:`unavailable` says why not where it fails.
docs/performance.md ("Two hosts over a real link") explains the topology and the choice of tbf parameters.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

# A private /30 that exists only inside the two namespaces, so any run may use it.
CLOUD_ADDRESS = "10.90.0.1"
EDGE_ADDRESS = "10.90.0.2"
PREFIX_LENGTH = 30
NETNS_DIR = "/var/run/netns"  # where ip netns keeps its namespaces
CLONE_NEWNET = 0x40000000
ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
# A veth hands whole TSO/GRO packets to a packet socket: up to 64 KiB of IP, and headers.
MAX_PACKET = 1 << 17

# tbf: a veth hands the qdisc TSO/GSO packets of up to 64 KiB, and tbf must never hold back one
# packet for lack of tokens, so the bucket holds two of them, or 2 ms at the rate where that is more
# (1 Gbit/s: 250 kB). The queue holds 50 ms at the rate on top: enough for TCP to keep the link
# busy (measured: 96-98% of the rate as TCP goodput), short enough not to bloat.
MIN_BURST_BYTES = 2 * 65536
BURST_SECONDS = 0.002
QUEUE_SECONDS = 0.050


def tbf_parameters(rate_mbit: float) -> dict[str, int]:
    """Bucket and queue sizes in bytes for a rate in Mbit/s."""
    bytes_per_second = rate_mbit * 1e6 / 8
    burst = max(MIN_BURST_BYTES, round(bytes_per_second * BURST_SECONDS))
    return {"burst": burst, "limit": burst + round(bytes_per_second * QUEUE_SECONDS)}


def _ip(*args: str) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def _tc(namespace: str, *args: str) -> str:
    result = subprocess.run(["tc", "-n", namespace, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def _setns(fd: int) -> None:
    """Moves the calling thread (only) into the network namespace open as ``fd``."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"setns: {os.strerror(error)}")


@dataclass(frozen=True)
class Host:
    name: str  # the network namespace
    interface: str  # its end of the link
    address: str
    cpus: tuple[int, ...] = ()  # the CPUs its commands run on (empty: any)

    @property
    def prefix(self) -> list[str]:
        """Put before a command to run it on this host (``harness.servers.torchserve(prefix=...)``)."""
        pinned = ["taskset", "--cpu-list", ",".join(map(str, self.cpus))] if self.cpus else []
        return ["ip", "netns", "exec", self.name, *pinned]

    @contextlib.contextmanager
    def entered(self) -> Iterator["Host"]:
        """The calling thread's sockets, and the threads and processes it starts, live on this host
        until the block ends. Sockets keep the host they were opened on."""
        with open("/proc/thread-self/ns/net") as home, open(f"{NETNS_DIR}/{self.name}") as there:
            _setns(there.fileno())
            try:
                yield self
            finally:
                _setns(home.fileno())

    def sent_bytes(self) -> int:
        """Bytes this host has sent over the link, as its tbf charges them against the rate: every
        Ethernet frame with its headers (the interface's own counter sees a TSO packet's headers
        once, so it reads about 4% low)."""
        qdisc = json.loads(_tc(self.name, "-s", "-j", "qdisc", "show", "dev", self.interface))[0]
        return qdisc["bytes"]

    @contextlib.contextmanager
    def captured(self, seconds: float, max_bytes: int) -> Iterator["Capture"]:
        """What crosses this host's end of the link during the block, both ways, read by a raw
        packet socket in a thread: for at most ``seconds`` and ``max_bytes`` of packets."""
        with self.entered():
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        capture, done = Capture(), threading.Event()
        with sock:
            sock.bind((self.interface, 0))
            sock.settimeout(0.1)
            deadline = time.monotonic() + seconds

            def read() -> None:
                while not done.is_set() and time.monotonic() < deadline and capture.size < max_bytes:
                    with contextlib.suppress(TimeoutError):
                        capture.add(sock.recv(MAX_PACKET))

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            try:
                yield capture
            finally:
                done.set()
                reader.join()

    def set_link(self, up: bool) -> None:
        _ip("-n", self.name, "link", "set", self.interface, "up" if up else "down")

    def shape(self, rate_mbit: float) -> None:
        """What this host sends over the link: at most ``rate_mbit``."""
        p = tbf_parameters(rate_mbit)
        _tc(self.name, "qdisc", "replace", "dev", self.interface, "root", "tbf",
            "rate", f"{rate_mbit}mbit", "burst", str(p["burst"]), "limit", str(p["limit"]))


@dataclass
class Capture:
    """Ethernet frames as captured, and the TCP streams they carry, put back together."""

    frames: list[bytes] = field(default_factory=list)
    size: int = 0

    def add(self, frame: bytes) -> None:
        self.frames.append(frame)
        self.size += len(frame)

    def streams(self) -> dict[tuple, bytes]:
        """(source, source port, destination, destination port) -> the bytes the segments carry,
        each at its place by sequence number (retransmissions overlap, TSO packets are whole)."""
        pieces: dict[tuple, list[tuple[int, bytes]]] = {}
        for frame in self.frames:
            if len(frame) < 34 or struct.unpack_from("!H", frame, 12)[0] != ETH_P_IP or frame[23] != socket.IPPROTO_TCP:
                continue
            ip_header, total = (frame[14] & 0x0F) * 4, struct.unpack_from("!H", frame, 16)[0]
            tcp = 14 + ip_header
            source_port, destination_port, sequence = struct.unpack_from("!HHI", frame, tcp)
            data = frame[tcp + (frame[tcp + 12] >> 4) * 4 : 14 + total]
            if data:
                flow = (socket.inet_ntoa(frame[26:30]), source_port, socket.inet_ntoa(frame[30:34]), destination_port)
                pieces.setdefault(flow, []).append((sequence, data))
        streams = {}
        for flow, segments in pieces.items():
            first = segments[0][0]
            stream = bytearray()
            for sequence, data in segments:
                offset = (sequence - first) % (1 << 32)  # sequence numbers wrap
                if offset >= 1 << 31:
                    continue  # sent again from before the capture began
                stream[len(stream):] = bytes(max(0, offset + len(data) - len(stream)))
                stream[offset : offset + len(data)] = data
            streams[flow] = bytes(stream)
        return streams


@dataclass
class TwoHosts:
    cloud: Host
    edge: Host
    rate_mbit: float

    def set_rate(self, rate_mbit: float) -> None:
        """Both directions at ``rate_mbit``; servers and connections stay up."""
        for host in (self.cloud, self.edge):
            host.shape(rate_mbit)
        self.rate_mbit = rate_mbit

    def link_down(self, seconds: float) -> threading.Timer:
        """Takes the link down now and back up ``seconds`` later, in the background; join the
        returned timer to wait for it. The edge's end goes down, so the edge host loses its route
        to the cloud at once and connections fail fast instead of timing out."""
        self.edge.set_link(False)
        timer = threading.Timer(seconds, self.edge.set_link, args=(True,))
        timer.start()
        return timer


def unavailable() -> str | None:
    """Why two hosts cannot be made here, in one line, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"eden-probe-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", name)
    except (OSError, RuntimeError) as exc:
        return f"ip netns does not work here: {exc}"
    _ip("netns", "del", name)
    return None


@contextlib.contextmanager
def two_hosts(
    rate_mbit: float, cloud_cpus: tuple[int, ...] = (), edge_cpus: tuple[int, ...] = (), name: str = "eden"
) -> Iterator[TwoHosts]:
    """A cloud host and an edge host joined by a link of ``rate_mbit`` each way; removed on exit.
    The hosts share this machine's CPUs unless given their own (``*_cpus``; commands run through a
    host's ``prefix`` are pinned to them). Their namespaces' names start with ``name``."""
    tag = f"{os.getpid()}-{secrets.token_hex(3)}"
    hosts = TwoHosts(
        cloud=Host(f"{name}-{tag}-cloud", "link-cloud", CLOUD_ADDRESS, tuple(cloud_cpus)),
        edge=Host(f"{name}-{tag}-edge", "link-edge", EDGE_ADDRESS, tuple(edge_cpus)),
        rate_mbit=rate_mbit,
    )
    with _terminate_unwinds():
        try:
            _create(hosts)
            yield hosts
        finally:
            with _signals_deferred():
                _destroy(hosts)


def _create(hosts: TwoHosts) -> None:
    cloud, edge = hosts.cloud, hosts.edge
    for host in (cloud, edge):
        _ip("netns", "add", host.name)
    # Created inside the namespaces, so the link's names never meet another run's.
    _ip("link", "add", cloud.interface, "netns", cloud.name,
        "type", "veth", "peer", "name", edge.interface, "netns", edge.name)
    for host in (cloud, edge):
        _ip("-n", host.name, "addr", "add", f"{host.address}/{PREFIX_LENGTH}", "dev", host.interface)
        _ip("-n", host.name, "link", "set", "lo", "up")
        _ip("-n", host.name, "link", "set", host.interface, "up")
    hosts.set_rate(hosts.rate_mbit)


def _destroy(hosts: TwoHosts) -> None:
    """Kills what still runs on the hosts (processes this run started there: a server whose stop
    failed), then deletes the namespaces, which deletes the link."""
    for host in (hosts.cloud, hosts.edge):
        if not os.path.exists(f"{NETNS_DIR}/{host.name}"):
            continue
        pids = subprocess.run(["ip", "netns", "pids", host.name], capture_output=True, text=True).stdout.split()
        for pid in {int(p) for p in pids} - {os.getpid()}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", host.name], capture_output=True)


@contextlib.contextmanager
def _terminate_unwinds() -> Iterator[None]:
    """SIGTERM and SIGHUP unwind like Ctrl-C (as ``eden-serve`` does), so the hosts are removed;
    a handler already installed is left alone. Only the main thread can set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    installed = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is signal.SIG_DFL:
            installed[signum] = signal.signal(signum, lambda n, _frame: _exit_for(n))
    try:
        yield
    finally:
        for signum, previous in installed.items():
            signal.signal(signum, previous)


def _exit_for(signum: int):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Teardown runs to the end; a Ctrl-C, SIGTERM or SIGHUP meanwhile is delivered after it, to
    the handler that was there before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    signums = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda n, _frame: received.append(n)) for s in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: a handler set outside Python, which cannot be put back
                signal.signal(signum, handler)
    if received:
        signal.raise_signal(received[0])
