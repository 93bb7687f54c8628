"""`TaskContext.record_output`: size and sha256 of the bytes read, the bytes kept when small
and within the task's budget, and why not otherwise."""

import hashlib
from pathlib import Path

from shared.task_types.base import TaskContext

KIB = 1024


def _context(workdir: Path, keep: int = 4 * KIB, total: int = 6 * KIB) -> TaskContext:
    return TaskContext(
        job_id="j-1",
        task_id="t-1",
        index=0,
        input="",
        workdir=workdir,
        attempt=1,
        run_number=1,
        command="true",
        keep_bytes=keep,
        keep_total_bytes=total,
    )


def _file(workdir: Path, name: str, size: int) -> bytes:
    data = bytes(i % 251 for i in range(size))
    (workdir / name).write_bytes(data)
    return data


def test_when_an_output_is_small__its_bytes_are_kept_with_its_checksum(tmp_path: Path) -> None:
    data = _file(tmp_path, "out.bin", 4 * KIB)

    record = _context(tmp_path).record_output("out.bin")

    assert (record.size, record.content, record.not_kept) == (len(data), data, None)
    assert record.sha256 == hashlib.sha256(data).hexdigest()
    assert record.path == str(tmp_path / "out.bin")


def test_when_an_output_is_over_the_limit__only_its_checksum_is_kept(tmp_path: Path) -> None:
    data = _file(tmp_path, "big.bin", 4 * KIB + 1)

    record = _context(tmp_path).record_output("big.bin")

    assert (record.size, record.content) == (len(data), None)
    assert record.sha256 == hashlib.sha256(data).hexdigest()
    assert record.not_kept == "over the 4 KiB download limit"


def test_when_a_large_file_is_read_in_chunks__the_checksum_covers_all_of_it(
    tmp_path: Path,
) -> None:
    data = _file(tmp_path, "huge.bin", 3 * 1024 * KIB + 7)

    record = _context(tmp_path).record_output("huge.bin")

    assert record.sha256 == hashlib.sha256(data).hexdigest() and record.content is None


def test_when_the_task_budget_is_spent__later_outputs_are_not_kept(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    _file(tmp_path, "a", 4 * KIB)
    _file(tmp_path, "b", 3 * KIB)
    _file(tmp_path, "c", 2 * KIB)

    a, b, c = (ctx.record_output(name) for name in "abc")

    assert a.content is not None and b.content is None and c.content is not None
    assert b.not_kept is not None and "6 KiB the task's outputs may keep" in b.not_kept


def test_when_an_output_is_recorded_again__its_own_bytes_do_not_count_twice(
    tmp_path: Path,
) -> None:
    ctx = _context(tmp_path)
    _file(tmp_path, "a", 4 * KIB)

    ctx.record_output("a")
    again = ctx.record_output("a")

    assert again.content is not None and list(ctx.recorded) == ["a"]


def test_when_an_output_is_empty__it_is_kept_as_no_bytes(tmp_path: Path) -> None:
    _file(tmp_path, "empty", 0)

    record = _context(tmp_path, keep=0, total=0).record_output("empty")

    assert (record.size, record.content) == (0, b"")
