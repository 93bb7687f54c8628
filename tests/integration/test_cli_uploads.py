"""`vigil submit --file` with files past what a job's body carries: the installed command
uploads each large one straight to the real SeaweedFS through a link the api signs, holding no
credential of the store, and the job names it by URL; a directory store, which signs no links,
is refused with what to do."""

import asyncio
import hashlib
import json
import os
import uuid
from pathlib import Path

import pytest

from tests.installed_cli import Ran, run_vigil
from tests.integration.object_stores import StoreAt, store_at
from tests.integration.served_api import Served, served_api

pytestmark = pytest.mark.integration

#: What a user's shell holds: the api and a token, no credential of the store.
_NO_STORE_KEYS = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_REGION": ""}


async def _submit(served: Served, tmp_path: Path, *files: Path) -> Ran:
    job_file = tmp_path / "job.yaml"
    job_file.write_text("command: sha256sum big.bin\n")
    token = served.user.headers["Authorization"].removeprefix("Bearer ")
    env = {"VIGIL_URL": served.base_url, "VIGIL_TOKEN": token, "VIGIL_CONFIG": "/dev/null"}
    args = ["submit", str(job_file), *(a for f in files for a in ("--file", str(f))), "--json"]
    return await asyncio.to_thread(run_vigil, args, env | _NO_STORE_KEYS)


@pytest.mark.parametrize("kind", ["s3", "directory"])
async def test_large_files_go_straight_to_the_store_and_small_ones_in_the_body(
    request: pytest.FixtureRequest,
    session_database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    store: StoreAt = store_at(kind, request, tmp_path, monkeypatch)
    big, small = tmp_path / "big.bin", tmp_path / "run.sh"
    big.write_bytes(os.urandom(9 * 1024 * 1024))  # past the 8 MiB a body carries
    small.write_bytes(b"echo hi\n")
    namespace = f"up-{uuid.uuid4().hex[:8]}"
    try:
        async with served_api(session_database_url, namespace, **store.settings()) as served:
            ran = await _submit(served, tmp_path, big, small)
    finally:
        await store.store.close()

    if kind == "directory":
        assert ran.exit_code != 0
        assert "takes no direct uploads: give the file's bytes in the job" in ran.stderr
        return
    assert ran.exit_code == 0, ran.stderr
    sha = hashlib.sha256(big.read_bytes()).hexdigest()
    files = {f["path"]: f for f in json.loads(ran.stdout)["files"]}
    assert files["big.bin"]["size"] == 9 * 1024 * 1024
    assert files["big.bin"]["url"].startswith(f"{store.url}/files/")
    assert files["big.bin"]["url"].endswith(f"/{sha}")
    assert "url" not in files["run.sh"]  # small: carried in the body
