"""The two kinds of object store the tests of stage-in run on, as a fixture's param: a
directory, and a prefix of its own in the real SeaweedFS of `scripts/s3`, with the control
plane's signer that a host's requests to it go through (holds no tests)."""

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.scheduler.signer import Signer
from shared.messaging.amqp import open_broker
from shared.messaging.topology import Topology
from shared.objects import ObjectStore, open_store
from shared.store.db import Pool
from tests.conftest import AMQP_URL

KINDS = ["directory", "s3"]


@dataclass(frozen=True)
class StoreAt:
    """An open store, the URL that names it (`VIGIL_STORE_URL`) and its endpoint."""

    store: ObjectStore
    url: str
    endpoint_url: str = ""

    def settings(self) -> dict[str, str]:
        """The settings a service of this store takes."""
        return {"store_url": self.url, "s3_endpoint_url": self.endpoint_url}

    def url_of(self, key: str) -> str:
        return f"{self.url}/{key}"


def store_at(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, mp: pytest.MonkeyPatch
) -> StoreAt:
    """A store of `kind` (for `s3`, the credentials of SeaweedFS put in the environment for
    the test, as an operator puts them in the services')."""
    if kind == "directory":
        url = (tmp_path / "store").as_uri()
        return StoreAt(open_store(url), url)
    env: dict[str, str] = request.getfixturevalue("s3_env")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        mp.setenv(name, env[name])
    url = f"{env['VIGIL_STORE_URL']}/test-{uuid.uuid4().hex[:10]}"
    endpoint = env["VIGIL_S3_ENDPOINT_URL"]
    return StoreAt(open_store(url, endpoint_url=endpoint), url, endpoint)


@asynccontextmanager
async def signer_of(store: StoreAt, pool: Pool, namespace: str) -> AsyncIterator[Signer | None]:
    """The control plane's signer of `store`, answering hosts in `namespace` (as a
    scheduler does) while the block runs; None for a directory, which needs none."""
    if not store.url.startswith("s3://"):
        yield None
        return
    signer = Signer.of_store(pool, store.url, store.endpoint_url, 300)
    stop = asyncio.Event()
    async with open_broker(AMQP_URL, Topology(namespace), name="test-signer") as broker:
        serving = asyncio.create_task(signer.serve(broker, stop))
        try:
            yield signer
        finally:
            stop.set()
            await serving
