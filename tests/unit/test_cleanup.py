"""The worker's removal of work dirs: only inside its work root, links not followed, idempotent."""

from pathlib import Path

import pytest

from services.worker.cleanup import inside, remove_workdirs
from shared.domain.messages import RemoveWorkdirs, decode, encode


def _message(*workdirs: Path | str, job_id: str = "j-1") -> RemoveWorkdirs:
    return RemoveWorkdirs(
        job_id=job_id,
        task_ids=[f"t-{i}" for i in range(len(workdirs))],
        workdirs=[str(w) for w in workdirs],
        reason="test",
    )


def _task_dir(root: Path, job: str = "j-1", task: str = "t-1") -> Path:
    workdir = root / job / task
    (workdir / ".vigil").mkdir(parents=True)
    (workdir / "out.txt").write_text("data")
    (workdir / ".vigil" / "run1.stdout").write_text("line\n")
    return workdir


@pytest.mark.parametrize(
    ("workdir", "expected"),
    [
        ("/work/j-1/t-1", "/work/j-1/t-1"),
        ("/work/j-1", "/work/j-1"),
        ("/work", None),
        ("/work/", None),
        ("/work/j-1/..", None),
        ("/work/j-1/../..", None),
        ("/work/../etc", None),
        ("/workshop/j-1/t-1", None),
        ("/etc/passwd", None),
        ("j-1/t-1", None),
        ("/work/j-1/t-1/.", "/work/j-1/t-1"),
    ],
)
def test_when_a_path_is_checked__only_paths_strictly_inside_the_root_pass(
    workdir: str, expected: str | None
) -> None:
    found = inside(Path("/work"), workdir)

    assert (str(found) if found else None) == expected


async def test_when_work_dirs_are_removed__they_and_the_empty_job_dir_are_gone(
    tmp_path: Path,
) -> None:
    root = tmp_path / "work"
    first, second = _task_dir(root, task="t-1"), _task_dir(root, task="t-2")

    removed = await remove_workdirs(root, _message(first, second))

    assert removed == 2
    assert not first.exists() and not second.exists()
    assert not (root / "j-1").exists()
    assert root.is_dir()


async def test_when_another_task_of_the_job_remains__the_job_dir_stays(tmp_path: Path) -> None:
    root = tmp_path / "work"
    gone, kept = _task_dir(root, task="t-1"), _task_dir(root, task="t-2")

    await remove_workdirs(root, _message(gone))

    assert not gone.exists()
    assert (kept / "out.txt").read_text() == "data"


async def test_when_the_removal_is_repeated__nothing_is_there_and_nothing_fails(
    tmp_path: Path,
) -> None:
    root = tmp_path / "work"
    workdir = _task_dir(root)
    await remove_workdirs(root, _message(workdir))

    removed = await remove_workdirs(root, _message(workdir))

    assert removed == 0


async def test_when_a_path_is_outside_the_root__it_is_refused_and_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "work"
    root.mkdir()
    outside = _task_dir(tmp_path / "elsewhere")
    sneaky = root / "j-1" / ".." / ".." / "elsewhere" / "j-1" / "t-1"

    removed = await remove_workdirs(root, _message(outside, sneaky, tmp_path))

    assert removed == 0
    assert (outside / "out.txt").read_text() == "data"
    assert caplog.text.count("refusing to remove") == 3


async def test_when_a_work_dir_is_a_link__the_link_goes_and_its_target_stays(
    tmp_path: Path,
) -> None:
    root = tmp_path / "work"
    target = _task_dir(root, job="j-2", task="t-9")
    (root / "j-1").mkdir()
    link = root / "j-1" / "t-1"
    link.symlink_to(target)

    removed = await remove_workdirs(root, _message(link))

    assert removed == 1
    assert not link.is_symlink()
    assert (target / "out.txt").read_text() == "data"


async def test_when_the_work_root_is_reached_through_a_link__dirs_inside_are_removed(
    tmp_path: Path,
) -> None:
    real = tmp_path / "real"
    workdir = _task_dir(real)
    (tmp_path / "alias").symlink_to(real)

    removed = await remove_workdirs(tmp_path / "alias", _message(workdir))

    assert removed == 1
    assert not workdir.exists()


def test_when_the_message_is_encoded__it_decodes_to_itself() -> None:
    message = _message("/work/j-1/t-1")

    assert decode(encode(message)) == message
