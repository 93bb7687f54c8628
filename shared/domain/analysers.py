"""Finding analysers (`shared.domain.analyser.Analyser`) through the `vigil.analysers` entry points.

A job names its analyser in `policy.analyser` (default: `default`, design §5). A site registers
its own in its package's metadata:

    [project.entry-points."vigil.analysers"]
    retry-segv = "mysite.analysers:RetrySegv"

The entry point names a class taking no arguments (or a factory); it usually wraps
`DefaultAnalyser` and adjusts its decision (see examples/retry-segv/).
"""

from importlib.metadata import entry_points
from typing import Final

from shared.domain.analyser import Analyser, DefaultAnalyser

GROUP: Final = "vigil.analysers"
DEFAULT: Final = "default"


def available_names() -> list[str]:
    """Every analyser name a job may give, sorted (does not import them)."""
    return sorted({DEFAULT, *(ep.name for ep in entry_points(group=GROUP))})


def load_analysers() -> dict[str, Analyser]:
    """One instance of every registered analyser, by name (`default` always among them)."""
    found: dict[str, Analyser] = {DEFAULT: DefaultAnalyser()}
    for ep in entry_points(group=GROUP):
        factory = ep.load()
        analyser = factory()
        if not callable(getattr(analyser, "decide", None)):
            raise TypeError(f"entry point {ep.name} does not make an analyser: {analyser!r}")
        found[ep.name] = analyser
    return found
