"""`POST /uploads`: where a client uploads a file a job names by reference, straight to the
store: the user's own key for those bytes, `files/<user>/<sha256>`, and a short-lived link to
PUT them there (an S3 store's signed URL), so that neither the bytes go through the api nor
the client holds the store's credentials. The bytes are checked against the sha256 when a task
stages them in (`services/worker/stage_in.py`): a client that uploads other bytes under that
key fails its own tasks, nobody else's.

A user deletes an upload of theirs with `DELETE /uploads/{sha256}`.

Each upload counts against the user's quota of stored bytes (`shared/store/quota_repo.py`)
from the moment it is handed out, by the size the client gives, once per sha256; the size the
store holds replaces it when the api sees the object (here, or when a job names it).
"""

import logging
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, status

from services.api.deps import AUTH_RESPONSES, ObjectStoreDep, PoolDep, SettingsDep, SubmittingUser
from services.api.schemas.uploads import UploadPublic, UploadRequest
from shared.domain import store_quota
from shared.domain.errors import Conflict, NotFound
from shared.domain.store_quota import OverQuota
from shared.objects import ObjectNotFound, ObjectStoreError
from shared.objects.keys import upload_key
from shared.store import quota_repo
from shared.store.db import Pool

logger = logging.getLogger(__name__)

router = APIRouter(tags=["jobs"], responses=AUTH_RESPONSES)


@router.post(
    "/uploads",
    responses={
        409: {
            "description": "The store takes no direct uploads (a directory store), or the file"
            " would take the user over their quota of stored bytes."
        },
        503: {"description": "The store cannot be reached."},
    },
)
async def start_upload(
    user: SubmittingUser,
    body: UploadRequest,
    store: ObjectStoreDep,
    settings: SettingsDep,
    pool: PoolDep,
) -> UploadPublic:
    """Where to upload the file of `sha256` and `size`: its `url` (named so in a job's
    `files`, with its sha256), and `put_url`, a link to PUT its bytes to, straight to the
    store, good for `expires_s` (VIGIL_DOWNLOAD_LINK_S); `put_url` is null when the store
    holds those bytes there already (put there by the api, which recorded their sha256).

    409 naming the bytes stored and the limit when the file would take the user over their
    quota of stored bytes (VIGIL_STORE_QUOTA_BYTES, or their own)."""
    key = upload_key(user.id, body.sha256)
    url = f"{settings.store_url}/{key}"
    try:
        try:
            held = await store.head(key)
        except ObjectNotFound:
            held = None
        if held is not None and held.sha256 == body.sha256:
            async with pool.acquire() as conn, conn.transaction():
                await quota_repo.correct_upload(conn, user.id, body.sha256, held.size)
            return UploadPublic(url=url, put_url=None)
        put_url = await store.presigned_put(key, settings.download_link_s)
        if put_url is not None:
            await _count(pool, user.id, body.sha256, body.size, settings.store_quota_bytes)
    except ObjectStoreError as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            detail=f"the store cannot be reached: {exc}; try again later",
        ) from exc
    if put_url is None:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            detail=f"the store ({settings.store_url}) takes no direct uploads: give the file's"
            " bytes in the job (8 MiB in all), or put it in the store and name it by its URL",
        )
    logger.info("upload of %s handed out", key, extra={"action": "upload", "user": user.name})
    return UploadPublic(url=url, put_url=put_url, expires_s=settings.download_link_s)


async def _count(pool: Pool, user_id: str, sha256: str, size: int, default: int) -> None:
    """Count the upload against the user's quota, or refuse it (409) when it would go over."""
    try:
        async with pool.acquire() as conn, conn.transaction():
            await quota_repo.record_upload(conn, user_id, sha256, size, default)
    except OverQuota as refused:
        raise Conflict(str(refused), next_step=store_quota.NEXT_STEP) from None


Sha256Path = Annotated[
    str, Path(pattern=r"^[0-9a-f]{64}$", description="The file's sha256 (64 lowercase hex digits).")
]


@router.delete(
    "/uploads/{sha256}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={
        404: {"description": "The user uploaded no file of that sha256."},
        503: {"description": "The store cannot be reached."},
    },
)
async def delete_upload(
    user: SubmittingUser, sha256: Sha256Path, store: ObjectStoreDep, pool: PoolDep
) -> None:
    """Delete the caller's upload of `sha256` from the store: 204, and its bytes no longer
    count against their quota. A task that names it afterwards fails its setup (the object is
    not in the store). 404 when they uploaded no such file; 503 when the store cannot be
    reached (nothing changes then: try again)."""
    key = upload_key(user.id, sha256)
    async with pool.acquire() as conn:
        recorded = await quota_repo.upload_size(conn, user.id, sha256)
    try:
        if recorded is None:
            await store.head(key)  # one uploaded before uploads were counted
        await store.delete([key])
    except ObjectNotFound:
        raise NotFound(f"you uploaded no file of sha256 {sha256}") from None
    except ObjectStoreError as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            detail=f"the store cannot be reached: {exc}; try again later",
        ) from exc
    async with pool.acquire() as conn, conn.transaction():
        given = await quota_repo.forget_upload(conn, user.id, sha256)
    logger.info(
        "upload of %s deleted (%d bytes given back)",
        key,
        given,
        extra={"action": "delete_upload", "user": user.name},
    )
