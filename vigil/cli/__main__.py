"""`python -m vigil.cli`."""

import sys

from vigil.cli import app

sys.exit(app())
