"""An EC2 instance metadata service (IMDSv2) stand-in for tests.

Implements what aios uses, with IMDSv2's rules: ``PUT /latest/api/token`` with
``X-aws-ec2-metadata-token-ttl-seconds`` (1..21600) returns a token; every ``GET`` needs a valid
``X-aws-ec2-metadata-token`` (else 401, as with ``HttpTokens=required``);
``/latest/meta-data/spot/instance-action`` is 404 until a notice is set, then
``{"action": ..., "time": ...}``. The notice comes from :meth:`ImdsServer.set_notice` or, for a
server running in another process or network namespace, from a JSON file (``notice_file``).

Instance-role credentials as EC2 serves them
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/iam-roles-for-amazon-ec2.html#instance-metadata-security-credentials):
``/latest/meta-data/iam/security-credentials/`` names the role and
``.../security-credentials/ROLE`` gives its temporary keys, only when an instance profile is
attached (``credentials``: a callable returning that JSON, or None: 404 as on an instance
without a profile).

Run standalone (e.g. inside a test host's network namespace, where it plays the node-local
169.254.169.254)::

    python -m aios_cloud_aws.testing.imds --port 0 --notice-file /tmp/notice.json --port-file /tmp/port
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from aios_cloud.testing.host import Host


def notice_json(action: str = "terminate", seconds: float = 120.0) -> str:
    when = datetime.now(timezone.utc) + timedelta(seconds=seconds)
    return json.dumps({"action": action, "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")})


class ImdsServer:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        notice_file: str | None = None,
        instance_id: str = "i-0aios000000000000",
        credentials: Any = None,
    ) -> None:
        self.credentials = credentials
        self.notice: str | None = None
        self.notice_file = notice_file
        self.instance_id = instance_id
        self.tokens: dict[str, float] = {}
        self.token_puts = 0
        self.notice_gets = 0
        self.unauthorized = 0
        self.lock = threading.Lock()
        srv = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                if self.path != "/latest/api/token":
                    return self._reply(404)
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
                if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return self._reply(400, "invalid ttl")
                token = secrets.token_urlsafe(24)
                with srv.lock:
                    srv.tokens[token] = time.monotonic() + int(ttl)
                    srv.token_puts += 1
                self._reply(200, token)

            def do_GET(self) -> None:
                token = self.headers.get("X-aws-ec2-metadata-token", "")
                with srv.lock:
                    ok = srv.tokens.get(token, 0) > time.monotonic()
                    if not ok:
                        srv.unauthorized += 1
                if not ok:
                    return self._reply(401)
                if self.path == "/latest/meta-data/spot/instance-action":
                    with srv.lock:
                        srv.notice_gets += 1
                    notice = srv.current_notice()
                    return self._reply(200, notice) if notice else self._reply(404)
                if self.path == "/latest/meta-data/instance-id":
                    return self._reply(200, srv.instance_id)
                if self.path.startswith("/latest/meta-data/iam/security-credentials/"):
                    creds = srv.role_credentials()
                    if creds is None:
                        return self._reply(404)
                    role = self.path.rsplit("/", 1)[-1]
                    if not role:
                        return self._reply(200, creds["RoleName"])
                    if role != creds["RoleName"]:
                        return self._reply(404)
                    body = {k: v for k, v in creds.items() if k != "RoleName"}
                    return self._reply(200, json.dumps(body))
                return self._reply(404)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://{host}:{self.port}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, daemon=True, name="aios-imds"
        )

    def current_notice(self) -> str | None:
        if self.notice:
            return self.notice
        if self.notice_file and os.path.exists(self.notice_file):
            with open(self.notice_file) as f:
                return f.read().strip() or None
        return None

    def role_credentials(self) -> dict[str, str] | None:
        """The attached role's credentials (minted once, as EC2 rotates them hours apart)."""
        with self.lock:
            if self.credentials is None:
                return None
            if not hasattr(self, "_creds"):
                self._creds = self.credentials()
            return self._creds

    def set_notice(self, action: str = "terminate", seconds: float = 120.0) -> None:
        self.notice = notice_json(action, seconds)

    def interrupt(
        self,
        host: Host,
        seconds: float = 120.0,
        action: str = "terminate",
        inspect: Callable[[], Any] | None = None,
    ) -> float:
        """A spot interruption of ``host``: the ``instance-action`` notice (EC2 gives it two
        minutes ahead; tests scale ``seconds`` down) and the host's end at the notice's own
        ``time`` (whole seconds, as EC2 writes it), when EC2 acts
        (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
        Returns that deadline (epoch seconds)."""
        text = notice_json(action, seconds)
        when = datetime.strptime(json.loads(text)["time"], "%Y-%m-%dT%H:%M:%SZ")
        deadline = when.replace(tzinfo=timezone.utc).timestamp()
        host.reclaim_at(deadline, inspect)
        self.notice = text
        return deadline

    def revoke_tokens(self) -> None:
        with self.lock:
            self.tokens.clear()

    def start(self) -> ImdsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> ImdsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description="IMDSv2 stand-in for tests")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--notice-file")
    ap.add_argument("--port-file")
    args = ap.parse_args()
    srv = ImdsServer(args.host, args.port, args.notice_file)
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(srv.port))
        os.replace(tmp, args.port_file)
    srv.server.serve_forever()


if __name__ == "__main__":
    main()
