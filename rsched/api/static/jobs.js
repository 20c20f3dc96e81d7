// Jobs: a filtered list, and a job's page with its schedule, payload, runs and controls.

import { ApiError, get, post, query } from "./api.js";
import { badge, clear, duration, el, far, relative, table, time, toast } from "./dom.js";
import { backfillForm, policyForm, policyRows } from "./policy.js";
import { followJob, newer, progressView } from "./progress.js";

const STATUSES = ["scheduled", "paused", "completed", "dead", "cancelled"];
const REFRESH_MS = 3000;
const CONFIRM_MS = 5000; // how long "Really cancel?" waits for its second click

function schedule(job) {
  return job.cron ? el("span", { class: "mono" }, `${job.cron}`, el("span", { class: "muted" }, ` ${job.timeZone}`))
    : el("span", {}, "once at ", time(job.runAt || job.createdAt));
}

const LAST_RUNS = ["failed", "dead", "succeeded"];

function lastRun(j) {
  const lr = j.lastRun;
  if (!lr || !lr.status) return el("span", { class: "muted" }, "—");
  return el("span", { class: "nowrap" }, badge(lr.status), " ",
    lr.at ? el("span", { class: "muted small", title: lr.at }, relative(lr.at, Date.now(), true)) : null);
}

function streak(j) {
  const lr = j.lastRun;
  if (!lr || !lr.failureStreak) return "";
  return el("span", { class: "streak", title: "Finished runs in a row whose last attempt failed" },
    `${lr.failureStreak}${lr.streakCapped ? "+" : ""} in a row`);
}

const SORTS = [["created", "newest first"], ["nextRun", "next run first"], ["lastRun", "latest run first"]];

// Filters, search and sort read the archive's job index (sorted, every page full); without an
// archive the API scans Redis instead and says so (indexed: false), shown as a notice.
export function jobList(main, params) {
  const f = { status: params.get("status") || "", type: params.get("type") || "", queue: params.get("queue") || "",
    lastRun: params.get("lastRun") || "", q: params.get("q") || "", sort: params.get("sort") || "created" };
  const statusSel = el("select", { name: "status" }, el("option", { value: "" }, "any status"),
    STATUSES.map((s) => el("option", { value: s, selected: s === f.status }, s)));
  const lastSel = el("select", { name: "lastRun" }, el("option", { value: "" }, "any last run"),
    LAST_RUNS.map((s) => el("option", { value: s, selected: s === f.lastRun }, `last run ${s}`)));
  const sortSel = el("select", { name: "sort", title: "Order of the list (from the job index)" },
    SORTS.map(([v, label]) => el("option", { value: v, selected: v === f.sort }, label)));
  const typeIn = el("input", { name: "type", placeholder: "type", value: f.type });
  const queueIn = el("input", { name: "queue", placeholder: "queue", value: f.queue });
  const qIn = el("input", { name: "q", type: "search", class: "wide", value: f.q,
    placeholder: "search: id, type or idempotency key starts with…" });
  const idIn = el("input", { name: "id", placeholder: "job id", class: "mono wide" });
  const apply = (e) => {
    e.preventDefault();
    location.hash = "#/jobs" + query({ q: qIn.value.trim(), status: statusSel.value, lastRun: lastSel.value,
      type: typeIn.value.trim(), queue: queueIn.value.trim(), sort: sortSel.value === "created" ? "" : sortSel.value });
  };
  const filters = el("form", { class: "filters", onsubmit: apply },
    qIn, statusSel, lastSel, typeIn, queueIn, sortSel, el("button", { type: "submit" }, "Filter"));
  sortSel.addEventListener("change", apply);
  const search = el("form", { class: "filters", onsubmit: async (e) => {
    e.preventDefault();
    const id = idIn.value.trim();
    if (!id) return;
    try {
      await get(`/jobs/${encodeURIComponent(id)}`);
      location.hash = `#/jobs/${encodeURIComponent(id)}`;
    } catch (err) {
      toast(err.status === 404 ? `No job ${id}` : err.message, "bad");
    }
  } }, idIn, el("button", { type: "submit" }, "Open"));
  const notice = el("p", { class: "notice", "data-test": "index-notice", hidden: true });
  const list = el("div", { class: "panel" }, el("p", { class: "muted" }, "Loading…"));
  const more = el("button", { class: "secondary", hidden: true }, "Load more");
  clear(main).append(el("h1", {}, "Jobs"), el("div", { class: "toolbar" }, filters, search), notice, list, more);

  // The pages loaded so far, by the cursor each was read with; a refresh reads them again.
  let rows = [], pages = [null], next = null, busy = false, stopped = false, indexed = true;
  function render() {
    // An indexed list comes in the order asked; a scan in none: newest first here.
    const sorted = indexed ? rows : [...rows].sort((a, b) => (b.createdAt || "").localeCompare(a.createdAt || ""));
    clear(list).append(table(["Job", "Type", "Queue", "Status", "Last run", "Failing", "Schedule", "Next run"],
      sorted.map((j) => el("tr", { "data-job": j.id },
        el("td", {}, el("a", { class: "mono", href: `#/jobs/${encodeURIComponent(j.id)}` }, j.id)),
        el("td", {}, j.type), el("td", {}, j.queue), el("td", {}, badge(j.status)),
        el("td", { "data-test": "last-run" }, lastRun(j)),
        el("td", { "data-test": "streak" }, streak(j)),
        el("td", {}, schedule(j)),
        el("td", {}, j.nextRunAt ? el("span", { title: j.nextRunAt }, relative(j.nextRunAt)) : "—"))),
      "No job matches these filters."));
  }
  function explain(page) {
    indexed = page.indexed;
    qIn.disabled = !indexed && !f.q;
    if (indexed) {
      notice.hidden = false;
      notice.className = "muted small";
      clear(notice).append(`Sorted ${SORTS.find(([v]) => v === page.sort)[1]}, from the job index, up to date until `,
        time(page.indexedUntil), ".");
    } else {
      notice.hidden = false;
      notice.className = "notice";
      clear(notice).append("No run-history archive is configured, so there is no job index: jobs are listed by " +
        "scanning Redis, in no order, and a filtered page may hold few or none of the matches " +
        "(search and sorting need the archive: RSCHED_ARCHIVE_URL).");
    }
  }
  async function load() {
    if (busy) return;
    busy = true;
    try {
      const got = [];
      let cursor = null, first = null;
      for (const at of pages) {
        const page = await get("/jobs" + query({ ...f, limit: 100, cursor: at }));
        first = first || page;
        got.push(...page.jobs);
        cursor = page.nextCursor;
        if (!cursor) break;
      }
      if (stopped) return;
      explain(first);
      const seen = new Set();
      rows = got.filter((j) => !seen.has(j.id) && seen.add(j.id));
      next = cursor;
      more.hidden = !next;
      render();
    } catch (err) {
      clear(list).append(el("p", { class: "error" }, err.message));
    } finally {
      busy = false;
    }
  }
  more.addEventListener("click", () => { if (next) { pages.push(next); load(); } });
  load();
  const timer = setInterval(load, REFRESH_MS);
  return () => { stopped = true; clearInterval(timer); };
}

// An attempt's error: its first line, and the traceback under it when opened.
function errorText(error) {
  const [first, ...rest] = error.split("\n");
  if (!rest.length) return el("pre", { class: "err" }, error);
  return el("details", { class: "more" }, el("summary", {}, el("pre", { class: "err" }, first)),
    el("pre", { class: "err full" }, error));
}

// A run's status: its newest attempt's, or dead while it is a dead letter.
const runStatus = (a) => (a.deadLettered ? "dead" : a.status);

// Runs the overlap policy or a limit kept from running: their error field says why, which is no
// failure ("waiting for limit tenant-42").
const NOT_RUN = new Set(["skipped", "buffered", "cancelled", "waiting"]);

function reason(a) {
  if (!a.error) return null;
  return NOT_RUN.has(a.status) ? el("p", { class: "reason", "data-test": "reason" }, a.error) : errorText(a.error);
}

// Attempts grouped by run (one occurrence), newest first, as a timeline; a dead run offers
// Replay (``replay`` is null for a key that may not); a running attempt shows its progress, the
// newer of what the run had and what ``live`` (run id -> report) got from the events stream.
// An HTTP target's attempt: its response status and latency (the result of a success), or the
// status its error starts with ("HTTP 503 from POST ...").
function httpCell(a) {
  const r = a.result;
  if (r && typeof r.status === "number") {
    return el("span", { class: "mono small", "data-test": "http-status" }, ` · HTTP ${r.status} in ${r.latencyMs} ms`);
  }
  const m = /^HTTP (\d{3}) /.exec(a.error || "");
  return m ? el("span", { class: "mono small", "data-test": "http-status" }, ` · HTTP ${m[1]}`) : null;
}

function timeline(runs, replay, live, http) {
  const groups = [];
  for (const a of runs) {
    const g = groups.find((x) => x.runId === a.runId);
    if (g) g.attempts.push(a); else groups.push({ runId: a.runId, attempts: [a] });
  }
  if (!groups.length) return el("p", { class: "empty" }, "No run yet.");
  return el("ol", { class: "timeline" }, groups.map((g) => {
    const final = g.attempts[0];
    const status = runStatus(final);
    return el("li", { class: `t-${status}`, "data-run": g.runId },
      el("div", { class: "t-head" }, badge(status), " ",
        el("span", { class: "mono small" }, g.runId), " ",
        el("span", { class: "muted" }, "scheduled ", time(final.scheduledAt)),
        status === "dead" && replay ? [" ", el("button", { class: "small", onclick: () => replay(g.runId) }, "Replay")] : null),
      el("ul", { class: "attempts" }, g.attempts.map((a) => el("li", {},
        el("span", { class: "attempt" }, `#${a.attempt}`), " ", badge(a.status), " ",
        a.startedAt || !NOT_RUN.has(a.status) ? [el("span", { class: "muted" }, "started "), time(a.startedAt)]
          : el("span", { class: "muted" }, "not started"),
        a.durationMs !== null ? el("span", { class: "muted" }, ` · ${duration(a.durationMs)}`) : null,
        http ? httpCell(a) : null,
        a.worker ? el("span", { class: "muted mono small" }, ` · ${a.worker}`) : null,
        reason(a),
        a.status === "running" && newer(a.progress, live.get(a.runId))
          ? progressView(a.runId, newer(a.progress, live.get(a.runId))) : null,
        a.result !== null && a.result !== undefined
          ? el("pre", { class: "result", title: "The handler's result" }, JSON.stringify(a.result, null, 2)) : null))));
  }));
}

function strip(runs) {
  const seen = new Map();
  for (const a of runs) if (!seen.has(a.runId)) seen.set(a.runId, a);
  const last = [...seen.values()].slice(0, 40).reverse();
  return el("div", { class: "strip", title: "Latest runs, oldest left" },
    last.map((a) => el("span", { class: `cell c-${runStatus(a)}`, title: `${a.runId}: ${runStatus(a)}` })));
}

export function jobPage(main, id, session) {
  const head = el("div", { class: "jobhead" });
  const body = el("div", { class: "two" });
  const runsBox = el("section", { class: "panel" }, el("h3", {}, "Runs"));
  // The policy editor and Backfill: rebuilt only when the job's version changes (see policy.js).
  const tools = el("div", { class: "tools" });
  clear(main).append(el("p", {}, el("a", { href: "#/jobs" }, "← Jobs")), head, body, tools, runsBox);
  let stopped = false, busy = false, confirmCancel = false, disarm = null, toolsAt = null, bf = null;
  const live = new Map();  // run id -> its latest progress from the events stream

  function showTools(job) {
    if (!job.cron || !session.can("write") || toolsAt === job.version) return;
    toolsAt = job.version;
    bf = bf || backfillForm(job);  // built once: its range and result stay
    clear(tools).append(policyForm(job, () => refresh()), bf);
  }

  async function replay(runId) {
    try {
      await post(`/dead-letters/${encodeURIComponent(runId)}/replay`);
      toast(`Replayed ${runId}`);
      await refresh();
    } catch (err) {
      toast(`replay failed: ${err.message}`, "bad");
    }
  }

  async function act(name) {
    if (busy) return;
    busy = true;
    try {
      const res = await post(`/jobs/${encodeURIComponent(id)}/${name}`);
      toast(name === "trigger" ? `Triggered run ${res.runId}` : `Job ${res.status}`);
      await refresh();
    } catch (err) {
      toast(`${name} failed: ${err.message}`, "bad");
    } finally {
      busy = false;
    }
  }

  function buttons(job) {
    if (!session.can("write")) return el("span", { class: "muted small" }, "read-only key");
    const b = [];
    if (job.status === "scheduled") b.push(el("button", { onclick: () => act("pause") }, "Pause"));
    if (job.status === "paused") b.push(el("button", { onclick: () => act("resume") }, "Resume"));
    if (job.status !== "cancelled") b.push(el("button", { class: "secondary", onclick: () => act("trigger") }, "Trigger now"));
    if (job.status === "scheduled" || job.status === "paused") {
      b.push(el("button", { class: "danger", onclick: (e) => {
        if (!confirmCancel) {
          // Armed for CONFIRM_MS: a prompt left alone disarms, and the page refreshes again.
          confirmCancel = true;
          e.target.textContent = "Really cancel?";
          disarm = setTimeout(() => { confirmCancel = false; refresh(); }, CONFIRM_MS);
          return;
        }
        clearTimeout(disarm);
        confirmCancel = false;
        act("cancel");
      } }, "Cancel"));
    }
    return el("div", { class: "actions" }, b);
  }

  async function refresh() {
    let job;
    try {
      job = await get(`/jobs/${encodeURIComponent(id)}`);
    } catch (err) {
      clear(head).append(el("h1", {}, "Job"), el("p", { class: "error" },
        err instanceof ApiError && err.status === 404 ? `No job ${id}` : err.message));
      return;
    }
    const [runs, preview] = await Promise.allSettled([
      get(`/jobs/${encodeURIComponent(id)}/runs?limit=100`),
      job.cron && job.status === "scheduled"
        ? get("/schedules/preview" + query({ cron: job.cron, timeZone: job.timeZone, count: 5 }))
        : Promise.resolve(null),
    ]);
    if (stopped) return;
    clear(head).append(
      el("h1", {}, el("span", { class: "mono" }, job.id), " ", badge(job.status)),
      el("p", { class: "muted" }, `${job.type} on queue ${job.queue}`),
      buttons(job));
    const next = preview.status === "fulfilled" && preview.value ? preview.value.times : null;
    clear(body).append(
      el("section", { class: "panel" }, el("h3", {}, "Schedule"),
        el("dl", {},
          job.target ? [el("dt", {}, "Target"), el("dd", { class: "mono", "data-test": "target" },
            `${job.target.method} ${job.target.url}`)] : null,
          el("dt", {}, "Schedule"), el("dd", {}, schedule(job)),
          el("dt", {}, "Next run"), el("dd", { "data-test": "next-run" }, job.nextRunAt
            ? [time(job.nextRunAt), far(job.nextRunAt) ? null : ` (${relative(job.nextRunAt)})`] : "—"),
          el("dt", {}, "Attempts"), el("dd", {}, `up to ${job.maxAttempts}, backoff ${job.backoff.baseSeconds} s → ${job.backoff.capSeconds} s`),
          el("dt", {}, "Timeout"), el("dd", {}, `${job.timeoutSeconds} s`),
          el("dt", {}, "Misfire"), el("dd", { "data-test": "misfire" }, job.misfire),
          policyRows(job),
          el("dt", {}, "Priority"), el("dd", {}, job.priority),
          job.idempotencyKey ? [el("dt", {}, "Idempotency key"), el("dd", { class: "mono" }, job.idempotencyKey)] : null,
          el("dt", {}, "Created"), el("dd", {}, time(job.createdAt))),
        next ? [el("h4", {}, `Next runs (${job.timeZone})`), el("ol", { class: "preview" },
          next.map((t) => el("li", {}, el("span", { class: "mono" }, t.local.replace("T", " ")),
            el("span", { class: "muted small" }, `  ${t.utc}`))))] : null),
      el("section", { class: "panel" }, el("h3", {}, "Payload"),
        el("pre", { class: "payload" }, JSON.stringify(job.payload, null, 2))));
    showTools(job);
    clear(runsBox).append(el("h3", {}, "Runs"));
    if (runs.status === "fulfilled") {
      runsBox.append(strip(runs.value.runs), timeline(runs.value.runs, session.can("admin") ? replay : null, live, !!job.target));
    }
    else runsBox.append(el("p", { class: "error" }, runs.reason.message));
  }
  // A progress event redraws its run's bar in place; any other event (a run started or ended)
  // reads the page again, as does a report of a run the page does not show running yet.
  function onProgress(runId, p) {
    live.set(runId, newer(live.get(runId), p));
    const shown = [...runsBox.querySelectorAll("[data-test=progress]")].find((n) => n.dataset.run === runId);
    if (shown) shown.replaceWith(progressView(runId, live.get(runId)));
    else if (!busy && !confirmCancel) refresh();
  }
  const unfollow = followJob(id, onProgress, () => { if (!busy && !confirmCancel) refresh(); });
  refresh();
  const timer = setInterval(() => { if (!busy && !confirmCancel) refresh(); }, REFRESH_MS);
  return () => { stopped = true; unfollow(); clearInterval(timer); clearTimeout(disarm); };
}
