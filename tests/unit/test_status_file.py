"""`surely_absent`: the event loop's shortcut past a status file that is not there, never taken
when the way to it is anything but plain directories (then `read_status` says why)."""

from pathlib import Path

from shared.host.status_file import read_status, surely_absent


def _status(workdir: Path) -> Path:
    return workdir / ".vigil" / "status.run1.json"


def test_no_file_in_a_plain_directory_is_surely_absent(tmp_path: Path) -> None:
    (tmp_path / ".vigil").mkdir()

    assert surely_absent(tmp_path, _status(tmp_path))
    assert read_status(tmp_path, _status(tmp_path)) is None


def test_a_file_there_is_not_absent(tmp_path: Path) -> None:
    (tmp_path / ".vigil").mkdir()
    _status(tmp_path).write_text('{"status": "success"}')

    assert not surely_absent(tmp_path, _status(tmp_path))


def test_a_dangling_link_there_is_not_absent(tmp_path: Path) -> None:
    (tmp_path / ".vigil").mkdir()
    _status(tmp_path).symlink_to(tmp_path / "nowhere")

    assert not surely_absent(tmp_path, _status(tmp_path))


def test_a_linked_directory_on_the_way_is_left_to_read_status(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / ".vigil").symlink_to(elsewhere)

    assert not surely_absent(workdir, _status(workdir))
    report = read_status(workdir, _status(workdir))
    assert report is not None and report.status == "fatal"


def test_a_missing_directory_is_left_to_read_status(tmp_path: Path) -> None:
    assert not surely_absent(tmp_path, _status(tmp_path))
    assert read_status(tmp_path, _status(tmp_path)) is None
