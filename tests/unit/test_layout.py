"""The test suite's own layout: every test file in the folder of what it needs, named by feature,
short enough to read, and sharing code only through the package tests/support."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from support.layout import FOLDERS, TESTS, misplaced

MAX_LINES = 800
# An issue or pull-request number in a file name: test_issue_15.py, test_gh42.py, test_15_items.py.
BY_ISSUE = re.compile(r"issue|(?:^|_)(?:gh|pr|i)?\d+(?:_|$)", re.IGNORECASE)


def all_test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "artifacts" not in p.parts)


def test_every_test_file_is_in_the_folder_of_what_it_needs() -> None:
    files = all_test_files()
    assert len(files) > 50
    assert [str(p.relative_to(TESTS)) for p in files if p.parent.parent != TESTS
            or p.parent.name not in FOLDERS] == []


def test_no_test_file_is_longer_than_800_lines() -> None:
    lengths = {str(p.relative_to(TESTS)): len(p.read_text().splitlines()) for p in all_test_files()}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}
    assert max(lengths.values()) > 100  # the files were read


def test_test_files_are_named_by_feature_never_by_issue() -> None:
    assert [p.name for p in all_test_files() if BY_ISSUE.search(p.stem.removeprefix("test_"))] == []


@pytest.mark.parametrize(("name", "by_issue"), [
    ("test_issue_15.py", True), ("test_gh42.py", True), ("test_15_items.py", True),
    ("test_worker_reclaims.py", False), ("test_cron.py", False), ("test_http2_bounds.py", False),
])
def test_the_issue_pattern_tells_numbers_from_features(name: str, by_issue: bool) -> None:
    assert bool(BY_ISSUE.search(name.removesuffix(".py").removeprefix("test_"))) is by_issue


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_test_module_imports_another_shared_code_lives_in_support() -> None:
    python = sorted(p for p in TESTS.rglob("*.py") if "artifacts" not in p.parts)
    wrong = {str(p.relative_to(TESTS)): sorted(m for m in imported_modules(p)
                                               if m.startswith("test_") or m == "conftest")
             for p in python}
    assert {name: mods for name, mods in wrong.items() if mods} == {}
    assert not list((TESTS / "support").glob("test_*.py"))


def test_a_test_asking_for_more_than_its_folder_gives_is_named_with_where_it_belongs() -> None:
    unit, redis, processes = (TESTS / folder / "test_x.py" for folder in FOLDERS)
    assert misplaced(unit, ["tmp_path"]) is None
    assert "tests/redis" in (misplaced(unit, ["r", "redis_url", "redis_available"]) or "")
    assert misplaced(redis, ["r", "redis_available"]) is None
    assert "cluster" in (misplaced(redis, ["cluster", "redis_available"]) or "")
    assert "redis_sentinel" in (misplaced(redis, ["redis_sentinel"]) or "")
    assert misplaced(processes, ["cluster", "redis_sentinel", "redis_available"]) is None
