// Dead letters: runs whose attempts ran out, a page at a time, filtered; each with its full
// error and its job's payload; replay or delete one, the selected ones, or all that match.

import { del, get, post, query } from "./api.js";
import { clear, el, table, time, toast } from "./dom.js";

const PAGE = 50;
const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

export function deadLetters(main, session) {
  const admin = session.can("admin");
  const selected = new Set();
  let letters = [], cursors = [null], next = null, matching = null, confirm = null;
  const f = { type: "", queue: "", errorContains: "", olderThanSeconds: "" };

  const list = el("section", { class: "panel" }, el("p", { class: "muted" }, "Loading…"));
  const inputs = {
    type: el("input", { name: "type", placeholder: "type" }),
    queue: el("input", { name: "queue", placeholder: "queue" }),
    errorContains: el("input", { name: "errorContains", placeholder: "error contains" }),
    olderThanSeconds: el("input", { name: "olderThanSeconds", placeholder: "older than (s)", type: "number", min: 0 }),
  };
  const filters = el("form", { class: "filters", onsubmit: (e) => {
    e.preventDefault();
    for (const k of Object.keys(f)) f[k] = inputs[k].value.trim();
    cursors = [null];
    unselect();
    load();
  } }, Object.values(inputs), el("button", { type: "submit" }, "Filter"));
  const replaySel = el("button", { disabled: true, onclick: () => replay([...selected]) }, "Replay selected");
  const deleteSel = el("button", { class: "danger", disabled: true, onclick: () => deleteSelected() }, "Delete selected");
  const allMatching = el("button", { class: "secondary", onclick: () => selectMatching() }, "Select all matching");
  const prev = el("button", { class: "secondary", onclick: () => { cursors.pop(); unselect(); load(); } }, "← Newer");
  const more = el("button", { class: "secondary", onclick: () => { cursors.push(next); unselect(); load(); } }, "Older →");
  clear(main).append(el("h1", {}, "Dead letters"),
    el("div", { class: "toolbar" }, filters),
    admin ? el("div", { class: "toolbar" }, replaySel, deleteSel, allMatching)
      : el("p", { class: "muted" }, "Replaying and deleting need an admin key."),
    list, el("div", { class: "toolbar" }, prev, more));

  const filterBody = () => {
    const b = {};
    for (const [k, v] of Object.entries(f)) if (v !== "") b[k] = k === "olderThanSeconds" ? Number(v) : v;
    return b;
  };

  function unselect() { selected.clear(); matching = null; confirm = null; }

  function sync() {
    const n = matching !== null ? matching : selected.size;
    replaySel.hidden = matching !== null;
    replaySel.disabled = !selected.size;
    replaySel.textContent = selected.size ? `Replay selected (${selected.size})` : "Replay selected";
    deleteSel.disabled = !n;
    deleteSel.textContent = confirm === "selected" ? `Really delete ${plural(n, "dead letter")}?`
      : matching !== null ? `Delete all ${matching} matching` : n ? `Delete selected (${n})` : "Delete selected";
    allMatching.textContent = matching !== null ? `All ${matching} matching selected (clear)` : "Select all matching";
    prev.hidden = cursors.length <= 1;
    more.hidden = !next;
  }

  // A purge (or its dry run) is a background operation: followed here until it ends.
  async function purge(dryRun) {
    let op = await post("/dead-letters/purge", { ...filterBody(), dryRun });
    while (op.status === "running") {
      await new Promise((done) => setTimeout(done, 250));
      op = await get(`/operations/${op.id}`);
    }
    if (op.status !== "succeeded") throw new Error(`the operation ${op.status}${op.error ? `: ${op.error}` : ""}`);
    return dryRun ? op.matched : op.deleted;
  }

  async function selectMatching() {
    if (matching !== null) { unselect(); render(); return; }
    try {
      matching = await purge(true);
      for (const d of letters) selected.add(d.runId);
      confirm = null;
      render();
    } catch (err) {
      toast(`Counting failed: ${err.message}`, "bad");
    }
  }

  async function deleteSelected() {
    if (confirm !== "selected") { confirm = "selected"; sync(); return; }
    confirm = null;
    if (matching !== null) {
      try {
        toast(`Deleted ${plural(await purge(false), "dead letter")}`);
      } catch (err) {
        toast(`Delete failed: ${err.message}`, "bad");
      }
      unselect();
      cursors = [null];
      await load();
      return;
    }
    await each([...selected], (id) => del(`/dead-letters/${encodeURIComponent(id)}`), "Deleted");
  }

  async function replay(ids) {
    await each(ids, (id) => post(`/dead-letters/${encodeURIComponent(id)}/replay`), "Replayed");
  }

  async function each(ids, call, verb) {
    let ok = 0;
    const errors = [];
    for (const id of ids) {
      try {
        await call(id);
        ok++;
        selected.delete(id);
      } catch (err) {
        errors.push(`${id}: ${err.message}`);
      }
    }
    matching = null;
    if (errors.length) toast(`${verb} ${ok}; failed: ${errors.join("; ")}`, "bad");
    else toast(`${verb} ${plural(ok, "run")}`);
    await load();
  }

  // The full error and the job's payload, read when the row is opened.
  function details(d) {
    const payload = el("pre", { class: "payload" }, "…");
    const [first, ...rest] = (d.error || "").split("\n");
    return el("details", { class: "more", ontoggle: async (e) => {
      if (!e.target.open || payload.dataset.loaded) return;
      try {
        const job = await get(`/jobs/${encodeURIComponent(d.jobId)}`);
        payload.textContent = JSON.stringify(job.payload, null, 2);
        payload.dataset.loaded = "1";
      } catch (err) {
        payload.textContent = err.message;
      }
    } }, el("summary", {}, el("pre", { class: "err" }, first)),
    rest.length ? el("pre", { class: "err full" }, d.error) : null,
    el("h4", {}, "Payload"), payload,
    el("p", { class: "muted small" }, `queue ${d.queue} · worker ${d.worker || "—"} · last attempt started ${d.startedAt || "—"}`));
  }

  function rowButtons(d) {
    if (!admin) return "";
    const delBtn = el("button", { class: "small danger", onclick: (e) => {
      if (e.target.dataset.armed) { del1(); return; }
      e.target.dataset.armed = "1";
      e.target.textContent = "Really delete?";
    } }, "Delete");
    async function del1() { await each([d.runId], (id) => del(`/dead-letters/${encodeURIComponent(id)}`), "Deleted"); }
    return el("span", { class: "nowrap" }, el("button", { class: "small", onclick: () => replay([d.runId]) }, "Replay"), " ", delBtn);
  }

  function render() {
    const all = admin ? el("input", { type: "checkbox", title: "Select all on this page",
      checked: letters.length > 0 && letters.every((d) => selected.has(d.runId)),
      onchange: (e) => {
        matching = null;
        for (const d of letters) if (e.target.checked) selected.add(d.runId); else selected.delete(d.runId);
        render();
      } }) : null;
    const page = cursors.length;
    clear(list).append(el("h3", {}, `Dead letters, page ${page} (${letters.length}${next ? ", more older" : ""})`),
      table([all || "", "Run", "Type", "Attempts", "Dead since", "Last error", ""],
        letters.map((d) => el("tr", { "data-run": d.runId },
          el("td", {}, admin ? el("input", { type: "checkbox", checked: selected.has(d.runId),
            onchange: (e) => {
              matching = null;
              if (e.target.checked) selected.add(d.runId); else selected.delete(d.runId);
              sync();
            } }) : ""),
          el("td", { class: "nowrap" }, el("a", { class: "mono small", href: `#/jobs/${encodeURIComponent(d.jobId)}` }, d.runId)),
          el("td", {}, d.type),
          el("td", { class: "num" }, d.attempt),
          el("td", {}, time(d.deadAt)),
          el("td", {}, details(d)),
          el("td", {}, rowButtons(d)))),
        Object.values(f).some((v) => v) ? "No dead letter matches these filters on this page."
          : "No dead letters: every run succeeded or is still being retried."));
    sync();
  }

  async function load() {
    try {
      const res = await get("/dead-letters" + query({ ...f, limit: PAGE, cursor: cursors[cursors.length - 1] }));
      letters = res.deadLetters;
      next = res.nextCursor;
      const ids = new Set(letters.map((d) => d.runId));
      if (matching === null) for (const id of [...selected]) if (!ids.has(id)) selected.delete(id);
      render();
    } catch (err) {
      clear(list).append(el("p", { class: "error" }, err.message));
    }
  }
  load();
  // Refresh unless the user is choosing, confirming or reading an opened row.
  const timer = setInterval(() => {
    if (!selected.size && confirm === null && !list.querySelector("details[open], [data-armed]")) load();
  }, 5000);
  return () => clearInterval(timer);
}
