// Overview: throughput, start lag and backlog charts (the API's samples of the last hour, then
// live); partitions, workers and queues.

import { get, metricsText } from "./api.js";
import { draw, parseMetrics, record, seed, series, syncClock } from "./charts.js";
import { clear, el, relative, seconds, table } from "./dom.js";

const COLORS = { started: "#2563eb", succeeded: "#16a34a", failed: "#dc2626",
  p50: "#16a34a", p95: "#d97706", p99: "#dc2626", due: "#2563eb", retry: "#d97706", oldest: "#7c3aed" };
const POLL_MS = 2000;
const MEMORY_EVERY_MS = 30_000; // the memory projection: read in two round trips, changes slowly
const MB = (bytes) => (bytes / 1e6).toFixed(1);

function last(points) {
  for (let i = points.length - 1; i >= 0; i--) if (points[i][1] !== null) return points[i][1];
  return null;
}

// format: the legend's values; unit: the y axis's (charts.axisLabel).
function chart(title, id, keys, format, unit, integer = false) {
  const legend = el("div", { class: "legend" });
  const canvas = el("canvas", { id, height: 160 });
  const box = el("section", { class: "panel chart" }, el("h3", {}, title), legend, canvas);
  return {
    box,
    update(s) {
      const lines = keys.map(([k, label]) => ({ label, color: COLORS[k], points: s[k] }));
      clear(legend).append(...lines.map((l) => el("span", { class: "key" },
        el("i", { style: `background:${l.color}` }), `${l.label} `,
        el("b", { "data-series": l.label }, last(l.points) === null ? "—" : format(last(l.points))))));
      draw(canvas, lines, unit, integer);
    },
  };
}

function card(label, value, { warn = false, href = null, test = null } = {}) {
  const v = el("div", { class: "value", "data-test": test }, value);
  const body = [el("div", { class: "label" }, label), v];
  return href ? el("a", { class: `card${warn ? " warn" : ""}`, href }, body)
    : el("div", { class: `card${warn ? " warn" : ""}` }, body);
}

const perSecond = (v) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)) + "/s";
const count = (v) => (v >= 10 ? v.toFixed(0) : Number(v.toFixed(1)).toString());

export function overview(main) {
  const cards = el("div", { class: "cards" });
  const charts = [
    chart("Throughput (runs per second)", "chart-throughput",
      [["started", "started"], ["succeeded", "succeeded"], ["failed", "failed"]], perSecond, "rate"),
    chart("Start lag (meant to start → started)", "chart-lag",
      [["p50", "p50"], ["p95", "p95"], ["p99", "p99"]], seconds, "seconds"),
    chart("Backlog (due, not yet dispatched)", "chart-backlog",
      [["due", "jobs due"], ["retry", "retries due"]], count, "count", true),
  ];
  const parts = el("section", { class: "panel" }, el("h3", {}, "Partitions"), el("p", { class: "muted" }, "Loading…"));
  const workers = el("section", { class: "panel" }, el("h3", {}, "Workers"), el("p", { class: "muted" }, "Loading…"));
  const queues = el("section", { class: "panel" }, el("h3", {}, "Queues"), el("p", { class: "muted" }, "Loading…"));
  const waiting = el("section", { class: "panel", hidden: true, "data-test": "waiting-for-handler" });
  const memory = el("section", { class: "panel", "data-test": "memory" }, el("h3", {}, "Redis memory, projected"),
    el("p", { class: "muted" }, "Loading…"));
  const error = el("p", { class: "error", hidden: true });
  clear(main).append(el("h1", {}, "Overview"), error, cards,
    el("div", { class: "charts" }, charts.map((c) => c.box)),
    el("div", { class: "two" }, parts, el("div", {}, workers, waiting, queues, memory)));

  // What Redis's memory comes to (GET /memory, as `rsched doctor` lists it; docs/memory.md).
  function renderMemory(m) {
    clear(memory).append(el("h3", {}, "Redis memory, projected"), table(
      ["Part", "MB", "How"],
      m.parts.map((p) => el("tr", { "data-memory": p.part },
        el("td", {}, p.part), el("td", { class: "num" }, MB(p.bytes)),
        el("td", { class: "muted" }, p.how))),
      "Nothing to project yet."));
  }

  function renderStatus(st) {
    const owned = st.partitions.filter((p) => p.owner).length;
    const alive = st.workers.filter((w) => w.alive);
    const inflight = alive.reduce((s, w) => s + w.inflight, 0);
    const retry = st.partitions.reduce((s, p) => s + p.retryBacklog, 0);
    clear(cards).append(
      card("Due backlog", st.dueBacklog, { test: "due-backlog" }),
      card("Retries due", retry),
      card("Runs in flight", inflight, { test: "inflight" }),
      card("Dead letters", st.deadLetters, { warn: st.deadLetters > 0, href: "#/dead-letters", test: "dead-letters" }),
      card("Workers", alive.length, { warn: !alive.length, test: "workers" }),
      ...st.queues.filter((q) => q.unserved).map((q) => card(`Queue ${q.queue}: no live worker`,
        q.length, { warn: true, test: `unserved-${q.queue}` })),
      card("Partitions owned", `${owned} / ${st.partitions.length}`,
        { warn: owned < st.partitions.length, test: "partitions-owned" }),
    );
    // Runs set aside by workers without their type's handler (docs/workers.md): flagged when no
    // live worker has the handler, since they are then dead-lettered after the handler wait.
    const waits = st.waitingForHandler || [];
    const unserved = waits.filter((w) => !w.served);
    if (unserved.length) {
      cards.append(card("Waiting for a handler", unserved.reduce((s, w) => s + w.runs, 0),
        { warn: true, test: "waiting-runs" }));
    }
    waiting.hidden = !waits.length;
    if (waits.length) {
      clear(waiting).append(el("h3", {}, "Waiting for a handler"),
        el("p", { class: "muted" }, "Runs that workers without their job type's handler set aside, "
          + "unrun. With no live worker that has the handler, each is dead-lettered after the "
          + "workers' handler wait."),
        table(["Queue", "Job type", "Runs", "Worker with the handler"],
          waits.map((w) => el("tr", { class: w.served ? "" : "bad", "data-waiting": `${w.queue} ${w.type}` },
            el("td", {}, w.queue), el("td", { class: "mono" }, w.type),
            el("td", { class: "num" }, w.runs),
            el("td", {}, w.served ? "live, taking them" : "none live")))));
    }
    const now = new Date(st.now).getTime();
    clear(parts).append(el("h3", {}, `Partitions (${st.partitions.length})`), table(
      ["#", "Dispatcher", "Lease", "Fence", "Due", "Retry", "Oldest due", "Dead"],
      st.partitions.map((p) => el("tr", { class: p.owner ? "" : "bad", "data-partition": p.partition },
        el("td", {}, p.partition),
        el("td", { class: "mono" }, p.owner || "no owner"),
        el("td", {}, p.leaseExpiresAt ? relative(p.leaseExpiresAt, now) : "—"),
        el("td", { class: "num" }, p.fence),
        el("td", { class: "num" }, p.dueBacklog),
        el("td", { class: "num" }, p.retryBacklog),
        el("td", { class: "num" }, p.oldestDueAgeMs ? seconds(p.oldestDueAgeMs / 1000) : "—"),
        el("td", { class: "num" }, p.deadLetters))),
    ));
    clear(workers).append(el("h3", {}, `Workers (${alive.length} live)`), table(
      ["Worker", "Queues", "In flight", "Heartbeat"],
      st.workers.map((w) => el("tr", { class: w.alive ? "" : "stale", "data-worker": w.id },
        el("td", { class: "mono", title: `${w.host} pid ${w.pid}` }, w.id),
        el("td", {}, w.queues.join(", ")),
        w.alive
          ? el("td", {}, el("div", { class: "meter", title: `${w.inflight} of ${w.concurrency}` },
            el("span", { style: `width:${Math.min(100, (100 * w.inflight) / Math.max(w.concurrency, 1))}%` })),
            ` ${w.inflight} / ${w.concurrency}`)
          : el("td", { class: "muted" }, "—"),
        el("td", { "data-state": w.alive ? "alive" : "dead" },
          w.alive ? relative(w.lastHeartbeatAt, now, true)
            : `dead ${relative(w.deadSince, now, true)}`))),
      "No worker is running: start one with rsched worker --app module:app",
    ));
    clear(queues).append(el("h3", {}, "Queues"), table(
      ["Queue", "Stream entries", "Delivered, unacknowledged", "Live workers"],
      st.queues.map((q) => el("tr", { class: q.unserved ? "bad" : "", "data-queue": q.queue },
        el("td", {}, q.queue), el("td", { class: "num" }, q.length),
        el("td", { class: "num" }, q.pending),
        el("td", { class: "num", title: q.unserved ? "runs wait here and no live worker reads this queue" : "" },
          q.unserved ? "none: runs wait" : q.liveWorkers))),
      "No queue has had a job yet.",
    ));
  }

  let seeded = false;
  let memoryAt = 0;
  async function tick() {
    if (Date.now() - memoryAt >= MEMORY_EVERY_MS) {
      memoryAt = Date.now();
      get("/memory").then(renderMemory, () => { memoryAt = 0; });
    }
    // The API's clock, read as its answer arrives (see charts.syncClock).
    const status = get("/status").then((v) => { syncClock(v.now); return v; });
    const [st, text, past] = await Promise.allSettled([status, metricsText(),
      seeded ? Promise.resolve(null) : get("/stats/overview?minutes=60")]);
    if (past.status === "fulfilled" && past.value) { seed(past.value.samples); seeded = true; }
    if (st.status === "fulfilled") renderStatus(st.value);
    if (text.status === "fulfilled") record(parseMetrics(text.value));
    const s = series();
    for (const c of charts) c.update(s);
    const failed = [st, text].filter((r) => r.status === "rejected");
    error.hidden = !failed.length;
    if (failed.length) error.textContent = `Cannot reach the API: ${failed[0].reason.message}`;
  }
  tick();
  const timer = setInterval(tick, POLL_MS);
  return () => clearInterval(timer);
}
