"""Each installation's jobs' uids on a host are its own.

A confined job runs as `VIGIL_JOB_UID_BASE` + its owner's `users.job_uid` (1 to 999,999, a
number per database): two installations on one host with the same base would give their
first users the same uid, and each could read the other's work. So an installation holds a
range of `SIZE` uids from its base on each host it runs jobs on, by a claim: a file
`<claims dir>/<base>` (the dir root's, 0700: `VIGIL_UID_RANGES_DIR`, `/var/lib/vigil/uid-ranges`)
holding the installation's id (`installation_repo`, made by a migration), made with
`O_CREAT | O_EXCL`, under a lock of the dir, once no other claim overlaps its range. The same
installation finds its claim and goes on; a worker of another one refuses to start
(`UidRangeHeld`). With no base set, the installation takes its own claim if it has one, else
the first free range from `DEFAULT_BASE` up.

A claim is never released by the services: uids of a removed installation may still own files
on the host. An operator removes the file once the installation and its files are gone.
"""

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from shared.host import private_dir

#: The uids of a range: a job's uid is its base + `users.job_uid` (at most 999,999; the base
#: itself is the worker's trial's).
SIZE: Final = 1_000_000
#: The first range tried when no base is set (below it, the host's own accounts).
DEFAULT_BASE: Final = 2_000_000
#: The last base a range fits under (uids are below 2**31).
LAST_BASE: Final = 2**31 - SIZE - 1


class UidRangeHeld(Exception):
    """The range is another installation's on this host (or none is free)."""


def claim(claims_dir: Path, installation: str, base: int | None) -> int:
    """The base of this installation's range on this host: `base` (claimed if it was not),
    else the one it holds, else the first free one (claimed). `UidRangeHeld` when `base`
    overlaps another installation's range, or no range is free."""
    with _locked(claims_dir) as claims:
        if base is None:
            base = _held_by(claims, installation) or _first_free(claims)
        holders = {b: who for b, who in claims.items() if _overlap(b, base) and who != installation}
        if holders:
            held, who = min(holders.items())
            raise UidRangeHeld(
                f"the job uids {base} to {base + SIZE - 1} overlap the range from {held} that"
                f" installation {who} holds on this host ({claims_dir / str(held)}): jobs of"
                " both would share uids. Set VIGIL_JOB_UID_BASE to a free range (or leave it"
                " unset to take one)"
            )
        if claims.get(base) != installation:
            _write_claim(claims_dir, base, installation)
    return base


def release(claims_dir: Path, installation: str, base: int) -> bool:
    """Remove this installation's claim on `base` (a test's teardown); whether it held it."""
    with _locked(claims_dir) as claims:
        if claims.get(base) != installation:
            return False
        os.unlink(claims_dir / str(base))
        return True


@contextlib.contextmanager
def _locked(claims_dir: Path) -> Iterator[dict[int, str]]:
    """The claims of the host (base -> installation), under the dir's lock."""
    private_dir.ensure(claims_dir)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(claims_dir / ".lock", flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield _read_claims(claims_dir)
    finally:
        os.close(fd)


def _read_claims(claims_dir: Path) -> dict[int, str]:
    claims = {}
    for entry in os.scandir(claims_dir):
        if entry.name.isdigit() and entry.is_file(follow_symlinks=False):
            claims[int(entry.name)] = Path(entry.path).read_text().strip()
    return claims


def _write_claim(claims_dir: Path, base: int, installation: str) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(claims_dir / str(base), flags, 0o600)
    try:
        os.write(fd, f"{installation}\n".encode())
    finally:
        os.close(fd)


def _overlap(a: int, b: int) -> bool:
    return abs(a - b) < SIZE


def _held_by(claims: dict[int, str], installation: str) -> int | None:
    return min((b for b, who in claims.items() if who == installation), default=None)


def _first_free(claims: dict[int, str]) -> int:
    for base in range(DEFAULT_BASE, LAST_BASE + 1, SIZE):
        if not any(_overlap(base, held) for held in claims):
            return base
    raise UidRangeHeld("no range of job uids is free on this host: set VIGIL_JOB_UID_BASE")
