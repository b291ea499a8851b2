"""Settings are read once per process, at its edge, and passed down; the CLI package has no
import cycle.

The edges: the `recallq` command (recallq/cli/__init__.py), the API app factory
(api/app.py), and the library's two entry points, `recallq.evaluate` and `recallq.Client`
(a notebook's process starts there). The worker gets its settings from the command that
starts it. Anywhere else, `Settings(` or a read of `os.environ` is how local mode came to
ignore the context limits (issue 18).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EDGES = {
    "recallq/cli/__init__.py",
    "api/app.py",
    "recallq/evaluation.py",
    "recallq/client.py",
}
#: modules that may name os.environ, and why
ENVIRONMENT_USERS = {
    # resolves `os.environ/NAME` in the models file (the contract's way to name a key)
    # and litellm's provider defaults (OPENAI_API_KEY, ...) that the direct lane honours too
    "recallq/judge/models.py",
}


def _sources() -> list[Path]:
    return sorted(p for d in ("recallq", "api", "worker") for p in (REPO / d).rglob("*.py"))


def _relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _calls(tree: ast.AST, name: str) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == name)
            or (isinstance(node.func, ast.Attribute) and node.func.attr == name)
        )
    ]


def _environment_reads(tree: ast.AST) -> list[int]:
    """Lines naming os.environ or os.getenv, except writes: os.environ.setdefault (the
    litellm cost-map switch set before litellm is imported) and os.environ[NAME] = value
    (where prometheus-client's multiprocess files go, for the processes a worker forks)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
            found.append(node.lineno)
    setdefaults = {
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "setdefault"
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "environ"
    }
    assignments = {
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "environ"
    }
    return [line for line in found if line not in setdefaults | assignments]


def test_settings_are_built_only_by_the_settings_module() -> None:
    found = {
        _relative(path): lines
        for path in _sources()
        if _relative(path) != "recallq/settings.py"
        and (lines := _calls(ast.parse(path.read_text()), "Settings"))
    }
    assert found == {}, (
        f"Settings( outside recallq/settings.py (use read_settings at an edge): {found}"
    )


def test_the_environment_is_read_only_at_the_edges() -> None:
    readers = {
        _relative(path): lines
        for path in _sources()
        if (lines := _calls(ast.parse(path.read_text()), "read_settings"))
        or (lines := _calls(ast.parse(path.read_text()), "read_client_settings"))
    }
    readers.pop("recallq/settings.py", None)
    assert set(readers) <= EDGES, set(readers) - EDGES
    assert {"recallq/cli/__init__.py", "api/app.py"} <= set(readers)
    environment = {
        _relative(path): lines
        for path in _sources()
        if _relative(path) not in ENVIRONMENT_USERS | {"recallq/settings.py"}
        and (lines := _environment_reads(ast.parse(path.read_text())))
    }
    assert environment == {}, f"os.environ read outside the settings: {environment}"


def _imports(path: Path, package: str) -> set[str]:
    """The modules of `package` that a module imports, at any level of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == package:
                found |= {f"{package}.{alias.name}" for alias in node.names}
            elif node.module.startswith(package + "."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith(package + ".")}
    return found


def test_the_cli_package_has_no_import_cycle() -> None:
    package = REPO / "recallq" / "cli"
    modules = {
        ("recallq.cli" if p.stem == "__init__" else f"recallq.cli.{p.stem}"): p
        for p in package.glob("*.py")
    }
    graph = {
        name: {m for m in _imports(path, "recallq.cli") if m in modules and m != name}
        for name, path in modules.items()
    }
    # the package's __init__ is the composition root; nothing below imports it back
    for name, edges in graph.items():
        assert "recallq.cli" not in edges or name == "recallq.cli.__main__", (name, edges)
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for other in graph[name]:
            assert state.get(other) != "open", f"import cycle: {' -> '.join([*trail, other])}"
            if other not in state:
                visit(other, [*trail, other])
        state[name] = "done"

    for name in graph:
        if name not in state:
            visit(name, [name])
    # and the old tangle is gone: the library's modules import no CLI module
    for path in (REPO / "recallq").glob("*.py"):
        assert not _imports(path, "recallq.cli"), path


def test_a_client_reads_only_its_own_settings(monkeypatch) -> None:
    """recallq.Client defaults its key from RECALLQ_API_KEY and reads nothing else: a
    malformed setting it does not use (a worker's, say) cannot break it."""
    from recallq.client import Client

    monkeypatch.setenv("RECALLQ_WORKER_CONCURRENCY", "many")
    monkeypatch.setenv("RECALLQ_API_KEY", "rq_from_the_environment")
    client = Client("http://127.0.0.1:9")
    try:
        assert client._http.headers["Authorization"] == "Bearer rq_from_the_environment"
    finally:
        client.close()
