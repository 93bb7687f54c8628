"""The docs run as written: every block marked `<!-- doc-test -->` in the pages under docs/
runs against a running system, in order, and must print what the page shows and exit as it
says (`tests/doc_examples.py` says how blocks are read and compared). The README's run in a
fresh clone after the real `scripts/up` (`tests/e2e/test_scripts_up.py`)."""

import os
import selectors
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import doc_examples
from tests.doc_examples import Block, Ids
from tests.e2e.stack import Stack

STEP_TIMEOUT_S = 120.0
README = doc_examples.ROOT / "README.md"
PAGES = [p for p in doc_examples.PAGES if p != README and doc_examples.blocks(p)]


class Shell:
    """One bash session: commands run one after another, sharing variables and directory."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd = cwd
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.steps = 0

    def run(self, command: str, *, script: bool) -> tuple[int, str]:
        """(exit status, stdout and stderr) of `command`, with `pipefail` (a script runs under
        `set -e` too)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.steps += 1
        out = self.cwd / f".doc-step-{self.steps}.out"
        body = f"( set -eo pipefail\n{command}\n)" if script else f"{{\n{command}\n}}"
        self.proc.stdin.write(
            f'set -o pipefail\n{body} > "{out}" 2>&1 < /dev/null\necho "__step__ $?"\n'
        )
        self.proc.stdin.flush()
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            if not selector.select(STEP_TIMEOUT_S):
                raise TimeoutError(f"no end of {command!r} in {STEP_TIMEOUT_S} s")
        done = self.proc.stdout.readline()
        assert done.startswith("__step__ "), f"the shell ended: {done!r}"
        return int(done.split()[1]), out.read_text()

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


def _run_block(shell: Shell, block: Block, url: str) -> None:
    ids = Ids()  # a block's ids stand for its own objects
    count, glob = block.makes or (0, "")
    before = set(shell.cwd.glob(glob)) if glob else set()
    for step in block.steps:
        command = ids.into(step.command).replace(doc_examples.DOC_URL, url)
        status, output = shell.run(command, script=block.kind == "script")
        shown = output.replace(url, doc_examples.DOC_URL)
        assert status == step.status, (
            f"{block.where}: `{command}` exited {status}, the page says {step.status}:\n{shown}"
        )
        left = doc_examples.missing(step.expected, shown, ids)
        assert not left, (
            f"{block.where}: `{command}` did not print {left[0]!r}; it printed:\n{shown}"
        )
    if glob:
        made = sorted(p.name for p in set(shell.cwd.glob(glob)) - before if p.stat().st_size)
        assert len(made) == count, f"{block.where}: made {made}, the page says {count} {glob}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_the_pages_examples_run_as_written(stack: Stack, tmp_path: Path, page: Path) -> None:
    assert shutil.which("jq"), "jq is missing: apt-get install jq (.ci/run installs it)"
    # given: a scratch copy of the examples' files, where the pages' blocks run (as they
    # say), and a user of the stack, `vigil` on their PATH
    campaign = tmp_path / "scratch" / doc_examples.FILES.relative_to(doc_examples.ROOT)
    shutil.copytree(doc_examples.FILES, campaign)
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("VIGIL_", "XDG_"))}
    path = f"{Path(sys.executable).parent}{os.pathsep}{kept.get('PATH', '')}"
    home = tmp_path / "home"
    home.mkdir()
    env = kept | {"PATH": path, "HOME": str(home), "VIGIL_URL": stack.base_url}
    env["VIGIL_TOKEN"] = stack.token
    shell = Shell(campaign, env)
    try:
        # when / then
        for block in doc_examples.blocks(page):
            _run_block(shell, block, stack.base_url)
    finally:
        shell.close()
