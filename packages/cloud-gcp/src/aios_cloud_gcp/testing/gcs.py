"""A Cloud Storage stand-in for tests: gcp-storage-emulator (the GCS JSON API, in memory) in its
own process, with the rules of the real service the emulator lacks, each beside its documentation:

* **Generation preconditions.** An upload or delete whose ``ifGenerationMatch`` differs from the
  object's live generation (``0``: the object must not exist) fails with 412 Precondition Failed
  (https://cloud.google.com/storage/docs/request-preconditions). The emulator accepts the
  parameter and ignores it.
* **objects.move** (``POST .../b/BUCKET/o/SOURCE/moveTo/o/DESTINATION``,
  https://cloud.google.com/storage/docs/json_api/v1/objects/move). The emulator answers 501.
  gcsfs tries this call for every rename within a bucket (DCP's ``.metadata.tmp`` ->
  ``.metadata``). On a 501 it retries with backoff for about 33 s, then falls back to copy and
  delete, a wait no real bucket has. As the real service:
  - the source and destination names must differ (400);
  - the source must exist (404);
  - ``ifGenerationMatch``/``ifGenerationNotMatch`` apply to the destination and
    ``ifSourceGenerationMatch``/``ifSourceGenerationNotMatch`` to the source (412);
  - the destination gets a new generation and metageneration 1;
  - the source is deleted with no soft-delete retention;
  - the answer is the destination's object resource.

    with GcsEmulator() as gcs:            # or: python -m aios_cloud_gcp.testing.gcs PORT [HOST]
        gcs.make_bucket("bucket")
        subprocess.run([...], env={**os.environ, **gcs.env})
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from http import HTTPStatus
from typing import Any

#: what gcsfs needs beside ``STORAGE_EMULATOR_HOST``: without it gcsfs (2026.x) first asks the
#: bucket's type over gRPC, which the emulator does not serve (a 60 s timeout per bucket)
GCSFS_ENV = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


class GcsEmulator:
    """The stand-in on ``host`` (a free port unless given); ``url`` and :attr:`env` once started."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port or _free_port(host)
        self.url = f"http://{host}:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        """The environment a process needs to reach this stand-in through gcsfs."""
        return {"STORAGE_EMULATOR_HOST": self.url, **GCSFS_ENV}

    def start(self, timeout: float = 60.0) -> GcsEmulator:
        """Start the server and wait until its port answers (readiness, not timing)."""
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__, str(self.port), self.host],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection((self.host, self.port), timeout=0.5).close()
                return self
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the GCS stand-in did not answer on {self.url}") from None
                time.sleep(0.1)

    def make_bucket(self, name: str) -> None:
        """Create bucket ``name`` through gcsfs (as a user's code would)."""
        os.environ.update(GCSFS_ENV)  # before gcsfs's first import reads it
        import gcsfs

        fs = gcsfs.GCSFileSystem(endpoint_url=self.url, token="anon", skip_instance_cache=True)
        fs.mkdir(name)

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def __enter__(self) -> GcsEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


# ------------------------------------------------------------------ the server (its own process)


def _precondition_failed(response: Any) -> None:
    response.status = HTTPStatus.PRECONDITION_FAILED
    response.json({"error": {"code": 412, "message": "Precondition Failed"}})


def _generation(storage: Any, bucket: str, name: str) -> str:
    """The live generation of ``bucket/name``, ``"0"`` when there is none."""
    from gcp_storage_emulator.exceptions import NotFound

    try:
        return str(storage.get_file_obj(bucket, name)["generation"])
    except NotFound:
        return "0"


def _fails(query: dict[str, list[str]], match: str, not_match: str, live: str) -> bool:
    want, unwanted = query.get(match), query.get(not_match)
    return bool((want and want[0] != live) or (unwanted and unwanted[0] == live))


def _enforce(handler: Any) -> Any:
    def run(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        q = request.query
        if q.get("ifGenerationMatch") or q.get("ifGenerationNotMatch"):
            name = request.params.get("object_id") or q["name"][0]
            live = _generation(storage, request.params["bucket_name"], name)
            if _fails(q, "ifGenerationMatch", "ifGenerationNotMatch", live):
                _precondition_failed(response)
                return None
        return handler(request, response, storage, *args, **kwargs)

    return run


def _move(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> None:
    from gcp_storage_emulator.handlers import objects

    bucket = request.params["bucket_name"]
    source, dest = request.params["object_id"], request.params["dest_object_id"]
    if source == dest:
        response.status = HTTPStatus.BAD_REQUEST
        response.json(
            {"error": {"code": 400, "message": "Source and destination object names must differ."}}
        )
        return
    live_source = _generation(storage, bucket, source)
    if live_source == "0":
        response.status = HTTPStatus.NOT_FOUND
        response.json({"error": {"code": 404, "message": f"No such object: {bucket}/{source}"}})
        return
    q = request.query
    if _fails(q, "ifSourceGenerationMatch", "ifSourceGenerationNotMatch", live_source) or _fails(
        q, "ifGenerationMatch", "ifGenerationNotMatch", _generation(storage, bucket, dest)
    ):
        _precondition_failed(response)
        return
    source_obj = storage.get_file_obj(bucket, source)
    dest_obj = objects._make_object_resource(
        request.base_url, bucket, dest, source_obj["contentType"], source_obj["size"]
    )
    for key in ("md5Hash", "crc32c", "metadata", "contentEncoding", "cacheControl"):
        if source_obj.get(key) is not None:
            dest_obj[key] = source_obj[key]
    storage.create_file(bucket, dest, storage.get_file(bucket, source), dest_obj)
    storage._hard_delete_file(bucket, source)  # a move applies no soft-delete retention
    response.json(dest_obj)


def _serve(host: str, port: int) -> None:
    from gcp_storage_emulator import server as emu
    from gcp_storage_emulator import settings

    for _, handlers in emu.HANDLERS:
        for method, fn in list(handlers.items()):
            if fn.__name__ in ("insert", "delete"):
                handlers[method] = _enforce(fn)
    bucket, obj = r"(?P<bucket_name>[-.\w]+)", r"(?P<object_id>.*[^/]+)"
    move = tuple(
        (rf"^{prefix}/b/{bucket}/o/{obj}/moveTo/o/(?P<dest_object_id>.*[^/]+)$", {"POST": _move})
        for prefix in (settings.API_ENDPOINT, "")
    )
    emu.HANDLERS = (*move, *emu.HANDLERS)
    emu.create_server(host, port, in_memory=True).run()


if __name__ == "__main__":
    _serve(sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1", int(sys.argv[1]))
