"""A TCP <-> Unix-socket byte pipe, to let processes inside a test network namespace reach a
server that listens on this machine's 127.0.0.1 (moto), without any server listening on a
non-loopback address: Unix sockets are filesystem objects, shared across network namespaces.

* :class:`UnixToTcp` (this process, root namespace): accepts on a Unix socket, connects to
  ``127.0.0.1:PORT``.
* ``python -m aios_cloud_aws.testing.bridge --listen PORT --unix PATH`` (inside the namespace):
  accepts on that namespace's ``127.0.0.1:PORT``, connects to the Unix socket.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
from collections.abc import Callable


def _pipe(a: socket.socket, b: socket.socket) -> None:
    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    t1 = threading.Thread(target=pump, args=(a, b), daemon=True)
    t2 = threading.Thread(target=pump, args=(b, a), daemon=True)
    t1.start()
    t2.start()

    def close() -> None:
        t1.join()
        t2.join()
        a.close()
        b.close()

    threading.Thread(target=close, daemon=True).start()


def _serve(listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        try:
            upstream = connect()
        except OSError:
            conn.close()
            continue
        _pipe(conn, upstream)


class UnixToTcp:
    """Accept on Unix socket ``path``; forward to ``127.0.0.1:port``."""

    def __init__(self, path: str, port: int) -> None:
        self.path = path
        self.port = port
        if os.path.exists(path):
            os.unlink(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.listen(64)
        self.thread = threading.Thread(
            target=_serve,
            args=(self.sock, lambda: socket.create_connection(("127.0.0.1", port))),
            daemon=True,
        )

    def start(self) -> UnixToTcp:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.sock.close()
        if os.path.exists(self.path):
            os.unlink(self.path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", type=int, required=True, help="port on this namespace's 127.0.0.1")
    ap.add_argument("--unix", required=True)
    args = ap.parse_args()
    lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", args.listen))
    lst.listen(64)

    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(args.unix)
        return s

    _serve(lst, connect)


if __name__ == "__main__":
    main()
