"""The import structure shows the architecture: every module of recallq/, api/ and worker/ is
in one of the layers that pyproject.toml's import-linter `layers` contract names, no import
runs up those layers (function-level imports included, which import-linter also sees), and no
import cycle is left at module level.

The imports are read from the source (ast), so the test needs no import of the code it checks.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("recallq", "api", "worker")
#: Modules left out of the cycle check: none since the CLI became the recallq/cli/ package
#: (tests/unit/test_settings_edges.py checks that package has no cycle either).
CLI_CYCLE: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Layer:
    position: int  # 0 is the highest
    modules: tuple[str, ...]
    independent: bool  # "|": its modules do not import each other
    optional: frozenset[str]


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    module_level: bool  # not inside a function
    type_checking: bool = False  # under `if TYPE_CHECKING:`: never runs


def _layers_contract() -> dict[str, Any]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["type"] == "layers"]
    return dict(contract)


def ignored_imports() -> set[tuple[str, str]]:
    """The contract's ignore_imports, as (importer, imported)."""
    pairs = (line.split("->") for line in _layers_contract().get("ignore_imports", []))
    return {(importer.strip(), imported.strip()) for importer, imported in pairs}


def declared_layers() -> list[Layer]:
    contract = _layers_contract()
    layers = []
    for position, text in enumerate(contract["layers"]):
        independent = ":" not in text
        names = [name.strip() for name in text.replace(":", "|").split("|")]
        optional = frozenset(name.strip("()") for name in names if name.startswith("("))
        modules = tuple(name.strip("()") for name in names)
        layers.append(Layer(position, modules, independent, optional))
    return layers


def source_modules() -> dict[str, Path]:
    modules = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


#: Code whose imports do not run when the module is imported.
_DEFERRED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


_Found = tuple[ast.Import | ast.ImportFrom, bool, bool]


def _imports_in(tree: ast.Module) -> Iterator[_Found]:
    """Every import statement, whether it runs when the module is imported, and whether it
    is for type checking only."""

    def visit(node: ast.AST, module_level: bool, typing_only: bool) -> Iterator[_Found]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, module_level and not typing_only, typing_only
            elif isinstance(child, _DEFERRED):
                yield from visit(child, False, typing_only)
            elif isinstance(child, ast.If) and _is_type_checking(child):
                yield from visit(child, module_level, True)
            else:
                yield from visit(child, module_level, typing_only)

    yield from visit(tree, True, False)


def imports(modules: Mapping[str, Path]) -> list[Import]:
    """The imports between these modules (`from package import module` names the module)."""

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found = []
    for importer, path in modules.items():
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        for node, module_level, typing_only in _imports_in(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for target in targets:
                imported = known(target)
                if imported is not None and imported != importer:
                    found.append(Import(importer, imported, node.lineno, module_level, typing_only))
                    if not isinstance(node, ast.Import):
                        break  # the first (most specific) name that is a module
    return found


def _has_imports(path: Path) -> bool:
    return any(
        isinstance(n, ast.Import | ast.ImportFrom) for n in ast.walk(ast.parse(path.read_text()))
    )


def layer_of(module: str, layers: Iterable[Layer]) -> tuple[Layer, str] | None:
    """The layer a module is in, and the layer's entry it falls under (the longest match)."""
    best: tuple[Layer, str] | None = None
    for layer in layers:
        for entry in layer.modules:
            inside = module == entry or module.startswith(entry + ".")
            if inside and (best is None or len(entry) > len(best[1])):
                best = (layer, entry)
    return best


def upward(
    found: Iterable[Import], layers: list[Layer], ignored: Collection[tuple[str, str]] = ()
) -> list[str]:
    """Imports that run (type-checking ones aside) from a lower layer to a higher one, or
    between independent siblings, except the `ignored` (importer, imported) pairs."""
    wrong = []
    for imp in found:
        if imp.type_checking or (imp.importer, imp.imported) in ignored:
            continue
        low, high = layer_of(imp.importer, layers), layer_of(imp.imported, layers)
        if low is None or high is None:
            continue  # the root packages' own __init__ (recallq, api, worker)
        (importer_layer, importer_entry), (imported_layer, imported_entry) = low, high
        if imported_layer.position < importer_layer.position:
            wrong.append(f"{imp.importer}:{imp.line} imports {imp.imported}, a higher layer")
        elif (
            imported_layer is importer_layer
            and importer_layer.independent
            and importer_entry != imported_entry
        ):
            wrong.append(
                f"{imp.importer}:{imp.line} imports its independent sibling {imp.imported}"
            )
    return wrong


def cycles(graph: Mapping[str, Iterable[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph.get(node, ()):
            if successor not in index:
                connect(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in graph:
        if node not in index:
            connect(node)
    return found


# --- the project -------------------------------------------------------------------------


def test_every_module_is_in_a_declared_layer() -> None:
    layers = declared_layers()
    modules = source_modules()
    # the root packages (recallq's lazy public names) and packages that only group modules
    grouping = set(ROOTS) | {
        m for m, path in modules.items() if path.name == "__init__.py" and not _has_imports(path)
    }
    missing = [m for m in modules if m not in grouping and layer_of(m, layers) is None]
    assert missing == [], f"put these in a layer of pyproject.toml's layers contract: {missing}"
    declared = {entry for layer in layers for entry in layer.modules}
    absent = [
        entry
        for layer in layers
        for entry in layer.modules
        if entry not in layer.optional
        and not any(m == entry or m.startswith(entry + ".") for m in modules)
    ]
    assert absent == [], f"layers name modules that do not exist: {absent}"
    assert len(declared) == sum(len(layer.modules) for layer in layers), "a module in two layers"


def test_no_import_runs_up_the_layers() -> None:
    assert upward(imports(source_modules()), declared_layers(), ignored_imports()) == []


def test_no_import_cycle_at_module_level() -> None:
    graph: dict[str, set[str]] = {}
    for imp in imports(source_modules()):
        if imp.module_level and not {imp.importer, imp.imported} & CLI_CYCLE:
            graph.setdefault(imp.importer, set()).add(imp.imported)
    assert cycles(graph) == []


def test_the_errors_are_on_the_ground_floor() -> None:
    """coordination/, observability/ and core/ take the judge-call errors from
    recallq.core.errors, not from the judge package they are used by (the cycle that was)."""
    found = imports(source_modules())
    below_judges = ("recallq.coordination", "recallq.observability", "recallq.core")
    assert [
        imp
        for imp in found
        if imp.importer.startswith(below_judges) and imp.imported.startswith("recallq.judge")
    ] == []


# --- the checks themselves -----------------------------------------------------------------


def test_the_checks_find_a_cycle_an_upward_import_and_a_sibling_import() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []
    layers = [
        Layer(0, ("top",), True, frozenset()),
        Layer(1, ("mid.x", "mid.y"), True, frozenset()),
        Layer(2, ("low",), True, frozenset()),
    ]
    found = [
        Import("top", "low", 1, True),
        Import("low.z", "mid.x", 2, False),  # a function-level import counts
        Import("mid.x", "mid.y", 3, True),
        Import("mid.x.inner", "mid.x", 4, True),
        Import("low", "top", 5, False, type_checking=True),  # never runs
        Import("low", "mid.y", 6, True),  # ignored below
    ]
    assert upward(found, layers, {("low", "mid.y")}) == [
        "low.z:2 imports mid.x, a higher layer",
        "mid.x:3 imports its independent sibling mid.y",
    ]


def test_imports_are_read_relative_and_by_module(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nfrom pkg import b\nif TYPE_CHECKING:\n"
        "    from pkg.sub import c\ndef f():\n    from .sub.c import name\n"
    )
    (package / "b.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "c.py").write_text("name = 1\n")
    modules = {
        "pkg": package / "__init__.py",
        "pkg.a": package / "a.py",
        "pkg.b": package / "b.py",
        "pkg.sub": package / "sub" / "__init__.py",
        "pkg.sub.c": package / "sub" / "c.py",
    }
    assert {(i.imported, i.module_level) for i in imports(modules) if i.importer == "pkg.a"} == {
        ("pkg.b", True),
        ("pkg.sub.c", False),  # both the function's import and the TYPE_CHECKING one
    }
    assert [i.type_checking for i in imports(modules) if i.importer == "pkg.a"] == [
        False,
        True,
        False,
    ]
