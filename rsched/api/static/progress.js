// A running run's progress (its handler's ctx.progress: value, message, at), kept live from the
// job's Server-Sent Events stream: each 'progress' event carries the run's latest report.

import { sse } from "./api.js";
import { el } from "./dom.js";

const RECONNECT_MS = 1000;

// A number from 0 to 100 as a bar; any other value (an object or a list) as compact JSON.
export function progressView(runId, p) {
  const bar = typeof p.value === "number";
  return el("div", { class: "progress", "data-test": "progress", "data-run": runId, "data-at": p.at },
    bar ? el("progress", { max: 100, value: p.value, title: `${p.value}%` }) : null,
    bar ? el("span", { class: "num", "data-test": "progress-value" }, `${Math.round(p.value * 10) / 10}%`)
      : el("code", { "data-test": "progress-json" }, JSON.stringify(p.value)),
    p.message ? el("span", { "data-test": "progress-message" }, p.message) : null);
}

// The newer of two reports of a run (either may be null).
export function newer(a, b) {
  if (!a) return b;
  if (!b) return a;
  return (b.at || "") > (a.at || "") ? b : a;
}

// Follows GET /jobs/{id}/events until the returned function is called: onProgress(runId,
// progress) for each progress event, onOther(name) for any other event; a stream that ends or
// fails is read again from its last event id.
export function followJob(jobId, onProgress, onOther) {
  const abort = new AbortController();
  let lastId = null;
  const onEvent = (name, data) => {
    if (data && data.id) lastId = data.id;
    if (name === "progress" && data.progress) onProgress(data.runId, data.progress);
    else onOther(name);
  };
  (async () => {
    while (!abort.signal.aborted) {
      try {
        lastId = await sse(`/jobs/${encodeURIComponent(jobId)}/events`, onEvent, abort.signal, lastId);
      } catch { /* dropped, refused or aborted: read again unless aborted */ }
      if (!abort.signal.aborted) await new Promise((done) => setTimeout(done, RECONNECT_MS));
    }
  })();
  return () => abort.abort();
}
