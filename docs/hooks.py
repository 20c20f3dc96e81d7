"""MkDocs hooks (mkdocs.yml `hooks:`): the reference pages generated from the code at build time.

A page holding `<!-- rsched:openapi -->` gets the HTTP API rendered from the OpenAPI document
the API serves (rsched.api.openapi.document), and `<!-- rsched:lua -->` every Lua script's
header, read from lua/. The document itself is published beside the page as
reference/openapi.json. tests/unit/test_docs_reference.py holds the renderings against the code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OPENAPI_MARK = "<!-- rsched:openapi -->"
LUA_MARK = "<!-- rsched:lua -->"
METHODS = ("get", "head", "post", "put", "patch", "delete")


def _cell(text: Any) -> str:
    """Text fit for one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _schema_text(schema: dict[str, Any]) -> str:
    """A short name for a schema: its $ref's name, or its type with bounds."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#schema-{name.lower()})"
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if kind == "array" and isinstance(schema.get("items"), dict):
        return f"array of {_schema_text(schema['items'])}"
    bounds = [f"{k} {schema[k]}" for k in ("minimum", "maximum", "minLength", "maxLength",
                                            "pattern") if k in schema]
    if "enum" in schema:
        bounds.append("one of " + ", ".join(f"`{v}`" for v in schema["enum"]))
    return f"{kind} ({'; '.join(bounds)})" if bounds else str(kind)


def _responses(op: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    shared = doc.get("components", {}).get("responses", {})
    rows = ["| status | meaning |", "| --- | --- |"]
    for code, answer in sorted(op.get("responses", {}).items()):
        if "$ref" in answer:
            answer = shared.get(answer["$ref"].rsplit("/", 1)[-1], {})
        body = ""
        for media in answer.get("content", {}).values():
            if "schema" in media:
                body = " " + _schema_text(media["schema"])
        rows.append(f"| {code} | {_cell(answer.get('description', ''))}{body} |")
    return rows


def render_openapi(doc: dict[str, Any]) -> str:
    """Markdown for every operation of ``doc``, grouped by tag, then every schema."""
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, ops in doc["paths"].items():
        for method in METHODS:
            if method in ops:
                op = ops[method]
                by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((method, path, op))
    out: list[str] = []
    for tag, ops_of_tag in by_tag.items():
        out += [f"## {tag.capitalize()}", ""]
        for method, path, op in ops_of_tag:
            out += [f"### `{method.upper()} {path}`", ""]
            if op.get("summary"):
                out += [op["summary"] + ".", ""]
            if op.get("description"):
                out += [op["description"], ""]
            out += [f"Operation id: `{op.get('operationId', '')}`.", ""]
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | type | required | meaning |",
                        "| --- | --- | --- | --- | --- |"]
                for p in params:
                    out.append(f"| `{p['name']}` | {p['in']} | {_cell(_schema_text(p['schema']))}"
                               f" | {'yes' if p.get('required') else 'no'}"
                               f" | {_cell(p.get('description', ''))} |")
                out.append("")
            for media, body in op.get("requestBody", {}).get("content", {}).items():
                out += [f"Body ({media}): {_schema_text(body.get('schema', {}))}", ""]
            out += _responses(op, doc) + [""]
    out += ["## Schemas", ""]
    for name, schema in doc.get("components", {}).get("schemas", {}).items():
        out += [f"### {name} {{#schema-{name.lower()}}}", "", "```json",
                json.dumps(schema, indent=2, sort_keys=False), "```", ""]
    return "\n".join(out)


def lua_header(text: str) -> str:
    """A script's header: its opening `--[[ ... ]]` block, or its leading `--` lines."""
    m = re.match(r"\s*--\[\[(.*?)\]\]", text, re.S)
    if m:
        return m.group(1).strip("\n")
    lines = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line[2:].removeprefix(" "))
    return "\n".join(lines).strip("\n")


def render_lua(root: Path = ROOT) -> str:
    """Every script under lua/ and lua/include/ with its header, as the file says it."""
    out: list[str] = []
    folders = (("Scripts", root / "lua"), ("Included helpers", root / "lua" / "include"))
    for title, folder in folders:
        out += [f"## {title}", ""]
        for path in sorted(folder.glob("*.lua")):
            rel = path.relative_to(root).as_posix()
            out += [f"### {path.name}", "", f"`{rel}`", "", "```text",
                    lua_header(path.read_text()), "```", ""]
    return "\n".join(out)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Fill the marked reference pages."""
    if OPENAPI_MARK in markdown:
        from rsched.api.openapi import document

        markdown = markdown.replace(OPENAPI_MARK, render_openapi(document()))
    if LUA_MARK in markdown:
        markdown = markdown.replace(LUA_MARK, render_lua())
    return markdown


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    """Publish the OpenAPI document the API serves as reference/openapi.json."""
    from mkdocs.structure.files import File

    from rsched.api.openapi import document

    files.append(File.generated(config, "reference/openapi.json",
                                content=json.dumps(document(), indent=2)))
    return files
