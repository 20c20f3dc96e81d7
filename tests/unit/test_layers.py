"""The layering rules, checked from the AST of every module under rsched/.

core is pure; rdb is the only layer that sends commands (service, archive and engine may not
even import redis); service holds the operations every face uses, and may read the archive;
engine and archive stand on core, rdb and obs; obs on core only; faces (api, cli) never import
each other, but for the one process runner below; and no function hides an import of an rsched
module (a hidden import is a cycle), but for the deferred imports listed below, each one there
for a process's start-up time.  Nor do service, archive and engine build a Redis command
themselves (NO_COMMANDS).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "rsched"
STDLIB = set(sys.stdlib_module_names)

# layer -> (rsched layers it may import, third-party top-level modules it may import)
RULES: dict[str, tuple[set[str], set[str]]] = {
    "core": ({"core"}, {"msgpack", "cronsim"}),
    "rdb": ({"core", "rdb"}, {"redis", "hiredis"}),
    # service.history chooses between the archive and Redis for a run's history: the one place
    # the archive is read for the faces, so service (not client or the faces) may import it.
    "service": ({"core", "rdb", "service", "archive"}, {"msgpack"}),
    "client": ({"core", "rdb", "service", "client"}, {"redis", "msgpack"}),
    # service, archive and engine reach Redis through rdb alone (redis-py's exception and
    # client types too: rdb.redis_api).
    "engine": ({"core", "rdb", "obs", "engine"}, {"uvloop", "msgpack", "aiohttp"}),
    "archive": ({"core", "rdb", "obs", "archive"}, {"psycopg"}),
    "obs": ({"core", "obs"}, {"prometheus_client"}),
}
FACES = {"api", "cli"}
# The one edge between faces, exactly (importing module, imported module): `rsched api` must
# start the API, and cli.main is the process runner that puts every rsched process together;
# every other cli module (the operator commands among them) never imports the API.
PROCESS_RUNNERS = {("rsched.cli.main", "rsched.api.app"), ("rsched.cli.main", "rsched.api.echo")}

# Imports inside a function, exactly (importing module, imported module): each defers a part a
# process may never use, so that a worker's or dispatcher's start-up skips it (the SQL drivers,
# the HTTP stack, the archiver, the dev runner).  Layer rules still apply to them.
DEFERRED = {
    ("rsched.archive.stores", "rsched.archive.postgres"),
    ("rsched.archive.stores", "rsched.archive.sqlite"),
    ("rsched.cli.main", "rsched.api.app"),
    ("rsched.cli.main", "rsched.api.echo"),
    ("rsched.cli.main", "rsched.archive.archiver"),
    ("rsched.cli.main", "rsched.cli._supervisor"),
    ("rsched.cli.main", "rsched.cli.dev"),
    ("rsched.cli.main", "rsched.engine.dispatcher.dispatcher"),
    ("rsched.cli.main", "rsched.engine.worker.worker"),
    ("rsched.cli.main", "rsched.service.status"),
    ("rsched.engine.worker.worker", "rsched.engine.worker.http_target"),
}

# Violations being fixed; each mark goes when the fix lands.
IN_PROGRESS: dict[str, str] = {}


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        yield ".".join(("rsched", *rel.with_suffix("").parts)), path


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    return "client" if parts[1] in ("client", "aclient") else parts[1]


def _imports(path: Path) -> Iterator[tuple[str, bool, int]]:
    """(module imported, whether inside a function, line) for every import of the file."""
    tree = ast.parse(path.read_text())
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inside.update(id(n) for n in ast.walk(node) if n is not node)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, id(node) in inside, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, id(node) in inside, node.lineno


def _violations(layer: str) -> list[str]:
    bad = []
    for module, path in _modules():
        if _layer(module) != layer:
            continue
        for name, nested, line in _imports(path):
            top = name.split(".")[0]
            where = f"{path.relative_to(PKG.parent)}:{line} imports {name}"
            if top == "rsched":
                target = _layer(name)
                if nested and (module, name) not in DEFERRED:
                    bad.append(where + " inside a function")
                if layer in RULES and target not in RULES[layer][0]:
                    bad.append(where)
                if (layer in FACES and target in FACES - {layer}
                        and (module, name) not in PROCESS_RUNNERS):
                    bad.append(where + " (faces never import each other)")
            elif layer in RULES and top not in STDLIB and top not in RULES[layer][1]:
                bad.append(where + " (third-party)")
    return bad


# What service, archive and engine may not do themselves: build Redis commands (rdb.ops's
# Commands and cmd, a pipeline or a raw command on a client) or call a script by hand.  rdb
# builds every command and script call; the layers above send what rdb functions build (a
# Scripts step of calls from rdb.job_scripts, an rdb Op, the engine's batches of calls from
# rdb.claim_script, rdb.leases and rdb.run_scripts) and get parsed values back.
NO_COMMANDS = {"archive", "engine", "service"}
_COMMAND_NAMES = {"Commands", "cmd", "fill_pipeline"}
_CLIENT_CALLS = {"pipeline", "execute_command", "evalsha", "script_load"}


def _commands_built(path: Path) -> Iterator[tuple[int, str]]:
    """(line, what) where the file builds a Redis command itself (see NO_COMMANDS)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.ImportFrom) and node.module == "rsched.rdb.ops"
                and (names := {a.name for a in node.names} & _COMMAND_NAMES)):
            yield node.lineno, f"imports {sorted(names)}"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in _CLIENT_CALLS):
            yield node.lineno, f"calls .{node.func.attr}()"


@pytest.mark.parametrize("layer", sorted(NO_COMMANDS))
def test_layers_above_rdb_build_no_redis_command_themselves(layer: str) -> None:
    assert [f"{path.relative_to(PKG.parent)}:{line} {what}" for module, path in _modules()
            if _layer(module) == layer for line, what in _commands_built(path)] == []


def test_the_command_check_sees_a_pipeline_and_a_command_built_by_hand(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from rsched.rdb.ops import Commands, Op, cmd\n"
                   "def f(r):\n    return r.pipeline(transaction=False)\n")
    assert sorted(_commands_built(src)) == [(1, "imports ['Commands', 'cmd']"),
                                            (3, "calls .pipeline()")]


def _param(layer: str) -> object:
    reason = IN_PROGRESS.get(layer)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(layer, id=layer, marks=marks)


@pytest.mark.parametrize("layer", [_param(layer) for layer in [*RULES, *sorted(FACES)]])
def test_each_layer_imports_only_what_it_may(layer: str) -> None:
    assert _violations(layer) == []


def test_the_check_sees_a_hidden_import_and_a_layer_breach(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import os\nfrom rsched.rdb import keys\ndef f():\n    import rsched.api\n")
    got = list(_imports(src))
    assert sorted(got) == [("os", False, 1), ("rsched.api", True, 4), ("rsched.rdb", False, 2)]


def test_a_worker_starts_without_the_parts_it_never_uses() -> None:
    """What `rsched worker` and a handler module's `from rsched import Client` import: no SQL
    driver, no HTTP stack, no archiver (they cost a worker 0.35-0.45 s of its start-up)."""
    import subprocess

    code = ("import sys, rsched, rsched.cli.main, rsched.engine.worker.worker, "
            "rsched.engine.dispatcher.dispatcher; print(' '.join(sorted(sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                text=True, cwd=PKG.parent).stdout.split())
    unused = {"psycopg", "sqlite3", "starlette", "uvicorn", "rsched.api", "rsched.api.app",
              "rsched.archive.archiver", "rsched.archive.postgres", "rsched.archive.sqlite",
              "rsched.cli.dev"}
    assert sorted(unused & loaded) == []
