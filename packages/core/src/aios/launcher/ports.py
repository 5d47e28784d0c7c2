"""The rendezvous port of ``aios-run``: is it free, a free one, is the address this host's,
and replacing it in torchrun's arguments when another process took it first. No torch."""

from __future__ import annotations

import os
import socket


def port_free(addr: str, port: int) -> bool:
    """Nothing is LISTENING on ``addr:port``. Bound with SO_REUSEADDR, as the c10d store binds,
    so connections of an earlier run still in TIME_WAIT do not count as in use."""
    host = "" if addr in ("0.0.0.0", "*") else addr
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror:
        return True  # not a local address: the rendezvous host checks for itself
    family, _, _, _, sockaddr = infos[0]
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        if os.name != "nt":  # on Windows SO_REUSEADDR would let the bind steal a listening port
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(sockaddr)
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr if addr not in ("localhost",) else "127.0.0.1", 0))
        return s.getsockname()[1]


def is_local(addr: str) -> bool:
    if addr in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        return True
    try:
        return (
            addr in {socket.gethostname(), socket.getfqdn()}
            or addr in socket.gethostbyname_ex(socket.gethostname())[2]
        )
    except OSError:
        return False


def port_taken(exc: BaseException) -> bool:
    """torch's store could not bind its port (``EADDRINUSE``)."""
    return "EADDRINUSE" in str(exc) or "address already in use" in str(exc)


def with_port(targs: list[str], env: dict[str, str], port: int) -> list[str]:
    """torchrun's arguments and the workers' env with the master port replaced."""
    out = list(targs)
    for i, a in enumerate(out[:-1]):
        if a == "--master-port":
            out[i + 1] = str(port)
        elif a == "--rdzv-endpoint":
            host = out[i + 1].rsplit(":", 1)[0]
            out[i + 1] = f"{host}:{port}"
    if "MASTER_PORT" in env:
        env["MASTER_PORT"] = str(port)
    return out
