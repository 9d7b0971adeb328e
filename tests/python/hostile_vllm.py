"""A hostile vLLM stand-in for tests: it answers every completion request with a handle of the
test's choosing, in a thread of the test's process, on 127.0.0.1 only.

    with HostileServer(lambda ids, n: f"{cache}/hs_{n}.safetensors/") as server:
        source = draftfeed.online.OnlineSource(server.url, ...)

`choose(ids, n)` gets the prompt's token ids and the request's number (0, 1, ...) and returns the
handle, after doing whatever the attack needs (writing a file, taking a lock). The answer is
otherwise what vLLM with the hidden-states connector sends: the prompt ids echoed in
`choices[0].prompt_token_ids` and `kv_transfer_params.hidden_states_path`. `require_key`: answer
401 unless `Authorization: Bearer <key>` came (as `vllm serve --api-key` does).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "hostile/model"


class HostileServer:
    def __init__(self, choose: Callable[[list[int], int], str], *, require_key: str | None = None):
        self.choose = choose
        self.require_key = require_key
        self.requests = 0
        self.authorizations: list[str | None] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def __enter__(self) -> HostileServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                seen = self.headers.get("Authorization")
                with server._lock:
                    server.authorizations.append(seen)
                if server.require_key is None or seen == f"Bearer {server.require_key}":
                    return True
                self._send(401, {"error": "Unauthorized"})
                return False

            def do_GET(self) -> None:
                if not self._authorized():
                    return
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self._authorized():
                    return
                ids = [int(i) for i in body.get("prompt", [])]
                with server._lock:
                    number = server.requests
                    server.requests += 1
                handle = server.choose(ids, number)
                self._send(200, {
                    "id": f"cmpl-{number}", "object": "text_completion", "model": MODEL,
                    "choices": [{"index": 0, "text": " ", "finish_reason": "length",
                                 "prompt_token_ids": ids, "token_ids": [0]}],
                    "kv_transfer_params": {"hidden_states_path": handle},
                })

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)
