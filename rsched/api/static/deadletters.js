// Dead letters: runs whose attempts ran out, with their last error; replay one or many.

import { get, post } from "./api.js";
import { clear, el, table, time, toast } from "./dom.js";

export function deadLetters(main, session) {
  const canReplay = session.can("admin");
  const selected = new Set();
  const list = el("section", { class: "panel" }, el("p", { class: "muted" }, "Loading…"));
  const replaySel = el("button", { disabled: true, onclick: () => replay([...selected]) }, "Replay selected");
  clear(main).append(el("h1", {}, "Dead letters"),
    canReplay ? el("div", { class: "toolbar" }, replaySel) : el("p", { class: "muted" }, "Replaying needs an admin key."),
    list);
  let letters = [];

  function sync() {
    replaySel.disabled = !selected.size;
    replaySel.textContent = selected.size ? `Replay selected (${selected.size})` : "Replay selected";
  }

  async function replay(ids) {
    let ok = 0;
    const errors = [];
    for (const id of ids) {
      try {
        await post(`/dead-letters/${encodeURIComponent(id)}/replay`);
        ok++;
        selected.delete(id);
      } catch (err) {
        errors.push(`${id}: ${err.message}`);
      }
    }
    if (errors.length) toast(`Replayed ${ok}; failed: ${errors.join("; ")}`, "bad");
    else toast(`Replayed ${ok} run${ok === 1 ? "" : "s"}`);
    await load();
  }

  function render() {
    const all = canReplay ? el("input", { type: "checkbox", title: "Select all",
      checked: letters.length > 0 && letters.every((d) => selected.has(d.runId)),
      onchange: (e) => {
        for (const d of letters) if (e.target.checked) selected.add(d.runId); else selected.delete(d.runId);
        render();
      } }) : null;
    clear(list).append(el("h3", {}, `Dead letters (${letters.length}${letters.length >= 200 ? "+" : ""})`),
      table([all || "", "Run", "Type", "Attempts", "Dead since", "Last error", ""],
        letters.map((d) => el("tr", { "data-run": d.runId },
          el("td", {}, canReplay ? el("input", { type: "checkbox", checked: selected.has(d.runId),
            onchange: (e) => { if (e.target.checked) selected.add(d.runId); else selected.delete(d.runId); sync(); } }) : ""),
          el("td", { class: "nowrap" }, el("a", { class: "mono small", href: `#/jobs/${encodeURIComponent(d.jobId)}` }, d.runId)),
          el("td", {}, d.type),
          el("td", { class: "num" }, d.attempt),
          el("td", {}, time(d.deadAt)),
          el("td", {}, el("pre", { class: "err" }, d.error || "")),
          el("td", {}, canReplay ? el("button", { class: "small", onclick: () => replay([d.runId]) }, "Replay") : ""))),
        "No dead letters: every run succeeded or is still being retried."));
    sync();
  }

  async function load() {
    try {
      const page = await get("/dead-letters?limit=200");
      letters = page.deadLetters;
      const ids = new Set(letters.map((d) => d.runId));
      for (const id of [...selected]) if (!ids.has(id)) selected.delete(id);
      render();
    } catch (err) {
      clear(list).append(el("p", { class: "error" }, err.message));
    }
  }
  load();
  const timer = setInterval(() => { if (!selected.size) load(); }, 5000);
  return () => clearInterval(timer);
}
