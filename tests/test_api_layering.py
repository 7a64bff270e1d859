"""The Kafka handlers (services/broker/api) are given their collaborators by the
composition root and never see the Broker: no module there imports broker.py (not even
for type checking), no handler reaches through a request context to the broker, and no
import hides inside a function to dodge a cycle. Read from the source, so a new handler
that breaks the rule fails here, not in a review."""

from __future__ import annotations

import ast
from functools import partial
from pathlib import Path
from typing import Any

API = Path(__file__).resolve().parents[1] / "services" / "broker" / "api"


def _modules() -> list[Path]:
    found = sorted(API.glob("*.py"))
    assert len(found) > 10, f"no handler modules under {API}"
    return found


def _imported(path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Absolute dotted names an import statement in services/broker/api names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level == 0:
        return [node.module or ""]
    # services/broker/api/x.py: level 1 is straitmq.broker.api, level 2 straitmq.broker
    base = ["straitmq", "broker", "api"][: 3 - (node.level - 1)]
    if node.module:
        return [".".join([*base, node.module])]
    return [".".join([*base, a.name]) for a in node.names]


def test_no_handler_module_imports_the_broker() -> None:
    offenders = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for name in _imported(path, node):
                    if name == "straitmq.broker.broker" or name.startswith(
                        "straitmq.broker.broker."
                    ):
                        offenders.append(f"{path.name}:{node.lineno} imports {name}")
    assert offenders == []


def test_no_handler_reaches_the_broker_through_its_context() -> None:
    offenders = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "broker":
                offenders.append(f"{path.name}:{node.lineno} reads .broker")
    assert offenders == []


def test_no_import_inside_a_function() -> None:
    """A function-local import is how a cycle is dodged; the handler modules have none
    (imports for type checking only sit at module level under TYPE_CHECKING)."""
    offenders = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Import | ast.ImportFrom):
                        offenders.append(f"{path.name}:{inner.lineno} in {node.name}()")
    assert offenders == []


def test_every_advertised_api_has_a_handler_with_its_versions() -> None:
    """The versions table (what ApiVersions lists) and the bound handler table name the
    same keys: a client never calls an API it was told of and finds no handler."""
    from straitmq.broker.api import dispatch, share
    from straitmq.broker.api.versions import VERSIONS, advertised

    # Binding calls nothing it is given: placeholders are enough to build the table.
    nothing: Any = None
    table = dispatch.kafka_api(
        writer=nothing,
        verifier=nothing,
        fetch_deps=nothing,
        replicas=nothing,
        metadata_deps=nothing,
        metadata_view=nothing,
        group_deps=nothing,
        admin_deps=nothing,
        txn_deps=nothing,
        controller=nothing,
        share_coordinator=nothing,
        partition_txn_deps=nothing,
    )
    assert set(table) == set(VERSIONS) == {a["api_key"] for a in advertised()}
    for key, spec in table.items():
        assert (spec.min_version, spec.max_version) == (
            VERSIONS[key].min_version,
            VERSIONS[key].max_version,
        )
    # Each handler is bound to the collaborators its family is given, never the Broker.
    handler = table[76].handler
    assert isinstance(handler, partial) and handler.func is share.handle_share_group_heartbeat


def test_no_import_inside_a_function_anywhere_in_the_broker() -> None:
    """The same habit for the whole broker and the node above it: a cycle is broken by
    moving what both sides need, never hidden in a function."""
    root = API.parents[1]
    offenders = []
    for path in sorted([*(root / "broker").rglob("*.py"), *(root / "node").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Import | ast.ImportFrom):
                        where = path.relative_to(root)
                        offenders.append(f"{where}:{inner.lineno} in {node.name}()")
    assert len(offenders) == 0, offenders
