"""A job's bundle: which paths it may hold, and how a host places its files in a
task's work dir: read-only, root's, one copy per host, never through a link the job left."""

import hashlib
import os
from pathlib import Path

import pytest

from shared.domain import bundle
from shared.domain.bundle import BundleFile
from shared.host import bundle as host_bundle
from shared.host.bundle import BundleUnavailable
from shared.host.job_files import UnsafeFile

#: The gid a job's commands run with (a confined job's owner's): its files are readable by it.
GROUP = 2_000_007


@pytest.mark.parametrize(
    "path", ["render.sh", "config/a.yaml", "data/v1.0/x_y-z+w.csv", ".hidden", "a/.vigilant"]
)
def test_plain_relative_paths_are_accepted(path: str) -> None:
    assert bundle.path_problem(path) is None


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "1 to 255 characters"),
        ("/etc/passwd", "not a relative path"),
        ("a/../../x", "not a relative path"),
        ("a//b", "not a relative path"),
        ("./a", "not a relative path"),
        ("a b", "not a relative path"),
        ("$(x)", "not a relative path"),
        (".vigil/status.run1.json", "is in .vigil"),
        ("x" * 256, "1 to 255 characters"),
    ],
)
def test_other_paths_are_refused_saying_why(path: str, why: str) -> None:
    problem = bundle.path_problem(path)

    assert problem is not None and why in problem


def test_a_file_that_is_also_a_dir_or_an_output_conflicts() -> None:
    assert bundle.conflicts(["a", "a/b", "out.txt"], ["out.txt"]) == [
        "'a' is a file and a directory of 'a/b'",
        "'out.txt' is also an output of the job: files are read-only",
    ]
    assert bundle.conflicts(["a/b", "a/c"], []) == []


def _bundle(files: dict[str, tuple[bytes, bool]]) -> tuple[list[BundleFile], dict[str, bytes]]:
    return bundle.listed(files), {path: content for path, (content, _) in files.items()}


def test_a_tasks_files_are_the_hosts_copy_read_only(tmp_path: Path) -> None:
    files, contents = _bundle({"run.sh": (b"echo hi\n", True), "conf/a.yaml": (b"a: 1\n", False)})
    workdir = tmp_path / "work" / "j-1" / "t-1"
    workdir.mkdir(parents=True)

    host_bundle.place(tmp_path / "work", "j-1", files, contents, workdir, GROUP)

    kept = tmp_path / "work" / "j-1" / ".files"
    assert (workdir / "run.sh").read_bytes() == b"echo hi\n"
    assert (workdir / "conf" / "a.yaml").read_bytes() == b"a: 1\n"
    run = (workdir / "run.sh").stat()
    assert run.st_ino == (kept / "run.sh").stat().st_ino  # a link, not a copy
    assert (run.st_uid, run.st_gid, run.st_mode & 0o777) == (0, GROUP, 0o550)  # tests: root
    conf = (workdir / "conf" / "a.yaml").stat()
    assert (conf.st_gid, conf.st_mode & 0o777) == (GROUP, 0o440)
    for directory in (kept, kept / "conf"):
        seen = directory.stat()
        assert (seen.st_uid, seen.st_gid, seen.st_mode & 0o777) == (0, GROUP, 0o750)


def test_the_hosts_copy_is_written_once_and_serves_later_tasks_without_the_bytes(
    tmp_path: Path,
) -> None:
    files, contents = _bundle({"run.sh": (b"echo hi\n", True)})
    first, second = (tmp_path / "work" / "j-1" / t for t in ("t-1", "t-2"))
    first.mkdir(parents=True)
    second.mkdir()

    host_bundle.place(tmp_path / "work", "j-1", files, contents, first, GROUP)
    host_bundle.place(tmp_path / "work", "j-1", files, None, second, GROUP)

    assert (second / "run.sh").read_bytes() == b"echo hi\n"
    assert sorted(os.listdir(tmp_path / "work" / "j-1")) == [".files", "t-1", "t-2"]


def test_a_rerun_replaces_what_the_job_left_at_a_files_path_without_following_it(
    tmp_path: Path,
) -> None:
    files, contents = _bundle({"run.sh": (b"echo hi\n", True)})
    workdir = tmp_path / "work" / "j-1" / "t-1"
    workdir.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    (workdir / "run.sh").symlink_to(victim)

    host_bundle.place(tmp_path / "work", "j-1", files, contents, workdir, GROUP)

    assert not (workdir / "run.sh").is_symlink()
    assert victim.read_text() == "untouched"


def test_a_dir_link_the_job_left_on_a_files_path_is_refused(tmp_path: Path) -> None:
    files, contents = _bundle({"conf/a.yaml": (b"a: 1\n", False)})
    workdir = tmp_path / "work" / "j-1" / "t-1"
    workdir.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (workdir / "conf").symlink_to(elsewhere)

    with pytest.raises(UnsafeFile):
        host_bundle.place(tmp_path / "work", "j-1", files, contents, workdir, GROUP)

    assert list(elsewhere.iterdir()) == []


def test_files_whose_bytes_are_gone_or_wrong_are_refused_saying_so(tmp_path: Path) -> None:
    files, _ = _bundle({"run.sh": (b"echo hi\n", True)})
    workdir = tmp_path / "work" / "j-1" / "t-1"
    workdir.mkdir(parents=True)

    with pytest.raises(BundleUnavailable, match="a purge deletes them"):
        host_bundle.place(tmp_path / "work", "j-1", files, {}, workdir, GROUP)
    with pytest.raises(BundleUnavailable, match="do not match its sha256"):
        host_bundle.place(tmp_path / "work", "j-1", files, {"run.sh": b"forged"}, workdir, GROUP)

    assert not (tmp_path / "work" / "j-1" / ".files").exists()
    assert hashlib.sha256(b"echo hi\n").hexdigest() == files[0].sha256
