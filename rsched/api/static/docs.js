// /docs (rsched/api/docs.py): renders /openapi.json, with a form to send each operation.
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
      out.textContent = `${res.status} ${res.statusText}\n${shown}`;
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
