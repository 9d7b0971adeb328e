"""Runs tools/sim_vllm_server.py as a subprocess for tests and benchmarks.

    with SimServerProcess(server_dir, hidden=64, faults={"http_503": {"first": 2}}) as sim:
        sim.url            # "http://127.0.0.1:PORT/v1"
        sim.stats()        # GET /admin/stats
        sim.set_faults({...}); sim.reset()

    # Mooncake mode: samples go into the store of a running mooncake_master (inside a private
    # network namespace: see tools/mooncake_master_process.py)
    with SimServerProcess(server_dir, mooncake_master="127.0.0.1:PORT") as sim: ...

    # Listening on another address of this machine (inside a test's own network namespace)
    with SimServerProcess(server_dir, host="10.201.0.1") as sim: ...

Start-up waits for the port file (bounded); stop() terminates, then kills, the process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

SERVER = Path(__file__).resolve().parent / "sim_vllm_server.py"


def stop_process(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not ended within `timeout` seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)


class SimServerProcess:
    def __init__(
        self,
        server_dir: str | os.PathLike,
        *,
        model: str = "sim/verifier-model",
        layers: int = 4,
        hidden: int = 64,
        dtype: str = "bfloat16",
        seed: int = 0,
        faults: dict[str, Any] | None = None,
        latency_median: float | None = None,
        latency_p99: float | None = None,
        handle_key: str = "hidden_states_path",
        write: str = "sync",
        remove_lock: bool = False,
        startup_timeout: float = 30.0,
        log_path: str | os.PathLike | None = None,
        mooncake_master: str | None = None,
        mooncake_segment_mib: int | None = None,
        mooncake_buffer_mib: int | None = None,
        mooncake_writer_threads: int | None = None,
        memo_mib: int | None = None,
        host: str = "127.0.0.1",
        mooncake_local_hostname: str | None = None,
    ):
        self.server_dir = Path(server_dir)
        self.model = model
        args = [
            sys.executable, str(SERVER), "--server-dir", str(server_dir), "--model", model,
            "--layers", str(layers), "--hidden", str(hidden), "--dtype", dtype, "--seed", str(seed),
            "--handle-key", handle_key, "--write", write, "--host", host,
        ]
        if remove_lock:
            args.append("--remove-lock")
        if faults:
            args += ["--faults", json.dumps(faults)]
        if latency_median is not None:
            args += ["--latency-median", str(latency_median)]
        if latency_p99 is not None:
            args += ["--latency-p99", str(latency_p99)]
        if mooncake_master is not None:
            args += ["--mooncake-master", mooncake_master]
            for flag, value in (("--mooncake-segment-mib", mooncake_segment_mib),
                                ("--mooncake-buffer-mib", mooncake_buffer_mib),
                                ("--mooncake-writer-threads", mooncake_writer_threads),
                                ("--memo-mib", memo_mib),
                                ("--mooncake-local-hostname", mooncake_local_hostname)):
                if value is not None:
                    args += [flag, str(value)]
        self._tmp = tempfile.TemporaryDirectory(prefix="sim_vllm_")
        port_file = os.path.join(self._tmp.name, "port")
        args += ["--port-file", port_file]
        self._log = open(log_path or os.path.join(self._tmp.name, "log"), "w")
        self.process = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + startup_timeout
        while not os.path.exists(port_file):
            if self.process.poll() is not None:
                raise RuntimeError(f"the simulated server exited with {self.process.returncode}:"
                                   f" {self.log_text()}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the simulated server did not start in {startup_timeout} s")
            time.sleep(0.02)
        with open(port_file) as f:
            self.port = int(f.read())
        self.base = f"http://{host}:{self.port}"
        self.url = self.base + "/v1"

    def log_text(self) -> str:
        self._log.flush()
        with open(self._log.name) as f:
            return f.read()

    def _call(self, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data,
                                         method="GET" if body is None else "POST")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def stats(self) -> dict[str, Any]:
        return self._call("/admin/stats")

    def set_faults(self, faults: dict[str, Any]) -> dict[str, Any]:
        return self._call("/admin/faults", faults)

    def reset(self, connections: bool = False) -> dict[str, Any]:
        return self._call("/admin/reset" + ("?connections=1" if connections else ""), {})

    def stop(self) -> None:
        stop_process(self.process)
        self._log.close()

    def __enter__(self) -> SimServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._tmp.cleanup()
