"""`docs/reference/settings.md` is what the settings models say, and says something of each."""

from services.settings_catalog import SERVICES
from services.settings_reference import COMMAND, PAGE, declared_rows, render
from shared.runtime.config import VigilSettings


def test_the_committed_page_is_the_generated_one() -> None:
    assert PAGE.read_text() == render(), f"{PAGE} is not current: run {COMMAND} and commit it"


def test_every_setting_is_described_on_the_page() -> None:
    owners = {
        cls
        for model in SERVICES.values()
        for cls in model.__mro__
        if isinstance(cls, type) and issubclass(cls, VigilSettings)
    }
    silent = [
        f"{owner.__name__}.{', '.join(row.fields)}"
        for owner in owners
        for row in declared_rows(owner)
        if not row.description
    ]
    assert silent == [], "give each a `#:` comment in its settings model, then run " + COMMAND


def test_every_setting_of_every_service_is_on_the_page() -> None:
    page = render()
    missing = [
        f"VIGIL_{name.upper()}"
        for model in SERVICES.values()
        for name in model.model_fields
        if f"`VIGIL_{name.upper()}`" not in page
    ]
    assert missing == []
