"""Whether the objects a submission names by reference may be staged: each URL in the
installation's store (`VIGIL_STORE_URL`) with a valid key, readable by the user, and, for a
job's files, there with the sha256 named (its size is then recorded with the job's files).

Who may name what, by the object's key under the store:
- `outputs/<job>/...`: the outputs of a job the user may see (their own; an operator's: any);
- `files/<user>/...`: the files a user uploaded (`vigil submit` does, by their sha256): their
  own only, so that no one reads another user's upload by guessing or learning its hash;
- anything else: the site's shared data, put in the store by its operators, for every user.

A refusal is a 422 naming the field; a store that cannot be reached, a 503 saying so: the job
is not made either way.
"""

import asyncio
from collections.abc import Sequence
from typing import Any, Final

from fastapi import HTTPException, status
from fastapi.exceptions import RequestValidationError

from services.api import queries
from services.api.access import owner_filter
from services.api.errors import invalid
from shared.domain import object_refs
from shared.domain.bundle import BundleFile
from shared.domain.object_refs import ObjectRef
from shared.objects import ObjectNotFound, ObjectStore, ObjectStoreError, check_key
from shared.objects.keys import OUTPUTS, UPLOADS
from shared.store import quota_repo
from shared.store.db import Connection
from shared.store.users_repo import User

#: HEADs of one submission's files in flight at once.
_AT_ONCE: Final = 16

Loc = tuple[str | int, ...]


async def stored_files(
    conn: Connection,
    store: ObjectStore,
    store_url: str,
    user: User,
    refs: Sequence[ObjectRef],
) -> list[BundleFile]:
    """The job's files given by reference as it lists them (with the size the store holds);
    a 422 naming each one the user may not name or the store does not hold as named, a 503
    when the store cannot be reached."""
    loc: Loc = ("body", "files")
    errors = await reference_errors(conn, store_url, user, [((*loc, r.path), r) for r in refs])
    if errors:
        raise RequestValidationError(errors)
    room = asyncio.Semaphore(_AT_ONCE)

    async def sized(ref: ObjectRef) -> BundleFile | str:
        async with room:
            return await _sized(store, store_url, ref)

    found = await asyncio.gather(*(sized(ref) for ref in refs))
    problems = [
        ((*loc, ref.path), why)
        for ref, why in zip(refs, found, strict=True)
        if isinstance(why, str)
    ]
    if problems:
        raise RequestValidationError(_errors(problems))
    files = [file for file in found if isinstance(file, BundleFile)]
    await _count_uploads(conn, store_url, user, files)
    return files


async def _count_uploads(
    conn: Connection, store_url: str, user: User, files: Sequence[BundleFile]
) -> None:
    """Count the user's own uploads among `files` by the size the store holds (the size
    given when they were handed out may have been another)."""
    own = f"{UPLOADS}/{user.id}/"
    for file in files:
        key = object_refs.key_in(store_url, file.url or "")
        if key is not None and key == own + file.sha256:
            async with conn.transaction():
                await quota_repo.correct_upload(conn, user.id, file.sha256, file.size)


async def input_errors(
    conn: Connection, store_url: str, user: User, inputs: Sequence[Any], loc: Loc
) -> list[Any]:
    """The problems of the objects the inputs name (at `loc` + the input's position): each in
    the store, with a valid key the user may name. Whether it is there is seen at stage-in (a
    campaign's inputs are many: no request to the store each)."""
    named = [
        ((*loc, i, object_refs.OBJECTS_KEY, ref.path), ref)
        for i, value in enumerate(inputs)
        for ref in object_refs.input_objects(value)  # its form was checked with the body
    ]
    return await reference_errors(conn, store_url, user, named)


async def reference_errors(
    conn: Connection, store_url: str, user: User, named: Sequence[tuple[Loc, ObjectRef]]
) -> list[Any]:
    """The 422 errors of the references of `named` that are not in the store, have an invalid
    key, or name an object of Vigil's the user may not read, each saying why."""
    errors: list[tuple[Loc, str]] = []
    jobs: dict[str, list[Loc]] = {}
    for where, ref in named:
        key = object_refs.key_in(store_url, ref.url)
        why = _key_problem(store_url, ref.url, key, user)
        if why is not None:
            errors.append((where, why))
        elif key is not None and key.startswith(f"{OUTPUTS}/"):
            jobs.setdefault(key.split("/")[1], []).append(where)
    for job_id, places in sorted(jobs.items()):
        if not await queries.job_visible(conn, job_id, owner_filter(user)):
            why = f"job {job_id!r} does not exist: its outputs cannot be named"
            errors.extend((where, why) for where in places)
    return _errors(errors)


def _key_problem(store_url: str, url: str, key: str | None, user: User) -> str | None:
    if key is None:
        return f"{url} is not in the installation's store ({store_url}/...)"
    try:
        check_key(key)
    except ValueError:
        return (
            f"{url}: not a valid key of the store (segments of letters, digits and '._=+@,-',"
            " none starting with a dot)"
        )
    top, _, rest = key.partition("/")
    if top == UPLOADS and not user.is_operator and rest.split("/")[0] != user.id:
        return f"{url} is another user's upload: only {store_url}/{UPLOADS}/{user.id}/... is yours"
    if top == OUTPUTS and not rest:
        return f"{url} names no job's output"
    return None


async def _sized(store: ObjectStore, store_url: str, ref: ObjectRef) -> BundleFile | str:
    """The file as the job lists it, or why the store does not hold it as named."""
    key = object_refs.key_in(store_url, ref.url)
    assert key is not None  # checked first
    try:
        info = await store.head(key)
    except ObjectNotFound:
        return f"no object at {ref.url}"
    except ObjectStoreError as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            detail=f"the store cannot be reached to check {ref.url}: {exc}; try again later",
        ) from exc
    if info.sha256 is not None and info.sha256 != ref.sha256:
        return f"the object at {ref.url} has sha256 {info.sha256}, not {ref.sha256}"
    return BundleFile(ref.path, info.size, ref.sha256, ref.executable, ref.url)


def _errors(problems: Sequence[tuple[Loc, str]]) -> list[Any]:
    return [e for where, why in problems for e in invalid(where, why).errors()]
