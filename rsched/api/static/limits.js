// Limits: every queue's limit with its permits in flight and runs waiting (GET /queues/limits),
// then every key definition a page at a time, with a key's own in-flight and waiting counts and
// each definition's busiest keys (in flight, waiting, rate use), from one GET
// /limits?busiest=N; a write key creates, edits (PUT replaces the limit) and deletes both kinds.
// The API checks every field: a 422 is shown next to the field it names.

import { del, get, put, query } from "./api.js";
import { clear, el, table, toast } from "./dom.js";

const PAGE = 50;
const BUSIEST = 5;  // busiest keys shown per definition
const REFRESH_MS = 5000;
// The API's field names and the form's inputs; an error naming another field ("rate", "body",
// an unknown one) shows under the form's button.
const FIELDS = ["name", "concurrency", "rate.limit", "rate.periodSeconds"];

// A number typed as one; anything else goes to the API as typed, so it is refused naming the
// field rather than read as something else.
function num(text) {
  const v = text.trim();
  if (v === "") return null;
  return /^-?\d+(\.\d+)?([eE][+-]?\d+)?$/.test(v) ? Number(v) : v;
}

// A key's limit or a queue's, as the API names it.
function limitPath(queue, name) {
  return queue ? `/queues/${encodeURIComponent(name)}/limits` : `/limits/${encodeURIComponent(name)}`;
}

function rateText(rate) {
  return rate ? `${rate.limit} per ${rate.periodSeconds} s` : "—";
}

export function limitsPage(main, session) {
  const write = session.can("write");
  let limits = [], queueLimits = [], cursors = [null], next = null, editing = null, stopped = false;

  // What the form writes: a key's limit (PUT /limits/{name}) or a queue's (PUT
  // /queues/{queue}/limits); the name input holds the key's name or the queue's.
  const kind = el("select", { name: "kind", "data-test": "limit-kind", onchange: () => named() },
    el("option", { value: "key" }, "a limit key"), el("option", { value: "queue" }, "a whole queue"));
  const inputs = {
    name: el("input", { name: "name", placeholder: "tenant-42 or tenant-*", class: "mono" }),
    concurrency: el("input", { name: "concurrency", placeholder: "at once", class: "narrow", inputmode: "numeric" }),
    "rate.limit": el("input", { name: "rate.limit", placeholder: "starts", class: "narrow", inputmode: "numeric" }),
    "rate.periodSeconds": el("input", { name: "rate.periodSeconds", placeholder: "per s", class: "narrow", inputmode: "decimal" }),
  };
  const errs = Object.fromEntries([...FIELDS, "form"].map((f) =>
    [f, el("span", { class: "field-error", "data-error": f, hidden: true })]));
  const title = el("h3", {}, "New limit");
  const submit = el("button", { type: "submit" }, "Create");
  const cancel = el("button", { type: "button", class: "secondary", hidden: true, onclick: () => reset() }, "Cancel");
  const field = (label, f) => el("label", {}, label, " ", inputs[f], errs[f]);
  const form = el("form", { class: "limit-form", "data-test": "limit-form", onsubmit: (e) => { e.preventDefault(); save(); } },
    el("label", {}, "Limit of ", kind), field("Name", "name"), field("Concurrency", "concurrency"),
    el("span", {}, field("Rate", "rate.limit"), field("starts per", "rate.periodSeconds"), " s"),
    el("span", { class: "nowrap" }, submit, " ", cancel, errs.form));
  const qlist = el("section", { class: "panel", "data-test": "queue-limits" }, el("p", { class: "muted" }, "Loading…"));
  const list = el("section", { class: "panel" }, el("p", { class: "muted" }, "Loading…"));
  const prev = el("button", { class: "secondary", onclick: () => { cursors.pop(); load(); } }, "← Previous");
  const more = el("button", { class: "secondary", onclick: () => { cursors.push(next); load(); } }, "Next →");
  clear(main).append(el("h1", {}, "Limits"),
    el("p", { class: "muted" }, "A limit caps the runs of a job's limit key: how many run at once, how many start " +
      "per window. A name ending in * applies to each key it starts (each key counted on its own); " +
      "in-flight and waiting runs are counted per key, so they show for a key's own definition; " +
      "each definition lists its busiest keys, with their starts in the rate's window. " +
      "A queue's limit caps every run of the queue, keyed or not, across all workers."),
    write ? el("section", { class: "panel" }, title, form)
      : el("p", { class: "muted" }, "Creating, editing and deleting limits need a write key."),
    qlist, list, el("div", { class: "toolbar" }, prev, more));

  // The name input's hint and the form's title follow the kind of limit.
  function named() {
    const queue = kind.value === "queue";
    inputs.name.placeholder = queue ? "emails" : "tenant-42 or tenant-*";
    if (!editing) title.textContent = queue ? "New queue limit" : "New limit";
  }

  function showErrors(byField) {
    for (const [f, span] of Object.entries(errs)) {
      span.textContent = byField[f] || "";
      span.hidden = !byField[f];
      if (inputs[f]) inputs[f].classList.toggle("invalid", Boolean(byField[f]));
    }
  }

  function reset() {
    editing = null;
    for (const i of Object.values(inputs)) i.value = "";
    inputs.name.readOnly = false;
    kind.disabled = false;
    named();
    submit.textContent = "Create";
    cancel.hidden = true;
    showErrors({});
  }

  // Edit a key's limit (lim.name) or a queue's (lim.queue).
  function edit(lim) {
    const queue = lim.queue !== undefined;
    editing = queue ? lim.queue : lim.name;
    kind.value = queue ? "queue" : "key";
    kind.disabled = true;
    named();
    inputs.name.value = editing;
    inputs.name.readOnly = true;
    inputs.concurrency.value = lim.concurrency ?? "";
    inputs["rate.limit"].value = lim.rate ? lim.rate.limit : "";
    inputs["rate.periodSeconds"].value = lim.rate ? lim.rate.periodSeconds : "";
    title.textContent = queue ? `Edit the limit of queue ${editing}` : `Edit limit ${editing}`;
    submit.textContent = "Save";
    cancel.hidden = false;
    showErrors({});
    inputs.concurrency.focus();
  }

  async function save() {
    const name = inputs.name.value.trim();
    // The name is the API's path segment: without one (or with a '/') there is no route to ask.
    if (!name || name.includes("/")) {
      showErrors({ name: name ? "no '/' in a name" : "give a name" });
      return;
    }
    const limit = num(inputs["rate.limit"].value), period = num(inputs["rate.periodSeconds"].value);
    const body = { concurrency: num(inputs.concurrency.value),
      rate: limit === null && period === null ? null : { limit, periodSeconds: period } };
    const queue = kind.value === "queue";
    try {
      const got = await put(limitPath(queue, name), body);
      toast(`${editing ? "Saved" : "Created"} ${queue ? `limit of queue ${got.queue}` : `limit ${got.name}`}`);
      reset();
      await load();
    } catch (err) {
      const bad = err.body && Array.isArray(err.body.errors) ? err.body.errors : [];
      const byField = {};
      for (const e of bad) {
        const f = e.field === "queue" ? "name" : e.field;  // a queue's name is in the name input
        byField[FIELDS.includes(f) ? f : "form"] = `${e.field}: ${e.reason}`;
      }
      if (!bad.length) byField.form = err.message;
      showErrors(byField);
    }
  }

  // A key's limit (lim.name) or a queue's (lim.queue): its Edit and Delete buttons.
  function buttons(lim) {
    if (!write) return "";
    const queue = lim.queue !== undefined, name = queue ? lim.queue : lim.name;
    const what = queue ? `limit of queue ${name}` : `limit ${name}`;
    const delBtn = el("button", { class: "small danger", onclick: async (e) => {
      if (!e.target.dataset.armed) {
        e.target.dataset.armed = "1";
        e.target.textContent = "Really delete?";
        return;
      }
      try {
        await del(limitPath(queue, name));
        toast(`Deleted ${what}`);
        if (editing === name && (kind.value === "queue") === queue) reset();
      } catch (err) {
        toast(`Delete failed: ${err.message}`, "bad");
      }
      await load();
    } }, "Delete");
    return el("span", { class: "nowrap" }, el("button", { class: "small", onclick: () => edit(lim) }, "Edit"), " ", delBtn);
  }

  // A key's own definition: its key's count (0 while the key is not busy); a family's runs are
  // counted per key (its busiest keys show them).
  function countCell(lim, k) {
    if (lim.name.endsWith("*")) return el("span", { class: "muted small", title: "Counted per key" }, "per key");
    const own = (lim.busiestKeys || []).find((b) => b.key === lim.name);
    return own ? own[k] : 0;
  }

  // Rate use: the key's starts in the rate's window against its limit.
  function busiestCell(lim) {
    const keys = lim.busiestKeys || [];
    if (!keys.length) return el("span", { class: "muted small" }, "none busy");
    return el("div", { class: "small" }, ...keys.map((b) => el("div", { "data-key": b.key },
      el("span", { class: "mono" }, b.key), ": ",
      el("span", { "data-test": "key-in-flight" }, String(b.inFlight)), " in flight, ",
      el("span", { "data-test": "key-waiting" }, String(b.waiting)), " waiting",
      lim.rate ? el("span", {}, ", rate ",
        el("span", { "data-test": "key-rate" }, `${b.recentStarts}/${lim.rate.limit}`),
        ` per ${lim.rate.periodSeconds} s`) : "")));
  }

  function render() {
    clear(qlist).append(el("h3", {}, "Queue limits"),
      table(["Queue", "Concurrency", "Rate", "In flight", "Waiting", ""],
        queueLimits.map((q) => el("tr", { "data-queue-limit": q.queue },
          el("td", { class: "mono" }, q.queue),
          el("td", { class: "num", "data-test": "concurrency" }, q.concurrency ?? "—"),
          el("td", { "data-test": "rate" }, rateText(q.rate)),
          el("td", { class: "num", "data-test": "in-flight" }, String(q.inFlight)),
          el("td", { class: "num", "data-test": "waiting" }, String(q.waiting)),
          el("td", {}, buttons(q)))),
        "No queue limits: every queue runs as its workers allow."));
    clear(list).append(el("h3", {}, `Definitions, page ${cursors.length} (${limits.length}${next ? ", more" : ""})`),
      table(["Name", "Concurrency", "Rate", "In flight", "Waiting", "Busiest keys", ""],
        limits.map((lim) => el("tr", { "data-limit": lim.name },
          el("td", { class: "mono" }, lim.name),
          el("td", { class: "num", "data-test": "concurrency" }, lim.concurrency ?? "—"),
          el("td", { "data-test": "rate" }, rateText(lim.rate)),
          el("td", { class: "num", "data-test": "in-flight" }, countCell(lim, "inFlight")),
          el("td", { class: "num", "data-test": "waiting" }, countCell(lim, "waiting")),
          el("td", { "data-test": "busiest" }, busiestCell(lim)),
          el("td", {}, buttons(lim)))),
        "No limits defined: every limit key runs unlimited."));
    prev.hidden = cursors.length <= 1;
    more.hidden = !next;
  }

  async function load() {
    try {
      const [res, queues] = await Promise.all([
        get("/limits" + query({ limit: PAGE, cursor: cursors[cursors.length - 1], busiest: BUSIEST })),
        get("/queues/limits")]);
      if (stopped) return;
      limits = res.limits;
      queueLimits = queues.queueLimits;
      next = res.nextCursor;
      render();
    } catch (err) {
      if (!stopped) clear(list).append(el("p", { class: "error" }, err.message));
    }
  }
  load();
  // Refresh the counts unless a Delete is armed.
  const timer = setInterval(() => { if (!list.querySelector("[data-armed]")) load(); }, REFRESH_MS);
  return () => { stopped = true; clearInterval(timer); };
}
