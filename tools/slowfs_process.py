"""Runs tools/slowfs (a FUSE pass-through that answers like a network file system: latency on every
open, lookup, listing and first read, a heavy tail, a bandwidth cap) for tests and benchmarks.

    reason = slowfs_unavailable()          # None, or why FUSE cannot be mounted here (tests skip)
    with SlowFs(source_dir, mount_dir, latency_ms=10, tail=(0.01, 2.0, 3.0)) as fs:
        fs.mountpoint                      # the folder to read through
        fs.stats()                         # counters: calls and injected seconds per operation
        fs.reset_stats()
        fs.set_tail(False)                 # the tail off (and on again) without a new mount

The program is compiled on first use from tools/slowfs/slowfs.cc (Debian's libfuse3-dev, via
pkg-config) into build/slowfs/ of this tree, and rebuilt when the source changes.

Unmounting is certain: stop() (and leaving the `with`) sends SIGTERM, on which slowfs unmounts
itself; it runs in its own process group and dies with its parent (PR_SET_PDEATHSIG), so a test
killed mid-run takes it along, and it unmounts then too. Only a slowfs killed outright (SIGKILL)
leaves its mount behind: every SlowFs start first lazily unmounts the mounts of slowfs processes
that no longer run (found in /proc/self/mountinfo by their source name `slowfs-<pid>`), and
stop() does the same for its own mount if it is still there.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
SOURCE = TOOLS / "slowfs" / "slowfs.cc"
BUILD_DIR = TOOLS.parent / "build" / "slowfs"
_unavailable: dict[str, str | None] = {}


def _source_digest() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]


def build_slowfs() -> str:
    """The slowfs program for the current source (compiled once per version; concurrent callers
    wait for one build). Raises RuntimeError saying what is missing."""
    binary = BUILD_DIR / f"slowfs-{_source_digest()}"
    if binary.exists():
        return str(binary)
    if shutil.which("pkg-config") is None:
        raise RuntimeError("pkg-config is not installed (scripts/install-system.sh)")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True)
    if flags.returncode != 0:
        raise RuntimeError("libfuse3 is not installed (Debian: libfuse3-dev, in scripts/install-system.sh)")
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    with open(BUILD_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists():
            return str(binary)
        temporary = binary.with_name(binary.name + f".tmp-{os.getpid()}")
        proc = subprocess.run(
            [compiler, "-std=c++20", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(temporary), str(SOURCE),
             *flags.stdout.split()],
            capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"slowfs did not compile:\n{proc.stderr[-3000:]}")
        os.replace(temporary, binary)
    return str(binary)


def _pid_runs(pid: int) -> bool:
    """True when `pid` is a live slowfs (not a zombie, not a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # "pid (comm) state ...": comm may hold spaces; the state follows the last ')'.
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    state = stat[stat.rindex(")") + 2:].split()[0]
    return state != "Z" and comm.startswith("slowfs")


def slowfs_mounts() -> list[tuple[str, int]]:
    """(mountpoint, pid) of every slowfs mount this process sees."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(tail) >= 2 and tail[0] == "fuse.slowfs" and tail[1].startswith("slowfs-"):
            mountpoint = fields[4].encode().decode("unicode_escape")  # \040 for spaces
            try:
                mounts.append((mountpoint, int(tail[1][len("slowfs-"):])))
            except ValueError:
                continue
    return mounts


def lazy_unmount(mountpoint: str) -> bool:
    """umount -l (as root), else fusermount3 -u -z; True when it is gone."""
    for command in (["umount", "-l", mountpoint], ["fusermount3", "-u", "-z", mountpoint]):
        if shutil.which(command[0]) is None:
            continue
        subprocess.run(command, capture_output=True, timeout=30)
        if all(m != mountpoint for m, _ in slowfs_mounts()):
            return True
    return False


def cleanup_stale_mounts() -> list[str]:
    """Lazily unmounts the mounts of slowfs processes that no longer run (killed outright); the
    mounts of live ones (other test sessions on this machine) are left alone. Returns the
    mountpoints unmounted."""
    cleaned = []
    for mountpoint, pid in slowfs_mounts():
        if not _pid_runs(pid) and lazy_unmount(mountpoint):
            cleaned.append(mountpoint)
    return cleaned


def slowfs_unavailable() -> str | None:
    """None when a slowfs can be mounted here, else why not (for a test's skip message). Tried once
    per process: builds the program and mounts an empty folder."""
    if "reason" in _unavailable:
        return _unavailable["reason"]
    reason = None
    if not os.path.exists("/dev/fuse"):
        reason = "no /dev/fuse on this machine (FUSE is not available)"
    elif not os.access("/dev/fuse", os.R_OK | os.W_OK):
        reason = "/dev/fuse is not readable and writable by this user"
    else:
        try:
            build_slowfs()
            with tempfile.TemporaryDirectory(prefix="slowfs_probe_") as root:
                os.mkdir(os.path.join(root, "src"))
                os.mkdir(os.path.join(root, "mnt"))
                with SlowFs(os.path.join(root, "src"), os.path.join(root, "mnt"), startup_timeout=30):
                    pass
        except Exception as error:  # any failure is the reason to skip
            reason = f"slowfs cannot mount here: {error}"
    _unavailable["reason"] = reason
    return reason


class SlowFs:
    """A running slowfs mounted at `mountpoint` over `source` (see the module's docstring and
    tools/slowfs/slowfs.cc for what each option does)."""

    def __init__(
        self,
        source: str | os.PathLike,
        mountpoint: str | os.PathLike,
        *,
        latency_ms: float | None = None,
        open_ms: float | None = None,
        lookup_ms: float | None = None,
        readdir_ms: float | None = None,
        read_ms: float | None = None,
        every_read: bool = False,
        sigma: float | None = None,
        tail: tuple[float, float, float] | None = None,
        tail_ops: str | None = None,
        slow: dict[str, float] | None = None,
        bandwidth_mbps: float | None = None,
        entry_timeout: float | None = None,
        attr_timeout: float | None = None,
        negative_timeout: float | None = None,
        seed: int | None = None,
        threads: int | None = None,
        startup_timeout: float = 30.0,
    ):
        self.source = str(source)
        self.mountpoint = str(mountpoint)
        os.makedirs(self.mountpoint, exist_ok=True)
        self._stats_path = os.path.join(tempfile.mkdtemp(prefix="slowfs_stats_"), "stats.json")
        args = [build_slowfs(), self.source, self.mountpoint, "--stats", self._stats_path]
        for flag, value in (("--latency-ms", latency_ms), ("--open-ms", open_ms), ("--lookup-ms", lookup_ms),
                            ("--readdir-ms", readdir_ms), ("--read-ms", read_ms), ("--sigma", sigma),
                            ("--tail-ops", tail_ops), ("--bandwidth-mbps", bandwidth_mbps),
                            ("--entry-timeout", entry_timeout), ("--attr-timeout", attr_timeout),
                            ("--negative-timeout", negative_timeout), ("--seed", seed), ("--threads", threads)):
            if value is not None:
                args += [flag, str(value)]
        if every_read:
            args.append("--every-read")
        if tail is not None:
            args += ["--tail", f"{tail[0]}:{tail[1]}:{tail[2]}"]
        for name, seconds in (slow or {}).items():
            args += ["--slow", f"{name}:{seconds}"]
        self.args = args
        cleanup_stale_mounts()
        # Its own process group: a ^C to the test's group reaches it only through its parent's
        # death (PR_SET_PDEATHSIG), after the test's own teardown had its chance to unmount.
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
        self._wait_ready(startup_timeout)

    def _wait_ready(self, timeout: float) -> None:
        import selectors

        assert self.process.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            if selector.select(timeout=max(0.0, deadline - time.monotonic())):
                line = self.process.stdout.readline()
                break
        selector.close()
        if line.strip() != "ready":
            self.stop()
            err = self.process.stderr.read() if self.process.stderr else ""
            raise RuntimeError(f"slowfs did not mount {self.mountpoint} within {timeout:.0f} s "
                               f"(exit status {self.process.returncode}): {err.strip()[-2000:]}")

    def _signal_and_read(self, sig: int, timeout: float = 10.0) -> dict[str, Any]:
        before = os.stat(self._stats_path).st_mtime_ns if os.path.exists(self._stats_path) else None
        inode = os.stat(self._stats_path).st_ino if os.path.exists(self._stats_path) else None
        self.process.send_signal(sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(self._stats_path):
                st = os.stat(self._stats_path)
                if st.st_ino != inode or st.st_mtime_ns != before:  # rewritten (a rename: new inode)
                    with open(self._stats_path) as f:
                        return json.load(f)
            time.sleep(0.01)
        raise RuntimeError(f"slowfs wrote no stats within {timeout:.0f} s")

    def stats(self) -> dict[str, Any]:
        """{calls: {op: n}, delayed_seconds: {op: s}, read_bytes, waiting, max_waiting}."""
        return self._signal_and_read(signal.SIGUSR1)

    def reset_stats(self) -> None:
        self._signal_and_read(signal.SIGUSR2)

    def set_tail(self, on: bool) -> None:
        """Turns the --tail on or off for the calls from now on (those waiting keep their delay): a
        benchmark compares epochs with and without the tail on the same client."""
        stats = self._signal_and_read(signal.SIGRTMIN + (1 if on else 0))
        if stats.get("tail") is not on:
            raise RuntimeError(f"slowfs did not turn its tail {'on' if on else 'off'}: {stats}")

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Waits until no reply is held back (the tails of earlier calls answered)."""
        deadline = time.monotonic() + timeout
        while self.stats()["waiting"] > 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"slowfs still holds replies after {timeout:.0f} s")
            time.sleep(0.05)

    def stop(self, timeout: float = 15.0) -> None:
        """Unmounts (SIGTERM; then SIGKILL and a lazy unmount if it does not end)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout)
        if any(m == self.mountpoint for m, _ in slowfs_mounts()):
            lazy_unmount(self.mountpoint)
        shutil.rmtree(os.path.dirname(self._stats_path), ignore_errors=True)

    def __enter__(self) -> SlowFs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
