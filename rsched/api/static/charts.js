// Live charts from the API's /metrics: Prometheus text parsed in the browser, rates and
// histogram quantiles computed over a sliding window, drawn on a canvas (no chart library).

export function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const [, k, v] of (m[3] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[k] = v;
    if (!out.has(m[1])) out.set(m[1], []);
    out.get(m[1]).push({ labels, value: Number(m[4]) });
  }
  return out;
}

export function total(metrics, name) {
  return (metrics.get(name) || []).reduce((s, x) => s + x.value, 0);
}

// Cumulative bucket counts [[le, count], ...] of a histogram, summed over its other labels.
export function buckets(metrics, name) {
  const by = new Map();
  for (const { labels, value } of metrics.get(`${name}_bucket`) || []) {
    const le = labels.le === "+Inf" ? Infinity : Number(labels.le);
    by.set(le, (by.get(le) || 0) + value);
  }
  return [...by.entries()].sort((a, b) => a[0] - b[0]);
}

// Prometheus's histogram_quantile over the difference of two bucket snapshots.
export function quantile(q, now, before) {
  const prev = new Map(before || []);
  const d = now.map(([le, c]) => [le, Math.max(c - (prev.get(le) || 0), 0)]);
  const count = d.length ? d[d.length - 1][1] : 0;
  if (!count) return null;
  const rank = q * count;
  let lower = 0, below = 0;
  for (const [le, c] of d) {
    if (c >= rank) {
      if (le === Infinity) return lower;
      return lower + (le - lower) * ((rank - below) / Math.max(c - below, 1e-9));
    }
    lower = le; below = c;
  }
  return lower;
}

// Samples of counters and gauges kept for HISTORY_MS, so rates survive a dashboard re-render:
// the API's stored samples of the last hour (seed), then the live ones.
const HISTORY_MS = 60 * 60 * 1000;
const RATE_WINDOW_MS = 10 * 1000;
const MAX_GAP_MS = 3 * 60 * 1000; // a rate over a longer gap (no API was sampling) is no rate
export const history = [];

// The API's clock (Redis's) minus the browser's: live samples are timed on the API's clock, as
// the stored ones are, so a rate across the two spans the time that passed.
let skewMs = 0;
export function syncClock(serverIso, at = Date.now()) {
  const server = new Date(serverIso).getTime();
  if (!Number.isNaN(server)) skewMs = server - at;
}
const clock = () => Date.now() + skewMs;

// The API's samples (GET /stats/overview) older than the first live one, in time order, each at
// the time it was taken (``at``; ``t`` is the start of its bucket, up to a period earlier).
export function seed(samples) {
  const first = history.length ? history[0].t : Infinity;
  const older = samples.map((s) => ({ ...s, t: s.at ?? s.t }))
    .filter((s) => s.t < first).map((s) => ({
      ...s, lag: s.lag.map(([le, c]) => [le === null ? Infinity : le, c]) }));
  history.unshift(...older);
  return older.length;
}

export function record(metrics, t = clock()) {
  const sample = {
    t,
    started: total(metrics, "rsched_cluster_runs_started_total"),
    succeeded: total(metrics, "rsched_partition_succeeded_total"),
    failed: total(metrics, "rsched_partition_failed_total"),
    lag: buckets(metrics, "rsched_cluster_start_lag_seconds"),
    due: total(metrics, "rsched_due_backlog"),
    retry: total(metrics, "rsched_retry_backlog"),
    oldest: Math.max(0, ...(metrics.get("rsched_oldest_due_age_seconds") || []).map((x) => x.value)),
  };
  history.push(sample);
  while (history.length && history[0].t < t - HISTORY_MS) history.shift();
  return sample;
}

// The sample a rate at i is measured from: the newest at least RATE_WINDOW_MS older (counters
// move in steps, at workers' heartbeats, so a shorter window reads 0 or a burst), unless a gap
// longer than MAX_GAP_MS lies between; else, over a shorter window, the oldest sample after
// such a gap (the first seconds of a dashboard with no recent stored sample).
function baseline(i) {
  const s = history[i];
  let j = i - 1;
  while (j >= 0 && s.t - history[j].t < RATE_WINDOW_MS) j--;
  if (j >= 0 && s.t - history[j].t <= MAX_GAP_MS) return history[j];
  return j + 1 < i ? history[j + 1] : null;
}

function rate(s, b, key) {
  const dt = (s.t - b.t) / 1000;
  return dt > 0 ? Math.max(s[key] - b[key], 0) / dt : null;
}

// Series for the three overview charts, as [[t, value|null], ...].
export function series() {
  const out = { started: [], succeeded: [], failed: [], p50: [], p95: [], p99: [], due: [], retry: [], oldest: [] };
  history.forEach((s, i) => {
    const b = baseline(i);
    for (const k of ["started", "succeeded", "failed"]) out[k].push([s.t, b ? rate(s, b, k) : null]);
    for (const [k, q] of [["p50", 0.5], ["p95", 0.95], ["p99", 0.99]]) {
      out[k].push([s.t, b ? quantile(q, s.lag, b.lag) : null]);
    }
    out.due.push([s.t, s.due]);
    out.retry.push([s.t, s.retry]);
    out.oldest.push([s.t, s.oldest]);
  });
  return out;
}

// A round tick step such that four steps cover v (whole steps for counts).
function niceStep(v, integer) {
  const raw = v > 0 ? v / 4 : 0.25;
  const p = 10 ** Math.floor(Math.log10(raw));
  let step = 10 * p;
  for (const m of [1, 2, 2.5, 5]) if (m * p >= raw) { step = m * p; break; }
  return integer ? Math.max(1, Math.ceil(step)) : step;
}

// Digits after the point a tick step needs (0.25 -> 2, 2.5 -> 1, 5 -> 0).
function decimals(step) {
  for (let d = 0; d < 6; d++) if (Math.abs(Math.round(step * 10 ** d) - step * 10 ** d) < 1e-6) return d;
  return 6;
}

// The y axis's labels, every one in the same unit and with the step's decimals: "rate" (per
// second), "seconds" (ms while the axis tops below a second), anything else a plain count.
export function axisLabel(unit, ymax, step) {
  if (unit === "seconds" && ymax < 1) {
    const d = decimals(step * 1000);
    return (v) => `${(v * 1000).toFixed(d)} ms`;
  }
  const d = decimals(step);
  const suffix = unit === "seconds" ? " s" : unit === "rate" ? "/s" : "";
  return (v) => `${v.toFixed(d)}${suffix}`;
}

// lines: [{label, color, points: [[t, v|null], ...]}]; unit: the y axis's (see axisLabel).
export function draw(canvas, lines, unit = "count", integer = false) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 400, h = canvas.clientHeight || 160;
  canvas.width = w * dpr; canvas.height = h * dpr;
  const g = canvas.getContext("2d");
  g.scale(dpr, dpr);
  g.clearRect(0, 0, w, h);
  const left = 56, right = 8, top = 8, bottom = 20;
  // The axis grows with the history: one minute at first, five once there is that much.
  const now = clock();
  const first = Math.min(...lines.flatMap((l) => l.points.map((p) => p[0])), now);
  const span = Math.min(HISTORY_MS, Math.max(60_000, Math.ceil((now - first) / 60_000) * 60_000));
  const t0 = now - span;
  const values = lines.flatMap((l) => l.points.map((p) => p[1]).filter((v) => v !== null));
  const step = niceStep(Math.max(0, ...values), integer);
  const ymax = 4 * step;
  const format = axisLabel(unit, ymax, step);
  const x = (t) => left + ((t - t0) / span) * (w - left - right);
  const y = (v) => top + (1 - v / ymax) * (h - top - bottom);
  g.font = "11px system-ui, sans-serif";
  g.strokeStyle = "#e3e7ee"; g.fillStyle = "#6b7280"; g.lineWidth = 1;
  const labels = [];
  for (let i = 0; i <= 4; i++) {
    const v = step * i, yy = Math.round(y(v)) + 0.5;
    g.beginPath(); g.moveTo(left, yy); g.lineTo(w - right, yy); g.stroke();
    g.textAlign = "right"; g.textBaseline = "middle";
    labels.push(format(v));
    g.fillText(labels[i], left - 6, yy);
  }
  canvas.dataset.axis = labels.join("|");
  g.textAlign = "center"; g.textBaseline = "top";
  const tick = span / 4;
  for (let i = 4; i >= 0; i--) {
    const ago = Math.round((i * tick) / 1000);
    const label = !ago ? "now" : ago % 60 ? `-${ago}s` : `-${ago / 60}m`;
    g.fillText(label, x(now - i * tick), h - bottom + 6);
  }
  for (const line of lines) {
    g.strokeStyle = line.color; g.fillStyle = line.color; g.lineWidth = 2; g.beginPath();
    const pts = line.points;
    pts.forEach(([t, v], i) => {
      if (v === null || t < t0) return;
      const joined = i > 0 && pts[i - 1][1] !== null && pts[i - 1][0] >= t0;
      if (joined) g.lineTo(x(t), y(v)); else g.moveTo(x(t), y(v));
      const alone = !joined && !(i + 1 < pts.length && pts[i + 1][1] !== null);
      if (alone) g.fillRect(x(t) - 1.5, y(v) - 1.5, 3, 3);  // a sample with no neighbour
    });
    g.stroke();
  }
  const shown = lines.length ? lines[0].points.filter((p) => p[1] !== null) : [];
  canvas.dataset.points = String(shown.length);
  canvas.dataset.first = shown.length ? String(shown[0][0]) : "";
  if (!values.length) {
    g.fillStyle = "#9ca3af"; g.textAlign = "center"; g.textBaseline = "middle";
    g.fillText("collecting samples…", (left + w - right) / 2, (top + h - bottom) / 2);
  }
}
