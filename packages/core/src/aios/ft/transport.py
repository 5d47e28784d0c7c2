"""The heal's state transfer, served only on the run's address (``master_addr``).

torchft 0.2.0's own HTTP transport binds every interface and advertises the host's name
(``torchft/checkpointing/http_transport.py``: its server on ``("", 0)`` over IPv6, its address
``http://<socket.gethostname()>:port``); its ``Manager`` takes another transport
(``checkpoint_transport=``). This one implements torchft's ``CheckpointTransport`` interface with
a server bound to the address aios chose for the run (127.0.0.1 for a local run): a live group
serves its state at ``http://<addr>:<port>/checkpoint/<step>`` from ``send_checkpoint`` until
``disallow_checkpoint`` (called by torchft at every commit vote), a healing group fetches it in
``recv_checkpoint`` (a request that comes before the live group's quorum thread has sent the
state waits for it, up to the manager's timeout). The state is read back with
``torch.load(weights_only=True)``, as aios reads its checkpoints: tensors and plain values only,
never code.

Torch and torchft are imported when the first transport is made (a rank under replica groups).
"""

from __future__ import annotations

import io
import socket
import threading
import urllib.request
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_TRANSPORT: type | None = None


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def _transport_class() -> type:
    from torchft.checkpointing.transport import CheckpointTransport

    class BoundTransport(CheckpointTransport[Any]):
        """torchft's checkpoint transport interface over a server on one address (see the
        module docstring)."""

        def __init__(self, addr: str, timeout: timedelta, quiet: bool = True) -> None:
            #: the state served and its step; a request waits on it until they are set
            self._ready = threading.Condition()
            self._step = -1
            self._state: Any = None
            self._timeout = timeout
            transport = self

            class Handler(BaseHTTPRequestHandler):
                def do_GET(self) -> None:
                    body = transport._serve(self.path)
                    if body is None:
                        self.send_error(404, "no state of that step is served")
                        return
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

                def log_message(self, format: str, *args: Any) -> None:
                    if not quiet:
                        super().log_message(format, *args)

            server = _Server6 if ":" in addr else _Server
            self._server = server((addr, 0), Handler)
            host = f"[{addr}]" if ":" in addr else addr
            self._address = f"http://{host}:{self._server.server_address[1]}/checkpoint/"
            self._thread = threading.Thread(
                target=self._server.serve_forever, name="aios-ft-heal", daemon=True
            )
            self._thread.start()

        def _serve(self, path: str) -> bytes | None:
            import torch

            want = path.rstrip("/").rsplit("/", 1)[-1]
            with self._ready:  # a peer that asks before this group's quorum thread sent waits
                if not self._ready.wait_for(
                    lambda: self._state is not None and want == str(self._step),
                    timeout=self._timeout.total_seconds(),
                ):
                    return None
                buf = io.BytesIO()
                torch.save(self._state, buf)
                return buf.getvalue()

        def metadata(self) -> str:
            return self._address

        def send_checkpoint(
            self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta
        ) -> None:
            with self._ready:
                self._step, self._state = step, state_dict
                self._ready.notify_all()

        def disallow_checkpoint(self) -> None:
            with self._ready:  # waits for a transfer in progress: the state may change after
                self._step, self._state = -1, None

        def recv_checkpoint(
            self, src_rank: int, metadata: str, step: int, timeout: timedelta
        ) -> Any:
            import torch

            url = f"{metadata}{step}"
            with urllib.request.urlopen(url, timeout=timeout.total_seconds()) as f:
                data = f.read()
            return torch.load(io.BytesIO(data), weights_only=True)

        def shutdown(self, wait: bool = True) -> None:
            self._server.shutdown()
            self._server.server_close()
            if wait:
                self._thread.join()

    return BoundTransport


def bound_transport(addr: str, timeout: timedelta, quiet: bool = True) -> Any:
    """A torchft checkpoint transport whose server listens on ``addr`` only."""
    global _TRANSPORT
    if _TRANSPORT is None:
        _TRANSPORT = _transport_class()
    return _TRANSPORT(addr, timeout, quiet)
