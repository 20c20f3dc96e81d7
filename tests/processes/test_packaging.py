"""The wheel is complete: built from a clean copy of the source, installed non-editable into a
fresh venv, it loads its Lua scripts and talks to Redis from outside the source tree."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import tomllib
import zipfile
from pathlib import Path

import pytest
from support.redis_server import free_port

from rsched.rdb import scripts

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# What a fresh checkout would not have, or the wheel does not need: a stale build/ folder could
# otherwise smuggle files into the wheel that the source no longer has.
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    "tests",
    "loadtest",
    "node_modules",
)


def run(argv: list[str | Path], cwd: Path, timeout: float = 300) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, tmp / "src", ignore=NOT_SOURCE)
    run([sys.executable, "-m", "pip", "wheel", tmp / "src", "--no-deps", "-q", "-w", tmp], tmp)
    (built,) = tmp.glob("rsched-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel, non-editable; its dependencies are borrowed from this
    test's environment by a path entry (no index needed), and come after its own packages."""
    home = tmp_path_factory.mktemp("venv") / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", home], home.parent)
    python = home / "bin" / "python"
    run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel],
        home.parent,
    )
    site = Path(
        run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], home.parent
        ).strip()
    )
    (site / "zz_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return home


def test_the_wheel_holds_every_lua_script_and_include(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    lua = ROOT / "lua"
    expected = {f"rsched/lua/{p.relative_to(lua).as_posix()}" for p in lua.rglob("*.lua")}
    assert {n for n in expected if n.startswith("rsched/lua/include/")}
    assert expected <= names, sorted(expected - names)
    assert {f"rsched/lua/{name}.lua" for name in scripts.NAMES} <= names


def test_the_installed_wheel_loads_its_scripts_and_schedules_a_job_outside_the_source_tree(
    venv: Path, redis_url: str, tmp_path: Path
) -> None:
    probe = f"""
import json, re, rsched
from rsched import Client
from rsched.rdb import scripts
loaded = {{name: scripts.load(name) for name in scripts.NAMES}}
client = Client({redis_url!r})
job = client.schedule("packaging.probe", {{"ok": True}}, run_at="2099-01-01T00:00:00Z")
print(json.dumps({{
    "file": rsched.__file__,
    "shas": {{name: s.sha for name, s in loaded.items()}},
    "unresolved": [name for name, s in loaded.items() if re.search("^--!include", s.source, re.M)],
    "stored": client.get(job.id).payload,
}}))
"""
    got = json.loads(run([venv / "bin" / "python", "-c", probe], tmp_path))
    assert Path(got["file"]).is_relative_to(venv)  # the wheel's copy, not the source tree
    assert got["unresolved"] == []
    assert got["shas"] == {name: scripts.load(name).sha for name in scripts.NAMES}
    assert got["stored"] == {"ok": True}
    assert "dispatcher" in run([venv / "bin" / "rsched", "--help"], tmp_path)


def test_the_redis_py_floor_that_make_test_runs_is_the_one_pyproject_allows() -> None:
    root = Path(__file__).resolve().parents[2]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    redis_dep = next(d for d in deps if d.startswith("redis["))
    floor = re.search(r">=([\d.]+)", redis_dep)
    make_floor = re.search(r"^REDIS_PY_FLOOR := (\S+)$", (root / "Makefile").read_text(), re.M)
    assert floor and make_floor and floor.group(1) == make_floor.group(1), redis_dep
    assert re.search(r",<[\d.]+", redis_dep), f"{redis_dep}: no upper bound (an untested major)"


def test_rsched_dev_from_the_installed_wheel_serves_a_users_own_app(
    venv: Path, redis_available: None, tmp_path: Path
) -> None:
    """Outside the source tree, with no examples/ at hand: `rsched dev --app` runs the user's
    module, and without --app says to pass one."""
    (tmp_path / "user_mod.py").write_text(
        "from rsched import App\napp = App()\n\n@app.job('mine.echo')\n"
        "def echo(ctx):\n    return ctx.payload\n"
    )
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME") and not k.startswith("RSCHED_")}
    rsched = str(venv / "bin" / "rsched")
    refused = subprocess.run([rsched, "dev", "--port", str(free_port())], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1, refused
    assert "error: the bundled examples/ come with the rsched source tree only: pass --app " \
        "module:attr" in refused.stderr, refused
    log = tmp_path / "dev.log"
    with open(log, "wb") as out:
        dev = subprocess.Popen([rsched, "dev", "--app", "user_mod:app", "--port",
                                str(free_port()), "--no-metrics-ports"], cwd=tmp_path,
                               env={**env, "PYTHONUNBUFFERED": "1"}, stdout=out,
                               stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while "rsched dev is running" not in log.read_text():
            assert dev.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        job_id = run([rsched, "jobs", "add", "--type", "mine.echo", "--payload", '{"n": 7}'],
                     tmp_path).strip()
        while json.loads(run([rsched, "jobs", "show", job_id, "--json"], tmp_path)
                         )["status"] != "completed":
            assert dev.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        dev.send_signal(signal.SIGINT)
        assert dev.wait(60) == 0, log.read_text()


def test_the_wheel_needs_tzdata_and_leaves_psycopg_to_the_postgres_extra(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [ln.split(":", 1)[1].strip() for ln in z.read(meta).decode().splitlines()
                    if ln.startswith("Requires-Dist:")]
    assert "tzdata" in requires
    psycopg = [r for r in requires if r.startswith("psycopg")]
    assert psycopg and all('extra == "postgres"' in r for r in psycopg), psycopg
