"""What stage-in costs when many tasks on one host share an input: `--tasks` tasks set up at
once, each naming the same `--mb` MB object of the store by reference, staged into a work dir
of its own through the host's cache (`services/worker/stage_in.py`), as the worker stages them.
It prints the store's GETs and bytes read, the time until every task had its input, and, for
comparison, the time of one plain download of the object with the same client (the store's
own speed, measured in the same sitting).

The store is `VIGIL_STORE_URL` (with `VIGIL_S3_ENDPOINT_URL` and the `AWS_*` credentials for
S3: `eval "$(scripts/s3 env)"` after `scripts/s3 up`), else a directory store in a temporary
dir. Run it as root (entries are hard-linked into the work dirs as for confined jobs).

    python -m bench.stage_in --tasks 100 --mb 200
"""

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path

from services.worker.stage_in import StageIn, store_fetcher
from shared.domain.object_refs import ObjectRef
from shared.host.object_cache import Fetch, ObjectCache, Sink
from shared.objects import ObjectStore, open_store


def _random_file(path: Path, mb: int) -> None:
    block = os.urandom(1 << 20)
    with path.open("wb") as out:
        for n in range(mb):
            out.write(block[n % 251 :] + block[: n % 251])  # no two MiB alike


async def _run(store: ObjectStore, store_url: str, tasks: int, mb: int, scratch: Path) -> None:
    source = scratch / "input.bin"
    await asyncio.to_thread(_random_file, source, mb)
    info = await store.put_file(f"bench/stage-in-{uuid.uuid4().hex[:8]}/input.bin", source)
    assert info.sha256 is not None
    url = f"{store_url.rstrip('/')}/{info.key}"
    started = time.perf_counter()
    await store.get_file(info.key, scratch / "plain.bin")
    plain_s = time.perf_counter() - started
    (scratch / "plain.bin").unlink()

    cache = ObjectCache(scratch / "work" / ".cache", 4 * info.size)
    cache.open()
    gets = 0
    fetch_of = store_fetcher(store, store_url)

    def counted(url: str) -> Fetch:
        fetch = fetch_of(url)

        async def counting(sink: Sink) -> None:
            nonlocal gets
            gets += 1
            await fetch(sink)

        return counting

    stage = StageIn(cache, link=True, store_url=store_url)
    ref = ObjectRef("ref/input.bin", url, info.sha256)
    started = time.perf_counter()
    failures = await asyncio.gather(
        *(stage.place(counted, scratch / "work" / "j" / f"t{n}", [ref]) for n in range(tasks))
    )
    staged_s = time.perf_counter() - started
    assert not any(failures), failures
    await store.delete([info.key])
    mib, plain_mib_s = info.size / 2**20, info.size / 2**20 / plain_s
    print(f"store: {store.url}; object: {mib:.0f} MiB; tasks: {tasks}")
    print(f"one plain download (same client): {plain_s:.2f} s ({plain_mib_s:.0f} MiB/s)")
    print(
        f"stage-in of {tasks} tasks: {staged_s:.2f} s until every task had it; store GETs"
        f" {gets}, {cache.fetched_bytes / 2**20:.0f} MiB read, cache hits {cache.hits}"
        f" ({tasks} plain downloads: {tasks * mib / 1024:.1f} GiB, ~{tasks * plain_s:.0f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--mb", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vigil-stage-in-") as scratch:
        store_url = os.environ.get("VIGIL_STORE_URL") or Path(scratch, "store").as_uri()
        store = open_store(store_url, endpoint_url=os.environ.get("VIGIL_S3_ENDPOINT_URL", ""))

        async def run() -> None:
            try:
                await _run(store, store_url, args.tasks, args.mb, Path(scratch))
            finally:
                await store.close()

        asyncio.run(run())


if __name__ == "__main__":
    main()
