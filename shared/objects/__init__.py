"""Objects: where a task's outputs, and the files and inputs given by reference, are kept.

One interface (`ObjectStore`, `shared/objects/store.py`), two backends chosen by a store URL:

- `file:///abs/dir`: a local or shared directory (`shared/objects/directory.py`), the default
  (`scripts/up` puts it under the run dir; no server needed);
- `s3://BUCKET/PREFIX`: an S3 bucket (`shared/objects/s3.py`) at `VIGIL_S3_ENDPOINT_URL` (none:
  AWS), with the standard `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`: the
  control plane's. A host holds none: it reaches the bucket through links the scheduler signs
  for the task it holds (`shared/objects/signed.py`).

Use it so:

    from shared.objects import open_store, ObjectStoreError, ObjectNotFound

    store = open_store(settings.store_url, endpoint_url=settings.s3_endpoint_url)
    try:
        info = await store.put_file("outputs/TASK/1/result.csv", Path("result.csv"))
        # info.size, info.sha256 (computed while reading; also kept with the object)
        await store.get_file(info.key, Path("copy.csv"))          # offset=N resumes a cut one
        async for chunk in store.read(info.key): ...               # to stream it on
        url = await store.presigned_get(info.key, 300)             # None for a directory
        await store.head(info.key); await store.list_prefix("outputs/TASK/")
        await store.delete([info.key])
    except ObjectNotFound: ...      # no such key
    except ObjectStoreError: ...    # unreachable or refusing: retry later (it names the store)
    finally:
        await store.close()

Keys are write-once (`ObjectExists` when taken) and a put is never partly visible. Key segments
are checked by `check_key` (no leading dot, no `..`): build keys from ids, never from user text
unchecked. The settings `VIGIL_STORE_URL` and `VIGIL_S3_ENDPOINT_URL` are `store_url` and
`s3_endpoint_url` of `shared.runtime.config.CommonSettings`.
"""

from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

from shared.objects.directory import DirectoryStore
from shared.objects.store import (
    CHUNK_BYTES,
    ContentChanged,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    check_key,
)

__all__ = [
    "CHUNK_BYTES",
    "STORE_CREDENTIALS",
    "ContentChanged",
    "ObjectExists",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "check_key",
    "check_store_url",
    "open_store",
]

#: The prefixes of the environment variables that hold the store's credentials: the control
#: plane's alone; never given to a host (a worker, a supervisor, a pilot) nor to a job.
STORE_CREDENTIALS: Final = ("AWS_",)


def check_store_url(url: str) -> str:
    """`url` if it names a store Vigil can open (`file:///abs/dir` or `s3://BUCKET[/PREFIX]`),
    else ValueError saying what is wrong."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ValueError(f"a directory store is file:///ABSOLUTE/DIR, not {url!r}")
    elif parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"an S3 store is s3://BUCKET/PREFIX, not {url!r}")
        if parts.path.strip("/"):
            check_key(parts.path.strip("/"))
    else:
        raise ValueError(f"a store URL is file:///ABSOLUTE/DIR or s3://BUCKET/PREFIX, not {url!r}")
    return url


def open_store(url: str, endpoint_url: str = "") -> ObjectStore:
    """The store a URL names (see `check_store_url`); `endpoint_url` is for an S3 store
    other than AWS. Opening connects to nothing: the first operation does."""
    parts = urlsplit(check_store_url(url))
    if parts.scheme == "file":
        return DirectoryStore(Path(unquote(parts.path)))
    from shared.objects.s3 import S3ObjectStore  # obstore, loaded only for an S3 store

    return S3ObjectStore(parts.netloc, parts.path.strip("/"), endpoint_url=endpoint_url)
