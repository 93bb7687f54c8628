"""Stage-out against the store's own put, with the same client, in one sitting.

    scripts/s3 up && eval "$(scripts/s3 env)"     # or VIGIL_STORE_URL=file:///some/dir
    .venv/bin/python -m bench.stage_out [--mb 1024] [--rounds 2]

Each round, in turn on the same file of random bytes:
- **put**: the client's own streaming put of the file (obstore's `put_async` of a path, parts of
  8 MiB, 4 in flight; for a directory store, a copy into it), nothing else;
- **stage-out**: what a task's post-processing does for one output: its record (size and
  sha256, `TaskContext.record_output`'s read) and `StageOut.put_outputs` (the put through a
  descriptor, the bytes checked against that sha256 while they are sent), as the worker runs it.
  On S3 that is a host's put, with no credential: each request signed by the control plane's
  signer (`services/scheduler/signer.py`'s `Links`, here in the bench's process: the signer's
  round trips over RabbitMQ, one per 16 parts, and its check in PostgreSQL are left out), sent
  over httpx (`shared/objects/signed.py`).

Prints MB/s of each and stage-out's share of the put's (the goal: 70 % or more). A job with no
outputs makes no store call at all (`tests/integration/test_stage_out.py` runs one against a
store that fails any call); its cost is `bench.worker_path`'s, which it does not change.
"""

import argparse
import asyncio
import hashlib
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from uuid import UUID

import obstore

from services.scheduler.signer import Links
from services.worker.stage_out import StageOut
from shared.domain.messages import SignOp, SignRequest
from shared.domain.outputs import OutputRecord
from shared.objects import CHUNK_BYTES, ObjectStore, open_store
from shared.objects.s3 import PART_CONCURRENCY, S3ObjectStore
from shared.objects.signed import Signed, SignedStore, http_client


def _record(workdir: Path, name: str) -> OutputRecord:
    """What `record_output` makes of the file: its size and sha256, read once."""
    digest = hashlib.sha256()
    size = 0
    with (workdir / name).open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return OutputRecord(name, str(workdir / name), size, digest.hexdigest())


async def _raw_put(url: str, endpoint: str, src: Path, key: str) -> None:
    """The store's own put of the file, with the same client and the same part size."""
    store = open_store(url, endpoint)
    if isinstance(store, S3ObjectStore):
        await obstore.put_async(
            store._store,  # the client itself, as stage-out's put uses it
            key,
            src,
            chunk_size=CHUNK_BYTES,
            max_concurrency=PART_CONCURRENCY,
        )
        return
    target = Path(store.url.removeprefix("file://")) / key
    target.parent.mkdir(parents=True, exist_ok=True)
    await asyncio.to_thread(shutil.copyfile, src, target)


class InProcessSigning:
    """The signer's links, asked in-process, no question asked (a host's requests, without
    the round trip and the database's check)."""

    def __init__(self, links: Links) -> None:
        self.links = links

    async def __call__(self, op: SignOp, key: str, **more: Any) -> Signed:
        request = SignRequest(host_id="h", task_id="t", claim=UUID(int=0), op=op, key=key, **more)
        reply = self.links.signed(request)
        return Signed(reply.urls, reply.headers, reply.complete, reply.abort)


async def _stage_out(url: str, endpoint: str, workdir: Path, job: str, attempt: int) -> None:
    """A host's stage-out of the file: on S3, through signed links (no credential)."""
    async with http_client() as http:
        store: ObjectStore = (
            SignedStore(url, InProcessSigning(Links.of_store(url, endpoint, 300)), http)
            if url.startswith("s3://")
            else open_store(url)
        )
        record = await asyncio.to_thread(_record, workdir, "out.bin")
        stored = await StageOut(url, patience_s=60).put_outputs(
            store, job, "t-bench", attempt, workdir, [record]
        )
    assert isinstance(stored, list), stored


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    url = os.environ.get("VIGIL_STORE_URL", "file:///tmp/vigil-store")
    endpoint = os.environ.get("VIGIL_S3_ENDPOINT_URL", "")
    job = f"j-bench{uuid.uuid4().hex[:6]}"
    print(f"store {url} {endpoint}; a file of {args.mb} MB")
    with tempfile.TemporaryDirectory(dir="/var/tmp") as scratch:
        workdir = Path(scratch)
        with (workdir / "out.bin").open("wb") as f:
            for _ in range(args.mb):
                f.write(os.urandom(1 << 20))
        for round_ in range(args.rounds):
            started = time.perf_counter()
            await _raw_put(url, endpoint, workdir / "out.bin", f"bench/{job}/raw-{round_}")
            put_s = time.perf_counter() - started
            started = time.perf_counter()
            await _stage_out(url, endpoint, workdir, job, round_ + 1)
            out_s = time.perf_counter() - started
            print(
                f"round {round_}: put {args.mb / put_s:6.1f} MB/s  stage-out"
                f" {args.mb / out_s:6.1f} MB/s  ({put_s / out_s:.0%} of the put)"
            )
    store = open_store(url, endpoint)
    keys = [i.key for i in await store.list_prefix(f"bench/{job}")]
    keys += [i.key for i in await store.list_prefix(f"outputs/{job}")]
    await store.delete(keys)


if __name__ == "__main__":
    asyncio.run(main())
