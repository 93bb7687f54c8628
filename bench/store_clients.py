"""The two candidate S3 clients side by side on the real SeaweedFS: put and get of one file.

    scripts/s3 up && eval "$(scripts/s3 env)"
    .venv/bin/pip install aiobotocore    # not a dependency of Vigil: only this bench uses it
    .venv/bin/pip install aiobotocore   # the other candidate: not one of Vigil's dependencies
    .venv/bin/python -m bench.store_clients [--mb 300] [--rounds 2]

Prints MB/s for a streaming multipart put of a file and a streaming get to a file, with obstore
(Rust's object_store under Python) and aiobotocore (botocore over aiohttp), in one sitting, each
round alternating the two so that the machine's load falls on both alike. The reason Vigil uses
obstore is in docs/explanation/storage.md.
"""

import argparse
import asyncio
import importlib
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import obstore
from obstore.store import S3Store

CHUNK = 8 << 20


def _bucket_prefix() -> tuple[str, str]:
    url = urlsplit(os.environ["VIGIL_STORE_URL"])
    return url.netloc, url.path.strip("/")


async def obstore_put(path: Path, key: str) -> None:
    bucket, _ = _bucket_prefix()
    store = S3Store(
        bucket, endpoint=os.environ["VIGIL_S3_ENDPOINT_URL"], client_options={"allow_http": True}
    )
    await obstore.put_async(store, key, path, chunk_size=CHUNK, max_concurrency=4)


async def obstore_get(key: str, dest: Path) -> None:
    bucket, _ = _bucket_prefix()
    store = S3Store(
        bucket, endpoint=os.environ["VIGIL_S3_ENDPOINT_URL"], client_options={"allow_http": True}
    )
    result = await obstore.get_async(store, key)
    with dest.open("wb") as out:
        async for chunk in result.stream(min_chunk_size=CHUNK):
            out.write(chunk)


def get_session() -> Any:
    """aiobotocore's session: not a dependency of Vigil (`pip install aiobotocore` to run the
    comparison), so loaded by name."""
    return importlib.import_module("aiobotocore.session").get_session()


async def botocore_put(path: Path, key: str) -> None:
    bucket, _ = _bucket_prefix()
    session = get_session()
    async with session.create_client("s3", endpoint_url=os.environ["VIGIL_S3_ENDPOINT_URL"]) as s3:
        upload = await s3.create_multipart_upload(Bucket=bucket, Key=key)
        parts = []
        with path.open("rb") as f:
            number = 1
            while chunk := f.read(CHUNK):
                part = await s3.upload_part(
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload["UploadId"],
                    PartNumber=number,
                    Body=chunk,
                )
                parts.append({"ETag": part["ETag"], "PartNumber": number})
                number += 1
        await s3.complete_multipart_upload(
            Bucket=bucket,
            Key=key,
            UploadId=upload["UploadId"],
            MultipartUpload={"Parts": parts},
        )


async def botocore_get(key: str, dest: Path) -> None:
    bucket, _ = _bucket_prefix()
    session = get_session()
    async with session.create_client("s3", endpoint_url=os.environ["VIGIL_S3_ENDPOINT_URL"]) as s3:
        response = await s3.get_object(Bucket=bucket, Key=key)
        with dest.open("wb") as out:
            async for chunk in response["Body"].iter_chunks(CHUNK):
                out.write(chunk)


async def _timed(what: Callable[[], Awaitable[None]]) -> float:
    started = time.perf_counter()
    await what()
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    _, prefix = _bucket_prefix()
    with tempfile.TemporaryDirectory() as scratch:
        src = Path(scratch) / "src"
        with src.open("wb") as f:
            for _ in range(args.mb):
                f.write(os.urandom(1 << 20))
        clients = {
            "obstore": (obstore_put, obstore_get),
            "aiobotocore": (botocore_put, botocore_get),
        }
        for round_ in range(args.rounds):
            for name, (put, get) in clients.items():
                key = f"{prefix}/bench/clients/{name}-{round_}"
                dest = Path(scratch) / f"dest-{name}"
                up = await _timed(lambda put=put, key=key: put(src, key))  # type: ignore[misc]
                down = await _timed(lambda get=get, key=key, dest=dest: get(key, dest))  # type: ignore[misc]
                assert dest.stat().st_size == src.stat().st_size
                dest.unlink()
                print(
                    f"{name:12s} round {round_}: put {args.mb / up:6.1f} MB/s"
                    f"  get {args.mb / down:6.1f} MB/s  ({args.mb} MB)"
                )


if __name__ == "__main__":
    asyncio.run(main())
