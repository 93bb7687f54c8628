"""A confined job reaches its work dir by absolute paths: every directory above the work root
must be traversable by others (a clone in /root broke status files and chaining)."""

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.worker import confinement
from services.worker.confinement import CannotConfine, Confinement
from shared.host import work_root


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A dir every dir above which others may traverse (pytest's own tmp dir is private)."""
    made = Path(tempfile.mkdtemp(prefix="vigil-reach-", dir="/tmp"))
    made.chmod(0o711)
    yield made
    shutil.rmtree(made)


@pytest.fixture
def private(reachable: Path) -> Path:
    """A dir others may not traverse (as /root), in `reachable`."""
    made = reachable / "home"
    made.mkdir()
    made.chmod(0o700)
    return made


def test_a_work_root_below_a_private_dir_is_blocked_by_that_dir(private: Path) -> None:
    assert work_root.blocker(private / "clone" / ".run" / "work") == private


def test_a_traversable_chain_is_reachable_even_before_it_is_made(reachable: Path) -> None:
    assert work_root.blocker(reachable) is None
    assert work_root.blocker(reachable / "not" / "made" / "yet") is None


def test_choose_takes_the_fallback_only_when_the_preferred_is_blocked(
    reachable: Path, private: Path
) -> None:
    fallback = reachable / "fallback" / "work"

    assert work_root.choose(private / "work", fallback) == fallback  # the tests run as root
    assert work_root.choose(reachable / "work", fallback) == reachable / "work"


def test_the_reason_names_the_dir_its_mode_and_both_ways_out(private: Path) -> None:
    why = work_root.unreachable(private / "work")

    assert why is not None
    assert f"{private} is mode 0700" in why
    assert "VIGIL_WORK_ROOT" in why and f"chmod o+x {private}" in why


def test_a_confining_worker_refuses_a_work_root_its_jobs_cannot_reach(private: Path) -> None:
    with pytest.raises(CannotConfine, match="cannot reach its work dir"):
        confinement.check_reach(Confinement(2_000_000), private / "work")
    confinement.check_reach(None, private / "work")  # unconfined jobs are the worker's user
