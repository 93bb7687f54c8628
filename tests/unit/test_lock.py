"""requirements.lock pins what pyproject.toml asks for: every direct dependency (the dev tools
included) once, at a version its specifier allows, and nothing pyproject.toml no longer names."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "the lock is stale: run scripts/lock (it rewrites requirements.lock) and commit it"

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ ;\\]+)")
_FROM_PYPROJECT = "vigil (pyproject.toml)"


def _required() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    return {canonicalize_name(r.name): r for r in map(Requirement, lines)}


def _locked() -> tuple[dict[str, str], set[str]]:
    """Each pinned package's version, and those the lock says pyproject.toml asked for."""
    pins: dict[str, str] = {}
    direct: set[str] = set()
    current = ""
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        pin = _PIN.match(line)
        if pin:
            current = canonicalize_name(pin[1])
            pins[current] = pin[2]
        elif line.strip().lstrip("#").strip().removeprefix("via ").strip() == _FROM_PYPROJECT:
            direct.add(current)
    return pins, direct


def test_every_dependency_is_pinned_at_a_version_pyproject_allows() -> None:
    pins, _ = _locked()
    unpinned = sorted(name for name in _required() if name not in pins)
    assert not unpinned, f"not in requirements.lock: {unpinned}; {REGENERATE}"
    outside = {
        name: f"{pins[name]} (pyproject: {req.specifier})"
        for name, req in _required().items()
        if not req.specifier.contains(pins[name], prereleases=True)
    }
    assert not outside, f"pinned outside pyproject.toml's range: {outside}; {REGENERATE}"


def test_the_lock_asks_for_nothing_pyproject_dropped() -> None:
    _, direct = _locked()
    assert direct, "requirements.lock names no package as pyproject.toml's: is it uv's format?"
    dropped = sorted(direct - set(_required()))
    assert not dropped, (
        f"in requirements.lock for pyproject.toml, which no longer asks: {dropped}; {REGENERATE}"
    )


def test_every_pin_carries_its_hashes() -> None:
    text = (ROOT / "requirements.lock").read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text)
    bare = [b.split()[0] for b in blocks if _PIN.match(b) and "--hash=sha256:" not in b]
    assert not bare, (
        f"pins without hashes (pip --require-hashes refuses them): {bare}; {REGENERATE}"
    )
