"""A real S3-compatible server for tests: moto's ``ThreadedMotoServer`` on 127.0.0.1, a free port.

Credentials go into the standard AWS environment variables (as a deployment's would), the
endpoint into fsspec storage options; the server is stopped by its handle and fsspec's process
defaults (``stages.store.use_storage_options`` sets them) are restored afterwards.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fsspec
import fsspec.config
import pytest


@contextmanager
def moto_s3(bucket: str, key_id: str, secret: str) -> Iterator[tuple[dict[str, Any], Any]]:
    """(storage options with the endpoint, an s3fs filesystem) of a fresh server holding ``bucket``."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    saved_conf = {k: dict(v) for k, v in fsspec.config.conf.items()}
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            mp.delenv(name, raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", key_id)
        mp.setenv("AWS_SECRET_ACCESS_KEY", secret)
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            assert host == "127.0.0.1"
            options = {"endpoint_url": f"http://{host}:{port}"}
            # moto keeps its buckets in process-wide state that outlives a stopped server: a module
            # after another of the same bucket in one (xdist worker) process would find it. Reset.
            urllib.request.urlopen(urllib.request.Request(f"{options['endpoint_url']}/moto-api/reset",
                                                          method="POST"), timeout=30).close()
            fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
            fs.mkdir(bucket)
            yield options, fs
        finally:
            server.stop()
            fsspec.config.conf.clear()
            fsspec.config.conf.update(saved_conf)
