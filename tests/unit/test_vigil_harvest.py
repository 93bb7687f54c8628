"""The client's side of harvest: download calls, checked bytes, where files are saved, and the
commands' argument checks (no network)."""

import hashlib
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from vigil import calls, harvest
from vigil.cli import app
from vigil.errors import BadResponse, Conflict, UsageError

_REQUEST = httpx.Request("GET", "http://api/tasks/t-1/outputs/out")


def _file(data: bytes, etag: str | None) -> httpx.Response:
    headers = {"ETag": etag} if etag is not None else {}
    return httpx.Response(200, content=data, headers=headers, request=_REQUEST)


def test_when_a_name_is_downloaded__it_is_quoted_as_one_path_segment() -> None:
    call = calls.download("t-1", "a b?#%.txt")

    assert call.path == "/tasks/t-1/outputs/a%20b%3F%23%25.txt"
    assert call.binary


@pytest.mark.parametrize("name", ["", ".", "..", "a/b"])
def test_when_a_name_is_not_a_file_name__the_download_is_refused_before_sending(
    name: str,
) -> None:
    with pytest.raises(UsageError, match="not an output name"):
        calls.download("t-1", name)


def test_when_the_bytes_match_their_etag__they_are_the_result() -> None:
    data = b"payload"
    answer = _file(data, f'"{hashlib.sha256(data).hexdigest()}"')

    assert calls.answer(calls.download("t-1", "out"), answer) == data


def test_when_the_bytes_do_not_match_their_etag__the_download_is_a_bad_response() -> None:
    answer = _file(b"payload", f'"{hashlib.sha256(b"other").hexdigest()}"')

    with pytest.raises(BadResponse, match="does not match its sha256"):
        calls.content(answer)


def test_when_an_s3_stores_object_does_not_match_its_recorded_sha256__it_is_a_bad_response() -> (
    None
):
    # an S3 ETag is an MD5 (or not even that, for a multipart upload): the sha256 is metadata
    right = hashlib.sha256(b"payload").hexdigest()
    headers = {"ETag": '"9e107d9d372bb6826bd81d3542a419d6-3"', "x-amz-meta-sha256": right}

    good = httpx.Response(200, content=b"payload", headers=headers, request=_REQUEST)
    bad = httpx.Response(200, content=b"damaged", headers=headers, request=_REQUEST)

    assert calls.content(good) == b"payload"
    with pytest.raises(BadResponse, match="does not match its sha256"):
        calls.content(bad)


def test_when_there_is_no_checksum__the_bytes_are_taken_as_they_are() -> None:
    assert calls.content(_file(b"x", None)) == b"x"
    assert calls.content(_file(b"x", '"weak"')) == b"x"


def test_when_the_output_was_not_kept__the_409_is_a_conflict_with_the_message() -> None:
    answer = httpx.Response(409, json={"detail": "output big is 9 bytes"}, request=_REQUEST)

    with pytest.raises(Conflict, match="output big is 9 bytes"):
        calls.content(answer)


def test_when_the_target_exists__it_is_kept_unless_forced(tmp_path: Path) -> None:
    existing = tmp_path / "out"
    existing.write_text("mine")

    with pytest.raises(UsageError, match="exists"):
        harvest.target("out", str(existing), force=False)
    assert harvest.target("out", str(existing), force=True) == str(existing)
    assert harvest.target("out", "-", force=False) == "-"


def test_when_outputs_are_shown__each_row_says_where_the_file_is() -> None:
    table = harvest.outputs_table(
        [
            {
                "index": 0,
                "task_id": "t-1",
                "name": "out\x1b[31m",
                "size": 5,
                "sha256": "ab" * 32,
                "downloadable": False,
                "host": "h-1",
                "path": "/w/j/t/out",
            }
        ]
    )

    cells = [str(column._cells[0]) for column in table.columns]
    assert cells == ["0", "t-1", "out\\x1b[31m", "5", "abababababab", "no", "h-1:/w/j/t/out"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["outputs", "t-1"], "outputs takes a job id"),
        (["download", "j-1", "out"], "a job's outputs go to a directory"),
        (["download", "t-1"], "download TASK takes the output's NAME"),
        (["download", "h-1"], "neither a job id (j-...) nor a task id"),
        (["download", "t-1", "../x"], "not an output name"),
        (["purge", "t-1", "--yes"], "purge takes a job id"),
        (["purge", "j-1"], "repeat with --yes"),
    ],
)
def test_when_an_argument_is_wrong__the_harvest_command_says_why_and_exits_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    env = {"VIGIL_URL": "http://127.0.0.1:9", "VIGIL_CONFIG": "/dev/null", "HOME": str(tmp_path)}

    result = CliRunner().invoke(app, args, env=env)

    assert result.exit_code == 2, result.output
    assert message in result.output
