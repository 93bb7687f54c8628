"""Client configuration: environment variables win over the config file, each on its own."""

from pathlib import Path

import pytest

from vigil.config import DEFAULT_URL, load
from vigil.errors import ConfigError


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_when_nothing_is_configured__the_local_api_and_no_token_are_used(tmp_path: Path) -> None:
    found = load({"HOME": str(tmp_path)})

    assert (found.url, found.token) == (DEFAULT_URL, None)
    assert found.file == tmp_path / ".config" / "vigil" / "config.toml"


def test_when_only_the_default_file_exists__it_is_used(tmp_path: Path) -> None:
    _write(tmp_path / ".config/vigil/config.toml", 'url = "http://api:9000/"\ntoken = "file-tok"\n')

    found = load({"HOME": str(tmp_path)})

    assert (found.url, found.token) == ("http://api:9000", "file-tok")


def test_when_env_and_file_both_give_values__the_env_wins_for_each_it_sets(
    tmp_path: Path,
) -> None:
    file = _write(tmp_path / "c.toml", 'url = "http://file:1"\ntoken = "file-tok"\n')
    base = {"VIGIL_CONFIG": str(file)}

    assert load(base | {"VIGIL_TOKEN": "env-tok"}).token == "env-tok"
    assert load(base | {"VIGIL_TOKEN": "env-tok"}).url == "http://file:1"
    assert load(base | {"VIGIL_URL": "https://env:2"}).url == "https://env:2"
    assert load(base | {"VIGIL_URL": "https://env:2"}).token == "file-tok"


def test_when_xdg_config_home_is_set__the_file_is_looked_for_there(tmp_path: Path) -> None:
    _write(tmp_path / "xdg/vigil/config.toml", 'token = "xdg-tok"\n')

    found = load({"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")})

    assert found.token == "xdg-tok"


def test_when_the_token_has_surrounding_white_space__it_is_trimmed() -> None:
    assert load({"VIGIL_TOKEN": " abc\n", "VIGIL_CONFIG": "/dev/null"}).token == "abc"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("url = http://x", "not valid TOML"),
        ('tokne = "x"', "unknown key"),
        ("token = 5", "token must be a string"),
        ('url = "ftp://x"', "not an http"),
        ('token = "two words"', "visible ASCII"),
    ],
)
def test_when_the_file_is_wrong__the_error_says_what_and_where(
    tmp_path: Path, text: str, reason: str
) -> None:
    file = _write(tmp_path / "c.toml", text)

    with pytest.raises(ConfigError, match=reason):
        load({"VIGIL_CONFIG": str(file)})


def test_when_the_named_file_is_missing__it_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load({"VIGIL_CONFIG": str(tmp_path / "nope.toml")})


def test_when_the_url_from_the_env_is_not_http__it_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not an http"):
        load({"HOME": str(tmp_path), "VIGIL_URL": "127.0.0.1:8000"})
