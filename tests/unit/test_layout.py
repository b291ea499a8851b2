"""The layout holds: only the stores (recallq.state: items, runs, batched_items, and the
guarded writes they share) write item and run state.

The import contracts between recallq/, api/ and worker/ are checked by import-linter in CI
(`lint-imports`, contracts in pyproject.toml); this scans the source for the writes an import
contract cannot see: UPDATE/INSERT/DELETE statements on items or runs, built with SQLAlchemy
or written as SQL text, and ORM assignments to a `status`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The stores: the only writers of item and run state.
STORES = frozenset(
    REPO / "recallq" / "state" / f"{name}.py"
    for name in ("items", "runs", "batched_items", "item_writes", "item_statements", "item_charges")
)
STATE_TABLES = {"Item", "Run", "items", "runs"}
SQL_WRITE = re.compile(r"\b(update|insert\s+into|delete\s+from)\s+(items|runs)\b", re.IGNORECASE)


def _sources() -> list[Path]:
    return sorted(p for d in ("recallq", "api", "worker") for p in (REPO / d).rglob("*.py"))


def _names_a_state_table(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in STATE_TABLES
    if isinstance(node, ast.Attribute):  # Item.__table__, tables.Item
        return _names_a_state_table(node.value) or node.attr in STATE_TABLES
    return False


def _assigns_a_status(target: ast.AST) -> bool:
    """`run.status = ...`, `item.status = ...` (an ORM write of a run or an item)."""
    if not (isinstance(target, ast.Attribute) and target.attr == "status"):
        return False
    owner = ast.unparse(target.value).lower()
    return "run" in owner or "item" in owner


def writes_of_state(source: str) -> list[str]:
    """Where a module writes item or run state, as "line: what"."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else None
            name = node.func.attr if isinstance(node.func, ast.Attribute) else name
            writes = name in {"update", "insert", "delete"} and node.args
            if writes and _names_a_state_table(node.args[0]):
                found.append(f"{node.lineno}: {name}({ast.unparse(node.args[0])})")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if _assigns_a_status(part):
                        found.append(f"{node.lineno}: assigns {ast.unparse(part)}")
        elif isinstance(node, ast.Constant) and SQL_WRITE.search(str(node.value)):
            found.append(f"{node.lineno}: SQL {str(node.value).strip()[:40]!r}")
    return found


def test_only_the_store_writes_item_and_run_state() -> None:
    offenders = {
        str(path.relative_to(REPO)): writes
        for path in _sources()
        if path not in STORES and (writes := writes_of_state(path.read_text()))
    }
    assert offenders == {}


def test_the_scan_sees_each_kind_of_write() -> None:
    # the stores write with statements of their own (batched_items only through item_writes')
    for name in ("items", "runs", "item_writes"):
        assert writes_of_state((REPO / "recallq" / "state" / f"{name}.py").read_text()), name
    for write in (
        "update(Item).values(status='x')",
        "conn.execute(update(items).where(items.c.id == 1))",
        "stmt = insert(Run.__table__)",
        "run.status = 'cancelled'",
        "conn.execute(text('UPDATE items SET status = 1'))",
        "sql = 'delete from runs where id = 1'",
    ):
        assert writes_of_state(write), write
    assert writes_of_state("select(Item).where(Item.status == 'x')") == []
