"""aio-pika, aiormq and pamqp are installed and pinned at exactly the releases the publishing
path was checked against (`shared/messaging/verified_releases.py`); any other fails, saying
what to re-check."""

import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from shared.messaging.verified_releases import RECHECK, VERIFIED

ROOT = Path(__file__).resolve().parents[2]
_HOW = (
    "frame_batching and batch_publish use their private state. Before moving to another "
    "release, re-check:\n  - "
    + "\n  - ".join(RECHECK)
    + "\nthen set VERIFIED (shared/messaging/verified_releases.py) and the == pins in "
    "pyproject.toml together, and run scripts/lock."
)


def test_the_installed_releases_are_the_verified_ones() -> None:
    installed = {name: version(name) for name in VERIFIED}
    assert installed == dict(VERIFIED), f"installed {installed}, verified {dict(VERIFIED)}: {_HOW}"


def test_pyproject_pins_exactly_the_verified_releases() -> None:
    lines = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {canonicalize_name(r.name): str(r.specifier) for r in map(Requirement, lines)}
    wanted = {canonicalize_name(name): f"=={release}" for name, release in VERIFIED.items()}
    pinned = {name: pins.get(name) for name in wanted}
    assert pinned == wanted, f"pyproject.toml pins {pinned}, verified {wanted}: {_HOW}"
