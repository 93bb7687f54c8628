"""A job's bundle: the bytes of the files it was submitted with (`job_files`), stored once per
job; their list is the job's `files` column (`shared/domain/bundle.py`)."""

from shared.domain.bundle import BundleFile
from shared.store.db import Connection


async def save(
    conn: Connection, job_id: str, files: list[BundleFile], contents: dict[str, bytes]
) -> None:
    """Store the bytes of the job's files (in the caller's transaction, with the job; the list
    is the job's, `jobs_repo.create`). Locks: the rows it inserts."""
    await conn.executemany(
        "INSERT INTO job_files (job_id, path, content) VALUES ($1, $2, $3)",
        [(job_id, f.path, contents[f.path]) for f in files],
    )


async def contents(conn: Connection, job_id: str) -> dict[str, bytes]:
    """The bytes of the job's files, by path (none once the job was purged)."""
    rows = await conn.fetch("SELECT path, content FROM job_files WHERE job_id = $1", job_id)
    return {r["path"]: bytes(r["content"]) for r in rows}


async def delete(conn: Connection, job_id: str) -> str:
    """Forget the bytes of the job's files (a purge; their list stays on the job). Locks: the
    rows it deletes."""
    return await conn.execute("DELETE FROM job_files WHERE job_id = $1", job_id)
