"""A TCP port forward, as a NAT gateway's (``python -m aios_cloud.testing.portfwd LISTEN_IP
PORT:TARGET_IP:TARGET_PORT ...``): each listening port relays every connection to its target.
The sshd test hosts' forwarded-port mode runs it where this machine reaches it (the switch
namespace): host ``i`` is ``GATEWAY:2201+i`` from outside and listens on 22 inside."""

from __future__ import annotations

import socket
import sys
import threading


def _pipe(a: socket.socket, b: socket.socket) -> None:
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(listen_ip: str, port: int, target: tuple[str, int]) -> None:
    srv = socket.create_server((listen_ip, port), reuse_port=False)
    while True:
        conn, _ = srv.accept()
        try:
            up = socket.create_connection(target, timeout=10)
        except OSError:
            conn.close()
            continue
        up.settimeout(None)
        threading.Thread(target=_pipe, args=(conn, up), daemon=True).start()
        threading.Thread(target=_pipe, args=(up, conn), daemon=True).start()


def main(argv: list[str]) -> None:
    listen_ip, rules = argv[0], argv[1:]
    threads = []
    for rule in rules:
        port, ip, tport = rule.split(":")
        t = threading.Thread(target=serve, args=(listen_ip, int(port), (ip, int(tport))))
        t.daemon = True
        t.start()
        threads.append(t)
    for t in threads:
        t.join()


if __name__ == "__main__":
    main(sys.argv[1:])
