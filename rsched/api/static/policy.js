// A job's schedule policy (overlap, catch-up window, misfire, version) shown and edited with
// If-Match, its lifecycle fields shown as the API gives them, and the Backfill action with its
// dry-run preview.  Forms are built once per job version, so the page's refresh never wipes
// what the user is typing.

import { patch, post } from "./api.js";
import { el, time, toast } from "./dom.js";

const OVERLAPS = ["allow", "skip", "bufferOne", "cancelPrevious"];
const MISFIRES = ["run_once", "skip"];
const PREVIEW_MAX = 50; // times listed by a dry run; the count says how many there are
// Job fields the page shows elsewhere; any other field (startAt, endAt, maxRuns, a pause note...)
// is listed under Lifecycle as the API gives it.
const SHOWN = new Set(["id", "type", "queue", "status", "payload", "runAt", "cron", "timeZone",
  "nextRunAt", "maxAttempts", "backoff", "priority", "timeoutSeconds", "idempotencyKey", "misfire",
  "jitterSeconds", "lastRunId", "createdAt", "updatedAt", "catchUpWindowSeconds", "lastGap",
  "overlap", "version"]);
const ISO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/;

const label = (name) => name.replace(/([A-Z])/g, " $1").replace(/^./, (c) => c.toUpperCase());

function value(v) {
  if (v === null || v === undefined) return el("span", { class: "muted" }, "—");
  if (typeof v === "string" && ISO.test(v)) return time(v);
  return typeof v === "object" ? el("span", { class: "mono" }, JSON.stringify(v)) : String(v);
}

// dt/dd pairs of the policy and of every lifecycle field the job JSON has.
export function policyRows(job) {
  const extra = Object.keys(job).filter((k) => !SHOWN.has(k)).sort();
  return [
    el("dt", {}, "Overlap"), el("dd", { "data-test": "overlap" }, job.overlap),
    job.cron ? [el("dt", {}, "Catch-up window"),
      el("dd", { "data-test": "catch-up" }, `${job.catchUpWindowSeconds} s`)] : null,
    job.lastGap ? [el("dt", {}, "Last gap"), el("dd", {}, `${job.lastGap.count} skipped, `,
      time(job.lastGap.from), " → ", time(job.lastGap.to))] : null,
    el("dt", {}, "Version"), el("dd", { "data-test": "version" }, job.version),
    extra.map((k) => [el("dt", { "data-test": `life-${k}` }, label(k)), el("dd", {}, value(job[k]))]),
  ];
}

function select(name, options, current) {
  return el("select", { name }, options.map((o) => el("option", { value: o, selected: o === current }, o)));
}

// The policy editor: PATCH at the shown version; a 412 says the job changed meanwhile.
export function policyForm(job, saved) {
  const overlap = select("overlap", OVERLAPS, job.overlap);
  const misfire = select("misfire", MISFIRES, job.misfire);
  const window = el("input", { name: "catchUpWindowSeconds", type: "number", min: 0, step: "any",
    value: job.catchUpWindowSeconds, class: "narrow" });
  const form = el("form", { class: "policy", "data-test": "policy-form", onsubmit: async (e) => {
    e.preventDefault();
    try {
      const got = await patch(`/jobs/${encodeURIComponent(job.id)}`, { overlap: overlap.value,
        misfire: misfire.value, catchUpWindowSeconds: Number(window.value) }, job.version);
      toast(`Saved: version ${got.version}`);
      saved(got);
    } catch (err) {
      toast(err.status === 412 ? "The job changed meanwhile: reload it and try again"
        : `save failed: ${err.message}`, "bad");
    }
  } },
  el("label", {}, "Overlap ", overlap), el("label", {}, "Misfire ", misfire),
  el("label", {}, "Catch-up window (s) ", window),
  el("button", { type: "submit" }, "Save policy"));
  return el("section", { class: "panel" }, el("h3", {}, "Schedule policy"),
    el("p", { class: "muted small" }, `Saved only if the job is still at version ${job.version}.`), form);
}

const isoInput = (name, ms) => el("input", { name, class: "mono wide", value: new Date(ms).toISOString() });

// Backfill: run the schedule's past occurrences in [from, to) once each; Preview is a dry run.
export function backfillForm(job) {
  const now = Date.now();
  const from = isoInput("from", now - 3600_000);
  const to = isoInput("to", now);
  const out = el("div", { "data-test": "backfill-result" });
  async function send(dryRun) {
    try {
      const res = await post(`/jobs/${encodeURIComponent(job.id)}/backfill`,
        { from: from.value.trim(), to: to.value.trim(), dryRun });
      out.replaceChildren(...(dryRun ? [
        el("p", {}, `${res.count} occurrence(s) in the range (one that has a run already is not run again):`),
        el("ol", { class: "preview", "data-test": "backfill-times" },
          res.times.slice(0, PREVIEW_MAX).map((t) => el("li", { class: "mono" }, t))),
        res.count > PREVIEW_MAX ? el("p", { class: "muted" }, `… and ${res.count - PREVIEW_MAX} more`) : null,
      ] : [el("p", { "data-test": "backfill-counts" }, `${res.queued.length} queued, `
        + `${res.alreadyRun.length} already run, ${res.skipped.length} skipped, `
        + `${res.buffered.length} buffered (of ${res.count})`)]).filter(Boolean));
      if (!dryRun) toast(`Backfill: ${res.queued.length} run(s) queued`);
    } catch (err) {
      out.replaceChildren(el("p", { class: "error" }, err.message));
    }
  }
  return el("section", { class: "panel" }, el("h3", {}, "Backfill"),
    el("p", { class: "muted small" }, "Runs each occurrence in [from, to) once, with its nominal time, "
      + "under the job's overlap policy; at most 10,000 a call, to not in the future."),
    el("div", { class: "filters" }, el("label", {}, "From ", from), el("label", {}, "To ", to),
      el("button", { type: "button", class: "secondary", onclick: () => send(true) }, "Preview"),
      el("button", { type: "button", onclick: () => send(false) }, "Backfill")),
    out);
}
