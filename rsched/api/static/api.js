// The HTTP API, with the user's key as a Bearer token (kept in this browser's localStorage).

const KEY = "rsched.apiKey";  // the /docs page (rsched/api/docs.py) keeps it under this name too
// The API serves the dashboard at <base>/ui/: every API path is relative to <base>.
export const BASE = location.pathname.replace(/\/ui(\/.*)?$/, "");

export class ApiError extends Error {
  constructor(status, body) {
    const detail = body && typeof body === "object" ? body.detail || body.title : body;
    super(detail || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

export function getKey() { return localStorage.getItem(KEY) || ""; }
export function setKey(key) {
  if (key) localStorage.setItem(KEY, key); else localStorage.removeItem(KEY);
}

function authHeaders(extra) {
  const headers = { ...extra };
  const key = getKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

async function request(method, path, body, accept = "application/json", extra = {}) {
  const headers = authHeaders({ Accept: accept, ...extra });
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(BASE + path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let data = text;
  if (text && (res.headers.get("content-type") || "").includes("json")) {
    try { data = JSON.parse(text); } catch { /* keep the text */ }
  }
  if (!res.ok) {
    if (res.status === 401) window.dispatchEvent(new CustomEvent("rsched:unauthorized"));
    throw new ApiError(res.status, data);
  }
  return data;
}

export const get = (path) => request("GET", path);
export const post = (path, body) => request("POST", path, body);
export const put = (path, body) => request("PUT", path, body);
export const del = (path) => request("DELETE", path);
// A change of a job at the version the page showed: 412 when it changed meanwhile.
export const patch = (path, body, version) =>
  request("PATCH", path, body, "application/json", { "If-Match": String(version) });
export const metricsText = () => request("GET", "/metrics", undefined, "text/plain");

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : "";
}

// One Server-Sent Events stream read with fetch(), not EventSource (which cannot send the
// Authorization header): calls onEvent(name, data) for each event until the stream ends or
// ``signal`` aborts; resolves with the last event id (for Last-Event-ID on a reconnect).
export async function sse(path, onEvent, signal, lastId = null) {
  const res = await fetch(BASE + path, { signal, headers: authHeaders({ Accept: "text/event-stream",
    ...(lastId ? { "Last-Event-ID": lastId } : {}) }) });
  if (!res.ok) {
    if (res.status === 401) window.dispatchEvent(new CustomEvent("rsched:unauthorized"));
    throw new ApiError(res.status, await res.text());
  }
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "", name = "message", data = [], id = lastId;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return id;
    buf += value;
    let nl;
    while ((nl = buf.search(/\r\n|\r|\n/)) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + (buf.startsWith("\r\n", nl) ? 2 : 1));
      if (line === "") {  // a blank line ends an event
        if (data.length) onEvent(name, JSON.parse(data.join("\n")));
        name = "message";
        data = [];
        continue;
      }
      if (line.startsWith(":")) continue;  // a keep-alive comment
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const v = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") name = v;
      else if (field === "data") data.push(v);
      else if (field === "id") id = v;
    }
  }
}
