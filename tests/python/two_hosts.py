"""Two hosts on one machine: two network namespaces joined by a veth pair.

    pair = TwoHosts.create()          # or the `two_hosts` fixture of a test module (see below)
    pair.a.address, pair.b.address    # "10.201.0.1", "10.201.0.2" (a /30 of our own: nothing else)
    pair.a.popen([...])               # a process on host A (`ip netns exec`), in its own session,
                                      # SIGKILLed if this process dies (PR_SET_PDEATHSIG)
    pair.a.run([...], timeout=30)     # the same, waited for (bounded)
    pair.b.cut() / pair.b.restore()   # host B's link down (nothing passes, no reset) / up again
    pair.destroy()                    # kills every process in both namespaces, deletes them

Each host is a network namespace holding its loopback (up) and one end of the veth pair, named
`eth0` on both sides (the name GLOO_SOCKET_IFNAME takes); IPv6 is off inside, so the pair's two
IPv4 addresses and the loopback are all a host can reach. Nothing is routed to the machine's own
network.

Lifetimes: namespaces are named `draftfeed-2h-<pid>-<start time>-<tag>-<a|b>` after the test
session that made them (a session may make several pairs, told apart by their tag). `destroy` runs at the end of the module (also when a test failed). A session that
was killed before its end leaves its namespaces behind: `remove_stale()` (called by `create`)
kills every process still in a namespace of a session that no longer runs and deletes it, so the
next run starts clean; namespaces of a session that still runs (another checkout's tests) are left
alone.

Where namespaces cannot be made (not root, no iproute2, a container without CAP_SYS_ADMIN),
`unavailable()` says why, and the fixture skips with that reason.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

PREFIX = "draftfeed-2h"
ADDRESS_A, ADDRESS_B, PREFIX_LEN = "10.201.0.1", "10.201.0.2", 30
LINK = "eth0"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-(\d+)-[a-z0-9]+-[ab]$")

_prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the thread that started it ends. `ip netns exec`
    execs the command itself (no fork), so the signal reaches the command."""
    _prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22), None if gone:
    with the pid it names one process, whatever pid reuse happened since."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _ip(*args: str, timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def unavailable() -> str | None:
    """None if two namespaces can be made here; else why not."""
    if shutil.which("ip") is None:
        return "the `ip` program (Debian package iproute2) is not installed"
    if os.geteuid() != 0:
        return f"making network namespaces (`ip netns add`) needs root; running as uid {os.geteuid()}"
    me = os.getpid()
    name = f"{PREFIX}-{me}-{_start_time(me)}-probe-a"  # a killed probe is stale like any other
    probe = _ip("netns", "add", name, check=False)
    if probe.returncode != 0:
        return f"`ip netns add` is not permitted here: {probe.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


def _kill_all_in(namespace: str) -> None:
    """SIGKILL every process in the namespace, until none is left (bounded)."""
    deadline = time.monotonic() + 20
    while True:
        listed = _ip("netns", "pids", namespace, check=False)
        pids = [int(p) for p in listed.stdout.split()] if listed.returncode == 0 else []
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in namespace {namespace} survive SIGKILL")
        time.sleep(0.05)


def remove_stale() -> list[str]:
    """Deletes the namespaces left by sessions that no longer run (their processes killed first);
    returns their names."""
    removed = []
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = _NAME.match(name)
        if not match:
            continue
        pid, started = int(match.group(1)), int(match.group(2))
        if _start_time(pid) == started:
            continue  # its session still runs
        _kill_all_in(name)
        _ip("netns", "del", name, check=False)
        removed.append(name)
    return removed


@dataclass
class Host:
    name: str  # the namespace
    address: str
    label: str  # "A" or "B"

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """`argv` running on this host, in a new session (kill its group to end it and its
        children), SIGKILLed if the calling thread ends first."""
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(self.command(argv), preexec_fn=_die_with_parent, **kwargs)

    def run(self, argv: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(argv), timeout=timeout, preexec_fn=_die_with_parent,
                              **kwargs)

    def pids(self) -> list[int]:
        return [int(p) for p in _ip("netns", "pids", self.name).stdout.split()]

    def kill_everything(self) -> list[int]:
        """SIGKILL every process on this host at once (a host that died); returns their pids."""
        pids = self.pids()
        _kill_all_in(self.name)
        return pids

    def cut(self) -> None:
        """This host's link goes down: packets to and from it are dropped, no connection is reset
        (the peer sees nothing but silence, as when a cable or switch fails)."""
        _ip("-n", self.name, "link", "set", LINK, "down")

    def restore(self) -> None:
        _ip("-n", self.name, "link", "set", LINK, "up")


class TwoHosts:
    def __init__(self, a: Host, b: Host):
        self.a, self.b = a, b

    @classmethod
    def create(cls, tag: str = "pair") -> TwoHosts:
        """A new pair; `tag` (lower-case letters and digits) tells apart the pairs of one session."""
        if not re.fullmatch(r"[a-z0-9]+", tag):
            raise ValueError(f"tag must be lower-case letters and digits, got {tag!r}")
        remove_stale()
        me = os.getpid()
        stem = f"{PREFIX}-{me}-{_start_time(me)}-{tag}"
        a = Host(f"{stem}-a", ADDRESS_A, "A")
        b = Host(f"{stem}-b", ADDRESS_B, "B")
        pair = cls(a, b)
        try:
            for host in (a, b):
                _ip("netns", "add", host.name)
            # Both ends are made inside their namespaces: no name is ever taken in the machine's own.
            _ip("link", "add", LINK, "netns", a.name, "type", "veth", "peer", "name", LINK,
                "netns", b.name)
            for host in (a, b):
                for key in ("all", "default", "lo"):
                    host.run(["sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1"], timeout=30,
                             check=True)
                _ip("-n", host.name, "addr", "add", f"{host.address}/{PREFIX_LEN}", "dev", LINK)
                _ip("-n", host.name, "link", "set", "lo", "up")
                _ip("-n", host.name, "link", "set", LINK, "up")
        except BaseException:
            pair.destroy()
            raise
        return pair

    def destroy(self) -> None:
        for host in (self.a, self.b):
            if _ip("netns", "pids", host.name, check=False).returncode == 0:
                _kill_all_in(host.name)
                _ip("netns", "del", host.name, check=False)

    def describe(self) -> str:
        return (f"host A {self.a.address} (namespace {self.a.name}), host B {self.b.address} "
                f"(namespace {self.b.name}), joined by a veth pair ({LINK} on both)")
