"""Job files: YAML or JSON mappings of JSON values, with errors that say where."""

from pathlib import Path

import pytest

from vigil.errors import JobFileError
from vigil.jobfile import load, parse

YAML_JOB = """
name: render
command: ./render.sh "$VIGIL_INPUT"
inputs: [scene-1, scene-2, {frame: 3}]
outputs: [out.png]
policy:
  max_app_retries: 2
"""


def test_when_a_yaml_file_is_read__the_job_is_its_mapping(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(YAML_JOB)

    job = load(path)

    assert job == {
        "name": "render",
        "command": './render.sh "$VIGIL_INPUT"',
        "inputs": ["scene-1", "scene-2", {"frame": 3}],
        "outputs": ["out.png"],
        "policy": {"max_app_retries": 2},
    }


def test_when_a_json_file_is_read__it_is_parsed_as_json(tmp_path: Path) -> None:
    path = tmp_path / "job.JSON"
    path.write_text('{"command": "echo hi", "inputs": [1, 2.5, null, true]}')

    assert load(path) == {"command": "echo hi", "inputs": [1, 2.5, None, True]}


@pytest.mark.parametrize(
    ("text", "as_json", "reason"),
    [
        ("", False, "empty"),
        ("# only a comment\n", False, "empty"),
        ("- a\n- b\n", False, "mapping"),
        ("echo hi", False, "mapping"),
        ("command: [unclosed\n", False, r"not valid YAML.*line 1"),
        ('{"command": }', True, "not valid JSON"),
        ("command: x\ninputs: [2024-01-05]\n", False, r"inputs\[0\]: .*date.*quote it"),
        ("command: x\nparams: {when: 2024-01-05 10:00:00}\n", False, r"params\.when: .*datetime"),
        ("command: x\ninputs: [.nan]\n", False, r"inputs\[0\]: nan is not a JSON number"),
        ("command: x\nparams: {1: a}\n", False, "key 1 must be a string"),
        ("command: !!binary aGk=\n", False, "command: .*bytes"),
        ("command: x\ninputs: !!set {a, b}\n", False, "inputs: .*set"),
        ('{"command": "x", "inputs": [NaN]}', True, "not a JSON number"),
    ],
)
def test_when_the_file_is_not_a_job__the_error_says_where(
    text: str, as_json: bool, reason: str
) -> None:
    with pytest.raises(JobFileError, match=reason):
        parse(text, "job.yaml", as_json=as_json)


def test_when_the_file_does_not_exist__the_error_names_it(tmp_path: Path) -> None:
    with pytest.raises(JobFileError, match=r"cannot read job file .*nope\.yaml"):
        load(tmp_path / "nope.yaml")
