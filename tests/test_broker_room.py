"""Every line that knows kombu or Celery's Redis layout is in ``sluice.queues.broker``, and one
module there registers Lua scripts: read from the source with ``ast``, nothing is run."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "sluice"
BROKER = SRC / "queues" / "broker"
#: What only the broker imports: kombu, and Celery's Redis backend.
BROKER_ONLY = ("kombu", "celery.backends.redis")
#: Calls that put a Lua script into Redis (redis-py's), or run one by its text.
REGISTERING = {"register_script", "script_load", "eval"}


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in sorted(SRC.rglob("*.py"))]


def _imported(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_only_the_broker_package_imports_kombu_or_celerys_redis_backend() -> None:
    outside = {str(path.relative_to(SRC)): sorted(name for name in _imported(tree)
                                                  if name.split(".")[0] == "kombu" or name.startswith(BROKER_ONLY))
               for path, tree in _modules() if BROKER not in path.parents}
    assert {path: names for path, names in outside.items() if names} == {}


def test_one_module_registers_lua_scripts() -> None:
    registering = {str(path.relative_to(SRC)) for path, tree in _modules() for node in ast.walk(tree)
                   if isinstance(node, ast.Attribute) and node.attr in REGISTERING}
    assert registering == {"queues/broker/scripts.py"}
    assert {script.parent for script in SRC.rglob("*.lua")} == {BROKER / "lua"}
