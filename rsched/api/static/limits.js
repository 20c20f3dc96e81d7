// Limits: every definition a page at a time, with a key's own in-flight and waiting counts and
// each definition's busiest keys (in flight, waiting, rate use), all from one GET
// /limits?busiest=N; a write key creates, edits (PUT replaces the definition) and deletes them.
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

function rateText(rate) {
  return rate ? `${rate.limit} per ${rate.periodSeconds} s` : "—";
}

export function limitsPage(main, session) {
  const write = session.can("write");
  let limits = [], cursors = [null], next = null, editing = null, stopped = false;

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
    field("Name", "name"), field("Concurrency", "concurrency"),
    el("span", {}, field("Rate", "rate.limit"), field("starts per", "rate.periodSeconds"), " s"),
    el("span", { class: "nowrap" }, submit, " ", cancel, errs.form));
  const list = el("section", { class: "panel" }, el("p", { class: "muted" }, "Loading…"));
  const prev = el("button", { class: "secondary", onclick: () => { cursors.pop(); load(); } }, "← Previous");
  const more = el("button", { class: "secondary", onclick: () => { cursors.push(next); load(); } }, "Next →");
  clear(main).append(el("h1", {}, "Limits"),
    el("p", { class: "muted" }, "A limit caps the runs of a job's limit key: how many run at once, how many start " +
      "per window. A name ending in * applies to each key it starts (each key counted on its own); " +
      "in-flight and waiting runs are counted per key, so they show for a key's own definition; " +
      "each definition lists its busiest keys, with their starts in the rate's window."),
    write ? el("section", { class: "panel" }, title, form)
      : el("p", { class: "muted" }, "Creating, editing and deleting limits need a write key."),
    list, el("div", { class: "toolbar" }, prev, more));

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
    title.textContent = "New limit";
    submit.textContent = "Create";
    cancel.hidden = true;
    showErrors({});
  }

  function edit(lim) {
    editing = lim.name;
    inputs.name.value = lim.name;
    inputs.name.readOnly = true;
    inputs.concurrency.value = lim.concurrency ?? "";
    inputs["rate.limit"].value = lim.rate ? lim.rate.limit : "";
    inputs["rate.periodSeconds"].value = lim.rate ? lim.rate.periodSeconds : "";
    title.textContent = `Edit limit ${lim.name}`;
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
    try {
      const got = await put(`/limits/${encodeURIComponent(name)}`, body);
      toast(`${editing ? "Saved" : "Created"} limit ${got.name}`);
      reset();
      await load();
    } catch (err) {
      const bad = err.body && Array.isArray(err.body.errors) ? err.body.errors : [];
      const byField = {};
      for (const e of bad) byField[FIELDS.includes(e.field) ? e.field : "form"] = `${e.field}: ${e.reason}`;
      if (!bad.length) byField.form = err.message;
      showErrors(byField);
    }
  }

  function buttons(lim) {
    if (!write) return "";
    const delBtn = el("button", { class: "small danger", onclick: async (e) => {
      if (!e.target.dataset.armed) {
        e.target.dataset.armed = "1";
        e.target.textContent = "Really delete?";
        return;
      }
      try {
        await del(`/limits/${encodeURIComponent(lim.name)}`);
        toast(`Deleted limit ${lim.name}`);
        if (editing === lim.name) reset();
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
      const res = await get("/limits" + query({ limit: PAGE, cursor: cursors[cursors.length - 1],
        busiest: BUSIEST }));
      if (stopped) return;
      limits = res.limits;
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
