"""A job's files read by the worker, at the file level: what a job leaves in its work dir is read
only as a plain regular file of that dir, never waited on, never followed."""

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from shared.domain.outputs import UpstreamOutput
from shared.host.chained_inputs import InputUnavailable
from shared.host.job_files import (
    UnsafeFile,
    make_dirs,
    open_append,
    open_regular,
    read_regular,
    write_file,
)
from shared.host.status_file import MAX_STATUS_BYTES, read_status
from shared.task_types.base import TaskContext
from shared.task_types.shell import ShellTaskType


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "work" / ".vigil").mkdir(parents=True)
    return tmp_path / "work"


def _status(workdir: Path) -> Path:
    return workdir / ".vigil" / "status.run1.json"


def test_a_fifo_at_the_status_file_reads_as_fatal_at_once(workdir: Path) -> None:
    os.mkfifo(_status(workdir))  # no writer: a plain open() would wait for ever

    report = read_status(workdir, _status(workdir))

    assert report is not None and report.status == "fatal"
    assert "is not a regular file (a FIFO)" in report.message


def test_a_status_file_linked_to_a_device_or_a_secret_is_not_followed(
    workdir: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "token"
    secret.write_text('{"status": "success", "message": "the operator token"}')
    for target in ("/dev/zero", str(secret)):
        _status(workdir).unlink(missing_ok=True)
        _status(workdir).symlink_to(target)

        report = read_status(workdir, _status(workdir))

        assert report is not None and report.status == "fatal"
        assert "symbolic link" in report.message and "operator token" not in report.message


def test_a_linked_directory_half_way_down_is_not_followed(workdir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "status.run1.json").write_text('{"status": "success"}')
    (workdir / ".vigil").rmdir()
    (workdir / ".vigil").symlink_to(elsewhere)

    report = read_status(workdir, _status(workdir))

    assert report is not None and report.status == "fatal"
    assert "'.vigil'" in report.message


def test_an_oversized_status_file_is_refused_and_a_missing_one_is_none(workdir: Path) -> None:
    assert read_status(workdir, _status(workdir)) is None
    _status(workdir).write_bytes(b" " * (MAX_STATUS_BYTES + 1))

    report = read_status(workdir, _status(workdir))

    assert report is not None and report.status == "fatal" and "larger than" in report.message


def test_a_plain_status_file_reads_as_written(workdir: Path) -> None:
    _status(workdir).write_text('{"status": "recoverable", "message": "try again"}')

    report = read_status(workdir, _status(workdir))

    assert report is not None and (report.status, report.message) == ("recoverable", "try again")


@pytest.mark.parametrize("relative", ["../outside", "/etc/hostname", "a/../../b", ""])
def test_a_path_that_leaves_the_work_dir_is_refused(workdir: Path, relative: str) -> None:
    with pytest.raises(UnsafeFile), open_regular(workdir, relative):
        pass


def test_read_regular_reads_a_plain_file_up_to_its_cap(workdir: Path) -> None:
    (workdir / "out.txt").write_bytes(b"12345")

    assert read_regular(workdir, "out.txt", max_bytes=5) == b"12345"
    with pytest.raises(UnsafeFile, match="larger than 4 bytes"):
        read_regular(workdir, "out.txt", max_bytes=4)


def _context(workdir: Path, outputs: list[str]) -> TaskContext:
    return TaskContext(
        job_id="j-1",
        task_id="t-1",
        index=0,
        input="x",
        workdir=workdir,
        attempt=1,
        run_number=1,
        command="true",
        outputs=outputs,
        keep_bytes=1 << 20,
        keep_total_bytes=1 << 20,
    )


def test_an_output_linked_to_a_file_outside_the_work_dir_is_refused_not_recorded(
    workdir: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "token"
    secret.write_text("the operator token")
    (workdir / "result").symlink_to(secret)
    ctx = _context(workdir, ["result"])
    ctx.exit_code = 0

    with pytest.raises(UnsafeFile, match="symbolic link"):
        ShellTaskType().save_results(ctx)

    assert ctx.recorded == {}


def test_an_output_that_is_a_fifo_is_refused_without_waiting(workdir: Path) -> None:
    os.mkfifo(workdir / "result")
    ctx = _context(workdir, ["result"])
    ctx.exit_code = 0

    with pytest.raises(UnsafeFile, match="a FIFO"):
        ShellTaskType().save_results(ctx)


def test_an_inputs_own_outputs_map_links_nothing(workdir: Path) -> None:
    # Finding 4: `{"outputs": {"../../../x": "/etc/hostname"}}` made links anywhere.
    ctx = _context(workdir, [])
    ctx.input = {"outputs": {"../../../x": "/etc/hostname", "y": "/etc/hostname"}}

    assert ShellTaskType().setup(ctx)

    assert sorted(p.name for p in workdir.iterdir()) == [".vigil"]


def _upstream(name: str, path: str, data: bytes = b"data", **more: Any) -> UpstreamOutput:
    digest = hashlib.sha256(data).hexdigest()
    return UpstreamOutput("t-0", name, path, "h-1", len(data), digest, **more)


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("../../../x", "{root}/j-0/t-0/out"),
        ("a/b", "{root}/j-0/t-0/out"),
        (".vigil", "{root}/j-0/t-0/out"),
        ("out", "/etc/hostname"),
        ("out", "{root}/../../etc/hostname"),
        ("out", "{root}/j-0/link/out"),  # a directory link half-way down
    ],
)
def test_a_chained_input_places_only_plain_names_from_files_under_the_work_root(
    tmp_path: Path, name: str, source: str
) -> None:
    (tmp_path / "root" / "j-0" / "t-0").mkdir(parents=True)
    (tmp_path / "root" / "j-0" / "t-0" / "out").write_bytes(b"data")
    (tmp_path / "root" / "j-0" / "link").symlink_to(tmp_path / "root" / "j-0" / "t-0")
    workdir = tmp_path / "root" / "j-1" / "t-1"
    workdir.mkdir(parents=True)
    ctx = _context(workdir, [])
    ctx.upstream = {name: _upstream(name, source.format(root=tmp_path / "root"))}

    with pytest.raises(UnsafeFile):
        ShellTaskType().setup(ctx)

    assert not (tmp_path / "x").exists() and not (workdir / "out").exists()


def _upstream_file(tmp_path: Path, data: bytes = b"data") -> tuple[Path, Path]:
    """(the upstream output, the chained task's work dir) under one work root."""
    upstream = tmp_path / "root" / "j-0" / "t-0"
    upstream.mkdir(parents=True)
    (upstream / "out").write_bytes(data)
    workdir = tmp_path / "root" / "j-1" / "t-1"
    workdir.mkdir(parents=True)
    return upstream / "out", workdir


def test_a_chained_input_is_the_upstream_file_itself_read_only(tmp_path: Path) -> None:
    source, workdir = _upstream_file(tmp_path)
    ctx = _context(workdir, [])
    ctx.upstream = {"out": _upstream("out", str(source))}

    assert ShellTaskType().setup(ctx)

    placed = (workdir / "out").lstat()
    assert (workdir / "out").read_bytes() == b"data"
    assert not (workdir / "out").is_symlink() and placed.st_ino == source.stat().st_ino
    assert (placed.st_uid, placed.st_mode & 0o777) == (0, 0o444)  # the tests run as root


def test_a_chained_input_stays_when_the_upstream_work_dir_goes(tmp_path: Path) -> None:
    source, workdir = _upstream_file(tmp_path)
    ctx = _context(workdir, [])
    ctx.upstream = {"out": _upstream("out", str(source))}
    assert ShellTaskType().setup(ctx)

    shutil.rmtree(source.parent)

    assert (workdir / "out").read_bytes() == b"data"


def test_a_chained_input_not_on_this_host_comes_from_its_kept_bytes(tmp_path: Path) -> None:
    workdir = tmp_path / "root" / "j-1" / "t-1"
    workdir.mkdir(parents=True)
    gone = str(tmp_path / "root" / "j-0" / "t-0" / "out")
    ctx = _context(workdir, [])
    ctx.upstream = {"out": _upstream("out", gone, content=b"data")}

    assert ShellTaskType().setup(ctx)

    assert (workdir / "out").read_bytes() == b"data"
    assert ((workdir / "out").stat().st_mode & 0o777) == 0o444


def test_a_chained_input_that_cannot_be_had_fails_setup_saying_why(tmp_path: Path) -> None:
    workdir = tmp_path / "root" / "j-1" / "t-1"
    workdir.mkdir(parents=True)
    gone = str(tmp_path / "root" / "j-0" / "t-0" / "out")
    ctx = _context(workdir, [])
    ctx.upstream = {"out": _upstream("out", gone, not_kept="over the 1 MiB download limit")}

    with pytest.raises(InputUnavailable) as raised:
        ShellTaskType().setup(ctx)

    assert str(raised.value) == (
        f"output 'out' of task t-0 ({gone} on host h-1) cannot be used: it is not on this host,"
        " and its bytes were not kept in the database (over the 1 MiB download limit);"
        " recover or restart task t-0 to make it again"
    )


def test_an_upstream_file_changed_since_it_was_recorded_is_not_passed_on(tmp_path: Path) -> None:
    # The upstream job was given its work dir back (a restart) and rewrote its output: the
    # record no longer says what the file holds.
    source, workdir = _upstream_file(tmp_path, b"forged")
    ctx = _context(workdir, [])
    ctx.upstream = {"out": _upstream("out", str(source), b"recorded")}

    with pytest.raises(InputUnavailable, match="it changed since it was recorded"):
        ShellTaskType().setup(ctx)

    assert not (workdir / "out").exists()
    assert source.read_bytes() == b"forged"


def test_a_recorded_output_is_frozen(workdir: Path) -> None:
    (workdir / "out").write_bytes(b"result")
    ctx = _context(workdir, ["out"])

    ctx.record_output("out")

    seen = (workdir / "out").stat()
    assert (seen.st_uid, seen.st_mode & 0o777) == (0, 0o444)


def test_make_dirs_makes_nested_dirs_and_accepts_the_work_dir_itself(workdir: Path) -> None:
    make_dirs(workdir, ".")
    make_dirs(workdir, "a/b")

    assert (workdir / "a" / "b").is_dir()


def test_the_workers_writes_follow_no_link_the_job_left(workdir: Path, tmp_path: Path) -> None:
    # A job that owns its work dir replaced `.vigil` by a link to a directory of root's: the
    # worker's input and run logs must not land there.
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (workdir / ".vigil").rmdir()
    (workdir / ".vigil").symlink_to(elsewhere)

    with pytest.raises(UnsafeFile):
        write_file(workdir, ".vigil/input", b"x")
    with pytest.raises(UnsafeFile):
        open_append(workdir, ".vigil/run1.stdout")
    assert list(elsewhere.iterdir()) == []


def test_the_workers_writes_refuse_a_file_the_job_hard_linked(
    workdir: Path, tmp_path: Path
) -> None:
    # A job that links a run file or its input to a file elsewhere (its own, or anybody's where
    # fs.protected_hardlinks is off) must not have the worker write there.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched\n")
    for name in ("run1.stdout", "input"):
        os.link(elsewhere, workdir / ".vigil" / name)

    with pytest.raises(UnsafeFile, match="other names"):
        open_append(workdir, ".vigil/run1.stdout")
    with pytest.raises(UnsafeFile, match="other names"):
        write_file(workdir, ".vigil/input", b"x")
    assert elsewhere.read_text() == "untouched\n"
