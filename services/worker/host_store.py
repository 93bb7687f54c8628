"""The object store as a host reaches it, for each task it holds.

A directory store (`file://`) is written and read by the worker itself: one store for every
task. An S3 store is reached with no credential on the host: each task gets a
`SignedStore` whose every request is signed by the control plane's signer for that task, under
its claim (`shared/objects/signed.py`, `services/scheduler/signer.py`); the signer lets it
write only that task's output keys and read only what it names. The worker's environment
needs no `AWS_*`, and has none to hand on to its commands.
"""

from dataclasses import dataclass

import httpx

from services.worker.tenure import Tenure
from shared.messaging.amqp import Broker
from shared.messaging.signing import SignerClient, TaskSigning
from shared.objects import ObjectStore, open_store
from shared.objects.signed import SignedStore, http_client


@dataclass
class HostStore:
    """Either one `store` for every task (a directory, or a test's), or the `signer` and the
    `http` client of the tasks' signed stores."""

    url: str
    host_id: str
    store: ObjectStore | None = None
    signer: SignerClient | None = None
    http: httpx.AsyncClient | None = None

    @classmethod
    def of_host(cls, url: str, host_id: str, broker: Broker) -> "HostStore":
        """The host's way to the store at `url` (`VIGIL_STORE_URL`)."""
        if url.startswith("s3://"):
            signer = SignerClient(broker.connection, broker.topology)
            return cls(url, host_id, signer=signer, http=http_client())
        return cls(url, host_id, store=open_store(url))

    def for_task(self, held: Tenure) -> ObjectStore:
        """The store as task `held` may use it."""
        if self.store is not None:
            return self.store
        assert self.signer is not None and self.http is not None
        signing = TaskSigning(self.signer, self.host_id, held.task.id, held.claim)
        return SignedStore(self.url, signing, self.http)

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()
        if self.store is not None:
            await self.store.close()
