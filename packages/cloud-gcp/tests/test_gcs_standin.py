"""The Cloud Storage stand-in (:mod:`aios_cloud_gcp.testing.gcs`) keeps the real service's rules
the emulator lacks: generation preconditions and objects.move
(https://cloud.google.com/storage/docs/json_api/v1/objects/move)."""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from aios_cloud_gcp.testing.gcs import GCSFS_ENV, GcsEmulator

os.environ.update(GCSFS_ENV)  # before gcsfs's first import reads it
gcsfs = pytest.importorskip("gcsfs", reason="needs gcsfs")
pytest.importorskip("gcp_storage_emulator", reason="needs gcp-storage-emulator")


@pytest.fixture(scope="module")
def gcs() -> Iterator[GcsEmulator]:
    with GcsEmulator() as g:
        g.make_bucket("bkt")
        yield g


@pytest.fixture
def fs(gcs: GcsEmulator) -> Any:
    return gcsfs.GCSFileSystem(endpoint_url=gcs.url, token="anon", skip_instance_cache=True)


def _move(gcs: GcsEmulator, src: str, dst: str, **query: str) -> tuple[int, dict[str, Any]]:
    q = urllib.parse.quote
    url = f"{gcs.url}/storage/v1/b/bkt/o/{q(src, safe='')}/moveTo/o/{q(dst, safe='')}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    req = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, {}


def test_gcsfs_rename_moves_in_one_call_with_no_fallback(fs, caplog) -> None:
    """DCP's ``.metadata.tmp`` -> ``.metadata`` through gcsfs: the move API answers, so gcsfs
    neither retries a 501 nor falls back to copy and delete."""
    fs.pipe("bkt/run/step-2/.metadata.tmp", b"meta" * 100)
    before = fs.info("bkt/run/step-2/.metadata.tmp")
    with caplog.at_level(logging.WARNING, logger="gcsfs"):
        fs.rename("bkt/run/step-2/.metadata.tmp", "bkt/run/step-2/.metadata")
    assert not [r for r in caplog.records if "Falling back" in r.getMessage()]
    fs.invalidate_cache()
    assert fs.ls("bkt/run/step-2") == ["bkt/run/step-2/.metadata"]
    after = fs.info("bkt/run/step-2/.metadata")
    assert fs.cat("bkt/run/step-2/.metadata") == b"meta" * 100
    assert after["generation"] != before["generation"] and str(after["metageneration"]) == "1"


def test_move_refuses_as_the_real_service_does(gcs, fs) -> None:
    fs.pipe("bkt/a", b"a")
    fs.pipe("bkt/b", b"b")
    gen_a = str(fs.info("bkt/a")["generation"])
    assert _move(gcs, "bkt-missing", "x")[0] == 404
    assert _move(gcs, "a", "a")[0] == 400
    assert _move(gcs, "a", "b", ifGenerationMatch="0")[0] == 412  # b exists
    assert _move(gcs, "a", "c", ifSourceGenerationMatch="1")[0] == 412
    assert _move(gcs, "a", "c", ifSourceGenerationNotMatch=gen_a)[0] == 412
    fs.invalidate_cache()
    assert fs.cat("bkt/a") == b"a" and not fs.exists("bkt/c")  # nothing moved on a refusal
    status, body = _move(gcs, "a", "c", ifGenerationMatch="0", ifSourceGenerationMatch=gen_a)
    assert status == 200 and body["name"] == "c" and body["bucket"] == "bkt"
    fs.invalidate_cache()
    assert not fs.exists("bkt/a") and fs.cat("bkt/c") == b"a"


def test_uploads_and_deletes_keep_generation_preconditions(gcs, fs) -> None:
    fs.pipe("bkt/p", b"1")
    gen = str(fs.info("bkt/p")["generation"])
    base = f"{gcs.url}/upload/storage/v1/b/bkt/o?uploadType=media&name=p"
    stale = urllib.request.Request(f"{base}&ifGenerationMatch=0", data=b"2", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(stale, timeout=10)
    assert e.value.code == 412
    ok = urllib.request.Request(f"{base}&ifGenerationMatch={gen}", data=b"2", method="POST")
    with urllib.request.urlopen(ok, timeout=10) as r:
        assert r.status == 200
    fs.invalidate_cache()
    assert fs.cat("bkt/p") == b"2"
    delete = urllib.request.Request(
        f"{gcs.url}/storage/v1/b/bkt/o/p?ifGenerationMatch={gen}", method="DELETE"
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(delete, timeout=10)
    assert e.value.code == 412
