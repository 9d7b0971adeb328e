"""A real Mooncake master (PyPI `mooncake-transfer-engine-non-cuda`'s `mooncake_master`) for tests and
benchmarks, and the private network namespace it and its clients run in.

The master is started on 127.0.0.1 (`-rpc_address=127.0.0.1`, its metrics/admin HTTP server on
127.0.0.1 too; `host=` puts its RPC service on another address, inside a test's own network
namespace: tests/python/two_hosts.py), but every store client (`MooncakeDistributedStore.setup`, TCP transport,
metadata_server "P2PHANDSHAKE") listens on all interfaces (its handshake and transfer ports bind
0.0.0.0): so whatever starts clients runs inside a private network namespace holding only the
loopback interface, where "all interfaces" is 127.0.0.1.

    # outside: re-run a program in a new namespace (unshare -n as root, unshare -rn otherwise)
    reason = private_network_unavailable()     # None, or why namespaces are not allowed here
    subprocess.run(private_network_command([sys.executable, ...]), timeout=...)

    # inside:
    enter_private_network()                    # loopback up; checks lo is the only interface
    with MooncakeMasterProcess() as master:
        master.address                         # "127.0.0.1:PORT" (the clients' master_server_address)
        master.key_count()                     # the master's master_key_count gauge (GET /metrics)
        master.keys()                          # GET /get_all_keys
        master.kill()                          # dies at once (SIGKILL)

Every wait is bounded: start-up (startup_timeout), HTTP calls (timeout), stop (10 s, then SIGKILL).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from sim_vllm_process import stop_process  # tools/ is on sys.path wherever this module is used

IN_PRIVATE_NETWORK = "DRAFTFEED_PRIVATE_NETWORK"  # set in the environment of programs run inside


def master_binary() -> str:
    """The mooncake_master program: $MOONCAKE_MASTER, else the one in the installed `mooncake`
    package (the console script of the same name only execs it), else PATH."""
    if os.environ.get("MOONCAKE_MASTER"):
        return os.environ["MOONCAKE_MASTER"]
    try:
        import mooncake

        path = Path(mooncake.__file__).resolve().parent / "mooncake_master"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    found = shutil.which("mooncake_master")
    if not found:
        raise FileNotFoundError("mooncake_master not found: pip install mooncake-transfer-engine-non-cuda")
    return found


# -- the private network namespace --

def private_network_command(argv: list[str]) -> list[str]:
    """`argv` run in a new network namespace (and, when not root, a new user namespace mapping the
    caller to root in it, which network namespaces need)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise FileNotFoundError("the unshare program (util-linux) is not installed")
    flags = ["--net"] if os.geteuid() == 0 else ["--net", "--map-root-user"]
    return [unshare, *flags, "--", "env", f"{IN_PRIVATE_NETWORK}=1", *argv]


def private_network_unavailable() -> str | None:
    """None if a private network namespace can be made here; else why not (the probe's error)."""
    try:
        command = private_network_command([sys.executable, "-c", "pass"])
    except FileNotFoundError as error:
        return str(error)
    probe = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode == 0:
        return None
    return (f"`{' '.join(command[:-5])} ...` exited {probe.returncode}: "
            f"{(probe.stderr or probe.stdout).strip()}")


def loopback_up() -> None:
    """`ip link set lo up`, through the SIOCSIFFLAGS ioctl (no iproute2 needed)."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s.fileno(), siocgifflags, request))[1]
        fcntl.ioctl(s.fileno(), siocsifflags, struct.pack("16sH22x", b"lo", flags | iff_up))


def interfaces() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


def enter_private_network() -> None:
    """Inside the namespace: brings the loopback up and checks it is the only interface."""
    if os.environ.get(IN_PRIVATE_NETWORK) != "1":
        raise RuntimeError(f"not started through private_network_command ({IN_PRIVATE_NETWORK} unset)")
    names = interfaces()
    if names != ["lo"]:
        raise RuntimeError(f"not a private network namespace: interfaces {names}")
    loopback_up()
    with socket.create_server(("127.0.0.1", 0)):
        pass


def listening_sockets() -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket in this network namespace (/proc/net/tcp*)."""
    found = []
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open(f"/proc/net/{name}") as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            if family == socket.AF_INET:
                raw = raw[::-1]
            else:
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
            found.append((socket.inet_ntop(family, raw), int(port, 16)))
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the master --

_prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the thread that started it ends (PR_SET_PDEATHSIG),
    so a test or benchmark that is killed leaves no master behind."""
    _prctl(1, signal.SIGKILL, 0, 0, 0)


class MooncakeMasterProcess:
    def __init__(self, *, port: int | None = None, metrics_port: int | None = None,
                 extra_args: list[str] | None = None, startup_timeout: float = 30.0,
                 log_path: str | os.PathLike | None = None, host: str = "127.0.0.1"):
        self.port, self.metrics_port = port or free_port(), metrics_port or free_port()
        self.address = f"{host}:{self.port}"
        self.metrics = f"http://127.0.0.1:{self.metrics_port}"
        self.args = [
            master_binary(), f"-rpc_address={host}", f"-rpc_port={self.port}",
            "-metrics_host=127.0.0.1", f"-metrics_port={self.metrics_port}",
            "-enable_http_metadata_server=false", *(extra_args or []),
        ]
        self._tmp = tempfile.TemporaryDirectory(prefix="mooncake_master_")
        self._log = open(log_path or os.path.join(self._tmp.name, "log"), "w")
        self.process = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                        preexec_fn=_die_with_parent)
        deadline = time.monotonic() + startup_timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"mooncake_master exited with {self.process.returncode}:\n"
                                   f"{self.log_text()}")
            try:
                self.metrics_text(timeout=1.0)
                break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"mooncake_master did not start in {startup_timeout} s:\n"
                                   f"{self.log_text()}")
            time.sleep(0.05)

    def log_text(self) -> str:
        self._log.flush()
        with open(self._log.name, errors="replace") as f:
            return f.read()

    def _get(self, path: str, timeout: float) -> str:
        with urllib.request.urlopen(self.metrics + path, timeout=timeout) as response:
            return response.read().decode()

    def metrics_text(self, timeout: float = 10.0) -> str:
        return self._get("/metrics", timeout)

    def gauge(self, name: str, timeout: float = 10.0) -> float:
        for line in self.metrics_text(timeout).splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == name:
                return float(parts[1])
        raise KeyError(f"{name} is not among the master's metrics")

    def key_count(self, timeout: float = 10.0) -> int:
        """The master's own count of the keys it manages (its `master_key_count` gauge)."""
        return int(self.gauge("master_key_count", timeout))

    def keys(self, timeout: float = 10.0) -> list[str]:
        return [k for k in self._get("/get_all_keys", timeout).splitlines() if k]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        stop_process(self.process)
        if not self._log.closed:
            self._log.close()

    def __enter__(self) -> MooncakeMasterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._tmp.cleanup()
