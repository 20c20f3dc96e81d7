// A job's schedule policy (overlap, catch-up window, misfire, version) shown and edited with
// If-Match, the lifecycle fields the job has, and the Backfill action with its confirmation.
// Forms are built once per job version, so the page's refresh never wipes what the user is
// typing.

import { patch, post } from "./api.js";
import { el, time, toast } from "./dom.js";

const OVERLAPS = ["allow", "skip", "bufferOne", "cancelPrevious"];
const MISFIRES = ["run_once", "skip"];
const PREVIEW_MAX = 50; // times listed by a dry run; the count says how many there are
// Job fields the page shows elsewhere; any other field (startAt, endAt, maxRuns, a pause note...)
// is listed as the API gives it, when the job has it.
const SHOWN = new Set(["id", "type", "queue", "status", "payload", "runAt", "cron", "timeZone",
  "nextRunAt", "maxAttempts", "backoff", "priority", "timeoutSeconds", "idempotencyKey", "misfire",
  "jitterSeconds", "lastRunId", "createdAt", "updatedAt", "catchUpWindowSeconds", "lastGap",
  "overlap", "version", "lastRun"]);
const ISO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/;

const label = (name) => name.replace(/([A-Z])/g, " $1").replace(/^./, (c) => c.toUpperCase());

function value(v) {
  if (v === null || v === undefined) return el("span", { class: "muted" }, "—");
  if (typeof v === "string" && ISO.test(v)) return time(v);
  return typeof v === "object" ? el("span", { class: "mono" }, JSON.stringify(v)) : String(v);
}

// A lifecycle field the job does not have: null (no limit set, never paused), or a failure
// streak of 0 on a job that does not pause after failures.
const absent = (job, k) => job[k] === null || job[k] === undefined
  || (k === "deadLetterStreak" && !job[k] && !job.pauseAfterFailures);

// dt/dd pairs of the policy and of every lifecycle field the job has.
export function policyRows(job) {
  const extra = Object.keys(job).filter((k) => !SHOWN.has(k) && !absent(job, k)).sort();
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

// What a backfill does with an occurrence, by the answer's list: [in the counts, on a dry run's
// line per time].
const FATE = { queued: ["queued", "would be queued"], alreadyRun: ["already ran", "already ran"],
  skipped: ["skipped by overlap", "would be skipped by overlap"],
  buffered: ["buffered by overlap", "would be buffered by overlap"] };

// "N would be queued, M already ran[, K skipped by overlap][, B buffered by overlap]"; a real
// backfill's: "N queued, ...".
export function backfillCounts(res) {
  return Object.keys(FATE).filter((k) => res.counts[k] || k === "queued" || k === "alreadyRun")
    .map((k) => `${res.counts[k]} ${k === "queued" && res.dryRun ? FATE.queued[1] : FATE[k][0]}`)
    .join(", ");
}

// Backfill: run the schedule's past occurrences in [from, to) once each.  "Backfill…" is a dry
// run that shows what each occurrence would become; only its confirm button runs the backfill,
// over the range it previewed (editing the range withdraws the confirmation).
export function backfillForm(job) {
  const now = Date.now();
  const from = isoInput("from", now - 3600_000);
  const to = isoInput("to", now);
  // The backfill's own overlap policy: bufferAll (the API's default) runs its occurrences one
  // after another; the job's policies decide each against the job's active run.
  const overlap = el("select", { name: "backfill-overlap", "data-test": "backfill-overlap" },
    ["bufferAll", ...OVERLAPS].map((o) => el("option", { value: o }, o)));
  const out = el("div", { "data-test": "backfill-result" });
  const path = `/jobs/${encodeURIComponent(job.id)}/backfill`;
  let busy = false;

  async function send(body) {
    if (busy) return null;
    busy = true;
    try {
      return await post(path, body);
    } catch (err) {
      out.replaceChildren(el("p", { class: "error", "data-test": "backfill-error" }, err.message));
      return null;
    } finally {
      busy = false;
    }
  }

  function confirmation(res, range) {
    const fate = new Map();
    for (const k of Object.keys(FATE)) for (const t of res[k]) fate.set(t, k);
    const runs = res.counts.queued + res.counts.buffered;
    const go = el("button", { type: "button", "data-test": "backfill-confirm", onclick: async () => {
      const done = await send({ ...range, dryRun: false });
      if (!done) return;
      out.replaceChildren(el("p", { "data-test": "backfill-done" },
        `Done: ${backfillCounts(done)} (of ${done.count})`));
      toast(`Backfill: ${done.counts.queued} run(s) queued`);
    } }, `Queue ${res.counts.queued} run(s)${res.counts.buffered ? `, buffer ${res.counts.buffered}` : ""}`);
    return [
      el("p", { class: "confirm" }, el("b", { "data-test": "backfill-counts" }, backfillCounts(res)),
        ` of ${res.count} occurrence(s) in the range.`),
      el("ol", { class: "preview", "data-test": "backfill-times" },
        res.times.slice(0, PREVIEW_MAX).map((t) => el("li", { "data-fate": fate.get(t) },
          el("span", { class: "mono" }, t), el("span", { class: "muted" }, ` ${FATE[fate.get(t)][1]}`)))),
      res.count > PREVIEW_MAX ? el("p", { class: "muted" }, `… and ${res.count - PREVIEW_MAX} more`) : null,
      runs ? el("div", { class: "actions" }, go, el("button", { type: "button", class: "secondary",
        onclick: () => out.replaceChildren() }, "Dismiss"))
        : el("p", { class: "muted", "data-test": "backfill-nothing" }, "Nothing in this range would run."),
    ].filter(Boolean);
  }

  async function preview() {
    const range = { from: from.value.trim(), to: to.value.trim(), overlap: overlap.value };
    const res = await send({ ...range, dryRun: true });
    if (res) out.replaceChildren(...confirmation(res, range));
  }
  for (const input of [from, to, overlap]) input.addEventListener("input", () => out.replaceChildren());
  return el("section", { class: "panel" }, el("h3", {}, "Backfill"),
    el("p", { class: "muted small" }, "Runs each occurrence in [from, to) once, with its nominal time, "
      + "under the overlap policy chosen (bufferAll: one after another, never beside a run of "
      + "the job); at most 10,000 a call, to not in the future. "
      + "You see what it would do and confirm it first."),
    el("div", { class: "filters" }, el("label", {}, "From ", from), el("label", {}, "To ", to),
      el("label", {}, "Overlap ", overlap),
      el("button", { type: "button", class: "secondary", onclick: preview }, "Backfill…")),
    out);
}
