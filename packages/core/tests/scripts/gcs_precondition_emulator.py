"""gcp-storage-emulator with GCS's generation preconditions enforced (a stand-in for the rule the
emulator accepts and ignores). https://cloud.google.com/storage/docs/request-preconditions: an
upload or delete whose ``ifGenerationMatch`` differs from the object's live generation (``0``:
the object must not exist) fails with 412 Precondition Failed.

    python gcs_precondition_emulator.py PORT
"""

from __future__ import annotations

import sys
from http import HTTPStatus
from typing import Any

from gcp_storage_emulator import server as emu
from gcp_storage_emulator.exceptions import NotFound


def enforce(handler: Any) -> Any:
    def run(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        want = request.query.get("ifGenerationMatch")
        if want:
            name = request.params.get("object_id") or request.query["name"][0]
            try:
                live = str(storage.get_file_obj(request.params["bucket_name"], name)["generation"])
            except NotFound:
                live = "0"
            if live != want[0]:
                response.status = HTTPStatus.PRECONDITION_FAILED
                response.json({"error": {"code": 412, "message": "Precondition Failed"}})
                return None
        return handler(request, response, storage, *args, **kwargs)

    return run


for _, handlers in emu.HANDLERS:
    for method, fn in list(handlers.items()):
        if fn.__name__ in ("insert", "delete"):
            handlers[method] = enforce(fn)

if __name__ == "__main__":
    emu.create_server("127.0.0.1", int(sys.argv[1]), in_memory=True).run()
