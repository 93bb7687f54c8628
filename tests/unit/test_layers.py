"""Who may import whom (docs/explanation/architecture.md, the map): `shared/` imports no
service, no service imports another, and the `vigil` client imports neither. Read from the
source, not run."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("api", "scheduler", "worker", "supervisor")
#: `shared/`'s layers, lowest first: each imports only the layers before it (and itself).
LAYERS = (
    "domain",
    "objects",
    "runtime",
    "batch",
    "messaging",
    "store",
    "operations",
    "host",
    "task_types",
)


def _offenders(folder: Path, forbidden: tuple[str, ...]) -> list[str]:
    """`<file> imports <module>` for every absolute import under `folder` of a module in (or
    under) one of the `forbidden` packages."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            found += [
                f"{path.relative_to(folder)} imports {name}"
                for name in names
                if any(name == f or name.startswith(f + ".") for f in forbidden)
            ]
    return found


def test_shared_imports_no_service_nor_the_client() -> None:
    assert _offenders(ROOT / "shared", ("services", "vigil", "bench", "tests")) == []


def test_shared_is_its_layers_and_nothing_else() -> None:
    found = {path.name for path in (ROOT / "shared").iterdir() if path.name != "__pycache__"}

    assert found == {"__init__.py", *LAYERS}


def test_each_layer_of_shared_imports_only_the_layers_below_it() -> None:
    for index, layer in enumerate(LAYERS):
        above = tuple(f"shared.{higher}" for higher in LAYERS[index + 1 :])
        assert _offenders(ROOT / "shared" / layer, above) == [], layer


#: A statement that writes: what only `shared/store/` may hold (docs/explanation/architecture.md,
#: the map).
_WRITE = re.compile(r"\b(INSERT\s+INTO|DELETE\s+FROM|TRUNCATE|UPDATE\s+\w+(\s+\w+)?\s+SET)\b")
_COPY = frozenset({"copy_records_to_table", "copy_to_table", "copy_from_query"})


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of `tree` (prose, not statements)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


#: A row lock: what only `shared/store/` takes, with the write it protects.
_ROW_LOCK = re.compile(r"\bFOR\s+(NO\s+KEY\s+UPDATE|UPDATE|KEY\s+SHARE|SHARE)\b")


def _writers(
    folder: Path, allowed: Path | None = None, statement: re.Pattern[str] = _WRITE
) -> list[str]:
    """`<file>:<line>` for every SQL write (a string that writes, or a COPY) under `folder`,
    but under `allowed`; with `statement`, every string that matches it instead."""
    found: list[tuple[str, int]] = []
    for path in sorted(folder.rglob("*.py")):
        if allowed is not None and path.is_relative_to(allowed):
            continue
        tree = ast.parse(path.read_text(), str(path))
        prose = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                writes = id(node) not in prose and statement.search(node.value) is not None
            else:
                writes = (
                    statement is _WRITE and isinstance(node, ast.Attribute) and node.attr in _COPY
                )
            if writes:
                assert isinstance(node, ast.expr)
                found.append((str(path.relative_to(folder)), node.lineno))
    return [f"{name}:{line}" for name, line in sorted(found)]


def test_every_sql_write_lives_in_the_store() -> None:
    assert _writers(ROOT / "shared", allowed=ROOT / "shared" / "store") == []
    for folder in ("services", "vigil"):
        assert _writers(ROOT / folder) == [], folder


def test_every_row_lock_is_taken_in_the_store() -> None:
    store = ROOT / "shared" / "store"
    assert _writers(ROOT / "shared", allowed=store, statement=_ROW_LOCK) == []
    for folder in ("services", "vigil"):
        assert _writers(ROOT / folder, statement=_ROW_LOCK) == [], folder


def test_the_row_lock_check_finds_each_kind_of_lock(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        '"""A row locked FOR UPDATE in prose is fine."""\n'
        'a = "SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE"\n'
        'b = f"SELECT 1 FROM tasks t FOR UPDATE OF t SKIP LOCKED"\n'
        'c = "SELECT 1 FROM jobs FOR SHARE"\n'
        'd = "SELECT 1 FROM jobs FOR NO KEY UPDATE"\n'
        'e = "SELECT 1 FROM jobs -- for the update"\n'
    )

    assert _writers(tmp_path, statement=_ROW_LOCK) == ["m.py:2", "m.py:3", "m.py:4", "m.py:5"]


def test_every_write_of_the_store_says_which_lock_it_takes() -> None:
    silent = []
    for path in sorted((ROOT / "shared" / "store").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        prose = _docstrings(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if node.name.startswith("_"):
                continue
            writes = any(
                isinstance(n, ast.Constant)
                and isinstance(n.value, str)
                and id(n) not in prose
                and _WRITE.search(n.value) is not None
                for n in ast.walk(node)
            )
            if writes and "lock" not in (ast.get_docstring(node) or "").lower():
                silent.append(f"{path.name}:{node.name}")
    assert silent == []


def test_the_write_check_finds_each_kind_of_write(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        '"""UPDATE tasks SET in prose is fine."""\n'
        'a = "UPDATE tasks t SET claim = NULL"\n'
        'b = "INSERT INTO outbox (body) VALUES ($1)"\n'
        'c = f"DELETE FROM logs WHERE id = {1}"\n'
        "d = conn.copy_records_to_table\n"
        'e = "SELECT 1 FROM tasks -- update the docs"\n'
    )

    assert _writers(tmp_path) == ["m.py:2", "m.py:3", "m.py:4", "m.py:5"]


def test_no_service_imports_another() -> None:
    for service in SERVICES:
        others = tuple(f"services.{other}" for other in SERVICES if other != service)
        assert _offenders(ROOT / "services" / service, others) == [], service


def test_the_client_imports_neither_the_services_nor_shared() -> None:
    assert _offenders(ROOT / "vigil", ("services", "shared")) == []


def test_the_check_finds_each_kind_of_import(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "from services.api import app\nimport shared.store.db\nimport sharedish\nfrom . import x\n"
    )

    assert _offenders(tmp_path, ("services", "shared")) == [
        "m.py imports services.api",
        "m.py imports shared.store.db",
    ]


def _imports(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Each module under `root`'s `packages` (dotted) -> the modules of those packages it
    imports, anywhere in it (a function's import, or one for type checking only, too)."""
    graph: dict[str, set[str]] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            graph[module] = set()
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                else:
                    continue
                graph[module] |= {n for n in names if n.split(".")[0] in packages}
    return {m: {n for n in found if n in graph and n != m} for m, found in graph.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules of `graph` that import each other in a loop, each loop's modules sorted
    (Tarjan's strongly connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            loop = []
            while (member := stack.pop()) != module:
                loop.append(member)
            if loop:
                found.append(sorted([*loop, module]))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_no_modules_of_the_services_or_shared_import_each_other_in_a_loop() -> None:
    assert _cycles(_imports(ROOT, ("services", "shared"))) == []


def test_the_cycle_check_finds_a_loop(tmp_path: Path) -> None:
    (tmp_path / "services").mkdir()
    (tmp_path / "services" / "a.py").write_text("from services.b import B\n")
    (tmp_path / "services" / "b.py").write_text(
        "def f():\n    from services import c\nimport services.a\n"
    )
    (tmp_path / "services" / "c.py").write_text("import services.d\n")
    (tmp_path / "services" / "d.py").write_text("X = 1\n")

    assert _cycles(_imports(tmp_path, ("services",))) == [["services.a", "services.b"]]
