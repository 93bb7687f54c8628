"""Two installations on one host never give their jobs the same uids: each holds a range of its
own there (`shared/host/uid_ranges.py`), and a worker refuses to start on a range another
installation holds, while a worker of the same installation starts again on it."""

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from services.worker import launch, main
from services.worker.confinement import Confinement
from services.worker.settings import WorkerSettings
from shared.host import uid_ranges
from shared.host.uid_ranges import UidRangeHeld
from shared.store import installation_repo
from shared.store.db import open_pool
from tests.conftest import create_database, drop_database, require_servers


@pytest.fixture
async def fresh_url() -> AsyncIterator[str]:
    """A migrated database of this test's own: an installation of its own."""
    require_servers()
    name = f"vigil_test_uids_{uuid.uuid4().hex[:8]}"
    url = await create_database(name)
    try:
        yield url
    finally:
        await drop_database(name)


def test_the_same_installation_keeps_its_range_and_another_is_refused_it(
    tmp_path: Path,
) -> None:
    claims = tmp_path / "uid-ranges"

    first = uid_ranges.claim(claims, "install-a", 5_000_000)
    again = uid_ranges.claim(claims, "install-a", 5_000_000)

    assert first == again == 5_000_000
    assert (claims / "5000000").read_text() == "install-a\n"
    with pytest.raises(UidRangeHeld, match="installation install-a holds"):
        uid_ranges.claim(claims, "install-b", 5_000_000)
    with pytest.raises(UidRangeHeld, match="overlap the range from 5000000"):
        uid_ranges.claim(claims, "install-b", 5_500_000)


def test_with_no_base_an_installation_takes_its_own_range_else_the_first_free(
    tmp_path: Path,
) -> None:
    claims = tmp_path / "uid-ranges"
    uid_ranges.claim(claims, "install-a", uid_ranges.DEFAULT_BASE)

    taken = uid_ranges.claim(claims, "install-b", None)

    assert taken == uid_ranges.DEFAULT_BASE + uid_ranges.SIZE
    assert uid_ranges.claim(claims, "install-b", None) == taken
    assert uid_ranges.claim(claims, "install-a", None) == uid_ranges.DEFAULT_BASE


def test_the_claims_dir_is_private_and_a_link_there_is_refused(tmp_path: Path) -> None:
    uid_ranges.claim(tmp_path / "uid-ranges", "install-a", 5_000_000)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")

    assert (tmp_path / "uid-ranges").stat().st_mode & 0o777 == 0o700
    with pytest.raises(Exception, match="symbolic link"):
        uid_ranges.claim(tmp_path / "linked", "install-a", 5_000_000)


def test_a_released_range_is_free_again(tmp_path: Path) -> None:
    claims = tmp_path / "uid-ranges"
    uid_ranges.claim(claims, "install-a", 5_000_000)

    assert uid_ranges.release(claims, "install-a", 5_000_000)

    assert uid_ranges.claim(claims, "install-b", 5_000_000) == 5_000_000


def _confined(settings: WorkerSettings) -> launch.Choice:
    """What `launch.choose` gives a confining worker (without trying to confine here)."""
    return launch.Choice(Confinement(settings.job_uid_base), Path(settings.work_root))


async def _start_with(url: str, claims: Path, base: int | None = None) -> int:
    """The uid base a confining worker of the installation at `url` starts with (`base`:
    its `VIGIL_JOB_UID_BASE`, None: unset)."""
    settings = WorkerSettings(database_url=url, uid_ranges_dir=str(claims))
    if base is not None:
        settings = WorkerSettings(database_url=url, uid_ranges_dir=str(claims), job_uid_base=base)
    async with open_pool(url) as pool:
        launched = await main._with_own_uids(_confined(settings), pool, settings)
    assert launched.confinement is not None
    return launched.confinement.uid_base


async def test_a_worker_refuses_a_range_another_installation_holds(
    fresh_url: str, tmp_path: Path
) -> None:
    claims = tmp_path / "uid-ranges"
    uid_ranges.claim(claims, str(uuid.uuid4()), 7_000_000)  # another installation's

    with pytest.raises(UidRangeHeld, match="overlap"):
        await _start_with(fresh_url, claims, 7_000_000)
    base = await _start_with(fresh_url, claims, 9_000_000)
    again = await _start_with(fresh_url, claims, 9_000_000)

    assert base == again == 9_000_000
    conn = await asyncpg.connect(fresh_url)
    try:
        ours = await installation_repo.installation_id(conn)
    finally:
        await conn.close()
    assert (claims / "9000000").read_text() == f"{ours}\n"


async def test_a_worker_with_no_base_set_takes_a_free_range(
    fresh_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VIGIL_JOB_UID_BASE", raising=False)
    claims = tmp_path / "uid-ranges"
    uid_ranges.claim(claims, str(uuid.uuid4()), uid_ranges.DEFAULT_BASE)

    base = await _start_with(fresh_url, claims)

    assert base == uid_ranges.DEFAULT_BASE + uid_ranges.SIZE
    assert await _start_with(fresh_url, claims) == base
