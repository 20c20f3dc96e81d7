"""The reference pages against the code: every RSCHED_* variable the code reads is in the
configuration table (and nothing else is), every command and option of the CLI is on the
generated CLI page, every operation of the OpenAPI document the API serves and every Lua
script's header are on theirs, and every example block of the README and Getting started is
either run by tests/redis/test_docs_examples.py or marked as not run."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import fields
from pathlib import Path
from types import ModuleType

import click
import pytest
from mkdocs_click._docs import make_command_docs
from support.doc_examples import PAGES, blocks, unaccounted

from rsched.api.openapi import document
from rsched.archive.config import ArchiverConfig
from rsched.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# A variable's whole name: not the head of a longer one, nor of an f-string's f"RSCHED_X_{...}".
VARIABLE = re.compile(r"RSCHED_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_{])")


def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def variables_in_code() -> set[str]:
    """Every RSCHED_* name in rsched/'s Python, and the archiver's, which it builds from its
    settings' field names (RSCHED_ARCHIVE_<FIELD>)."""
    found = {m.group() for p in (ROOT / "rsched").rglob("*.py")
             for m in VARIABLE.finditer(p.read_text())}
    return found | {f"RSCHED_ARCHIVE_{f.name.upper()}" for f in fields(ArchiverConfig)}


def configuration_rows() -> dict[str, str]:
    """The configuration table: variable -> its row."""
    text = (DOCS / "reference" / "configuration.md").read_text()
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `(RSCHED_[A-Z0-9_]+)` \|.*$",
                                                      text, re.M)}


def commands(group: click.Command, path: tuple[str, ...] = ("rsched",)
             ) -> list[tuple[tuple[str, ...], click.Command]]:
    out = [(path, group)]
    if isinstance(group, click.Group):
        for name, sub in sorted(group.commands.items()):
            out += commands(sub, (*path, name))
    return out


def test_the_configuration_table_lists_every_variable_the_code_reads_and_no_other() -> None:
    in_code, in_table = variables_in_code(), set(configuration_rows())
    assert len(in_code) > 20
    assert sorted(in_code - in_table) == []  # read by the code, missing from the table
    assert sorted(in_table - in_code) == []  # in the table, read by nothing


def test_a_variable_that_sets_a_flag_names_that_flag_in_its_row() -> None:
    rows = configuration_rows()
    pairs = [(var, opt.opts[0]) for _, cmd in commands(cli) for opt in cmd.params
             if isinstance(opt, click.Option) and opt.envvar
             for var in ([opt.envvar] if isinstance(opt.envvar, str) else opt.envvar)]
    assert len(pairs) >= 8
    assert [(v, flag) for v, flag in pairs if f"`{flag}`" not in rows[v]
            and f" {flag}`" not in rows[v]] == []


def test_the_cli_page_documents_every_command_and_every_option() -> None:
    page = (DOCS / "reference" / "cli.md").read_text()
    assert ":module: rsched.cli.main" in page and ":command: cli" in page
    assert ":nested: full" in page  # every subcommand, not only the top level
    rendered = "\n".join(make_command_docs(prog_name="rsched", command=cli, depth=1,
                                           style="plain", list_subcommands=True))
    sections = {}
    for part in re.split(r"^#+ .*$", rendered, flags=re.M):
        usage = re.search(r"^(rsched(?: [a-z-]+)*) \[OPTIONS\]", part, re.M)
        if usage:
            sections[tuple(usage.group(1).split())] = part
    missing = []
    tree = commands(cli)
    assert len(tree) > 25
    for path, cmd in tree:
        section = sections.get(path)
        if section is None:
            missing.append(" ".join(path))
            continue
        missing += [f"{' '.join(path)} {opt}" for param in cmd.params
                    if isinstance(param, click.Option) and not param.hidden
                    for opt in param.opts if opt not in section]
    assert missing == []


def test_the_http_page_renders_every_operation_parameter_and_schema_of_the_served_document(
) -> None:
    assert "<!-- rsched:openapi -->" in (DOCS / "reference" / "http-api.md").read_text()
    doc = document()
    text = hooks().render_openapi(doc)
    missing = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if method not in ("get", "head", "post", "put", "patch", "delete"):
                continue
            heading = f"### `{method.upper()} {path}`"
            if heading not in text:
                missing.append(heading)
                continue
            section = text.split(heading, 1)[1].split("\n### ", 1)[0]
            missing += [f"{heading} {p['name']}" for p in op.get("parameters", [])
                        if f"| `{p['name']}` |" not in section]
            missing += [f"{heading} {code}" for code in op["responses"]
                        if f"\n| {code} |" not in section]
    missing += [name for name in doc["components"]["schemas"]
                if f"### {name} {{#schema-{name.lower()}}}" not in text]
    assert len(doc["paths"]) > 20
    assert missing == []


def test_the_lua_page_shows_every_scripts_header() -> None:
    assert "<!-- rsched:lua -->" in (DOCS / "internals" / "lua.md").read_text()
    text = hooks().render_lua()
    scripts = sorted((ROOT / "lua").rglob("*.lua"))
    assert len(scripts) > 20
    missing = []
    for script in scripts:
        header = hooks().lua_header(script.read_text())
        if not header.strip() or f"### {script.name}" not in text or header not in text:
            missing.append(script.name)
        elif script.parent.name == "lua" and "KEYS[1]" not in header:
            missing.append(f"{script.name}: no KEYS in its header")
    assert missing == []


@pytest.mark.parametrize("page", PAGES)
def test_every_example_block_is_run_or_marked_as_not_run(page: str) -> None:
    found = blocks(page)
    assert found, f"no code block found in {page}"
    assert unaccounted(page) == []
    assert any(b.runs for b in found)


def test_a_block_is_unaccounted_for_unless_run_or_marked(tmp_path: Path) -> None:
    from support import doc_examples

    page = tmp_path / "page.md"
    page.write_text("```python\nprint(1)\n```\n\n```text\nout\n```\n\n"
                    "<!-- not-run: output -->\n```\nout\n```\n\n```bash\nls\n```\n")
    old = doc_examples.ROOT
    doc_examples.ROOT = tmp_path
    try:
        assert [b.runs for b in blocks("page.md")] == [True, False, False, True]
        assert unaccounted("page.md") == ["page.md:5 (text)"]
    finally:
        doc_examples.ROOT = old
