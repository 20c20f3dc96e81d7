// Small DOM and formatting helpers: every text goes in as a text node, never as HTML.

export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    // Through the CSSOM: the Content-Security-Policy refuses style attributes set as markup.
    else if (k === "style") node.style.cssText = String(v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

const pad = (n, w = 2) => String(n).padStart(w, "0");

// Local wall time, with the UTC instant as a tooltip.
export function time(iso) {
  if (!iso) return el("span", { class: "muted" }, "—");
  const d = new Date(iso);
  const text = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return el("time", { datetime: iso, title: iso }, text);
}

const FAR_S = 7 * 86400; // beyond a week a date reads better than "in 1123.2 d"

// A time further than a week from ``now``: relative() gives its date.
export function far(iso, now = Date.now()) {
  return Boolean(iso) && Math.abs(new Date(iso).getTime() - now) / 1000 >= FAR_S;
}

// "in 12 s" / "3 min ago" / "2.5 d ago"; beyond a week the local date ("2030-01-01", its time
// in time()); ``past`` reads a time a clock skew put in the future as now.
export function relative(iso, now = Date.now(), past = false) {
  if (!iso) return "—";
  const d = new Date(iso);
  let s = Math.round((d.getTime() - now) / 1000);
  if (past && s > 0) s = 0;
  if (s === 0) return "just now";
  const a = Math.abs(s);
  if (a >= FAR_S) return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
  const text = a < 60 ? `${a} s` : a < 3600 ? `${Math.round(a / 60)} min`
    : a < 86400 ? `${(a / 3600).toFixed(1)} h` : `${(a / 86400).toFixed(1)} d`;
  return s >= 0 ? `in ${text}` : `${text} ago`;
}

export function duration(ms) {
  if (ms === null || ms === undefined) return "—";
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

export function seconds(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return "—";
  return s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(s < 10 ? 2 : 1)} s`;
}

export function badge(status) {
  return el("span", { class: `status s-${status}`, "data-status": status }, status);
}

export function table(headers, rows, empty = "Nothing here.") {
  if (!rows.length) return el("p", { class: "empty" }, empty);
  return el("table", {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

let toastTimer = null;
export function toast(message, kind = "ok") {
  const t = document.getElementById("toast");
  t.textContent = message;
  t.className = `toast ${kind}`;
  t.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { t.hidden = true; }, 4000);
}
