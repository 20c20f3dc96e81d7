"""/docs: a self-contained page (no CDN; the machine may be offline) that renders
/openapi.json and sends requests from a form for each operation."""

DOCS_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rsched API</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:14px 24px;display:flex;gap:16px;align-items:center}
header h1{font-size:18px;margin:0}header input{flex:1;max-width:420px;padding:6px 8px}
main{max-width:1000px;margin:0 auto;padding:16px 24px}
details{background:#fff;border:1px solid #d8dce3;border-radius:6px;margin:8px 0}
summary{cursor:pointer;padding:10px 12px;display:flex;gap:10px;align-items:baseline}
.m{font:bold 12px monospace;padding:2px 6px;border-radius:4px;color:#fff;min-width:52px;
text-align:center}.get{background:#2f7d4f}.post{background:#2a5db0}.patch{background:#a8661b}
.delete{background:#b0392a}.path{font-family:monospace;font-weight:600}
.body{padding:0 12px 12px}label{display:block;margin:6px 0 2px;font-weight:600}
input.p,textarea{width:100%;box-sizing:border-box;font:13px monospace;padding:5px}
textarea{min-height:110px}pre{background:#f0f2f5;padding:8px;overflow:auto;max-height:360px}
button{margin-top:8px;padding:6px 14px}.scope{color:#6b7280;font-size:12px}
h2{margin:22px 0 4px;font-size:15px;text-transform:capitalize}
</style></head><body>
<header><h1>rsched API</h1>
<input id="key" placeholder="API key (Bearer), kept in this browser" autocomplete="off">
<a href="openapi.json" style="color:#9cc3ff">openapi.json</a></header>
<main id="ops">Loading openapi.json...</main>
<script>
"use strict";
const keyBox = document.getElementById("key");
// The dashboard's name for it (static/api.js), so a key pasted in either is there in the other.
const KEY = "rsched.apiKey";
keyBox.value = localStorage.getItem(KEY) || "";
keyBox.addEventListener("change", () => {
  const key = keyBox.value.trim();
  if (key) localStorage.setItem(KEY, key); else localStorage.removeItem(KEY);
});
const el = (tag, attrs, ...kids) => {
  const e = document.createElement(tag);
  Object.entries(attrs || {}).forEach(([k, v]) => k === "class" ? e.className = v : e[k] = v);
  kids.forEach(k => e.append(k));
  return e;
};
function example(schema, doc, depth) {
  if (depth > 4 || !schema) return null;
  if (schema.$ref) {
    return example(doc.components.schemas[schema.$ref.split("/").pop()], doc, depth + 1);
  }
  const t = Array.isArray(schema.type) ? schema.type[0] : schema.type;
  if (schema.enum) return schema.enum[0];
  if (t === "object") {
    const out = {};
    (schema.required || Object.keys(schema.properties || {}).slice(0, 3)).forEach(k => {
      out[k] = example((schema.properties || {})[k], doc, depth + 1);
    });
    return out;
  }
  if (t === "string" && schema.format === "date-time") {
    return new Date(Date.now() + 60000).toISOString();
  }
  if (t === "string") return "example";
  if (t === "integer" || t === "number") return schema.minimum || 1;
  if (t === "boolean") return false;
  if (t === "array") return [];
  return null;
}
function operation(doc, path, method, op) {
  const params = op.parameters || [];
  const inputs = {};
  const form = el("div", {class: "body"}, el("p", {}, op.description || ""));
  params.forEach(p => {
    form.append(el("label", {}, `${p.name} (${p.in}${p.required ? ", required" : ""})`));
    inputs[p.name] = el("input", {class: "p", placeholder: p.description || ""});
    form.append(inputs[p.name]);
  });
  let body = null;
  const media = op.requestBody && op.requestBody.content["application/json"];
  if (media) {
    form.append(el("label", {}, "body (JSON)"));
    body = el("textarea", {value: JSON.stringify(example(media.schema, doc, 0), null, 2)});
    form.append(body);
  }
  const out = el("pre", {});
  const send = el("button", {}, "Send");
  send.onclick = async () => {
    let url = path;
    const q = new URLSearchParams();
    params.forEach(p => {
      const v = inputs[p.name].value;
      if (p.in === "path") url = url.replace(`{${p.name}}`, encodeURIComponent(v));
      else if (v !== "") q.append(p.name, v);
    });
    const headers = {"Content-Type": "application/json"};
    if (keyBox.value) headers.Authorization = "Bearer " + keyBox.value;
    const qs = q.toString();
    try {
      const res = await fetch(url + (qs ? "?" + qs : ""), {method: method.toUpperCase(), headers,
        body: body ? body.value : undefined});
      const text = await res.text();
      let shown = text;
      try { shown = JSON.stringify(JSON.parse(text), null, 2); } catch (e) {}
      out.textContent = `${res.status} ${res.statusText}\\n${shown}`;
    } catch (e) { out.textContent = String(e); }
  };
  form.append(send, out);
  const codes = Object.keys(op.responses || {}).join(" ");
  return el("details", {}, el("summary", {},
    el("span", {class: "m " + method}, method.toUpperCase()), el("span", {class: "path"}, path),
    el("span", {}, op.summary || ""), el("span", {class: "scope"}, codes)), form);
}
fetch("openapi.json").then(r => r.json()).then(doc => {
  const root = document.getElementById("ops");
  root.textContent = "";
  root.append(el("p", {}, doc.info.description));
  const byTag = {};
  Object.entries(doc.paths).forEach(([path, ops]) => Object.entries(ops).forEach(([m, op]) => {
    const tag = (op.tags || ["other"])[0];
    (byTag[tag] = byTag[tag] || []).push(operation(doc, path, m, op));
  }));
  Object.entries(byTag).forEach(([tag, els]) => root.append(el("h2", {}, tag), ...els));
}).catch(e => { document.getElementById("ops").textContent = "cannot load openapi.json: " + e; });
</script></body></html>
"""
