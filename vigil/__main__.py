"""`python -m vigil`: the command-line client, as the `vigil` command."""

from vigil.cli import app

app(prog_name="vigil")
