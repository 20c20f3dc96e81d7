// The dashboard shell: sign-in with an API key, hash routes, and the dead-letter badge.

import { ApiError, get, getKey, setKey } from "./api.js";
import { deadLetters } from "./deadletters.js";
import { clear, el } from "./dom.js";
import { jobList, jobPage } from "./jobs.js";
import { limitsPage } from "./limits.js";
import { overview } from "./overview.js";

const RANK = { read: 0, write: 1, admin: 2 };
const main = document.getElementById("main");
let session = null;
let cleanup = () => {};

function makeSession(s) {
  return { ...s, can: (scope) => RANK[s.scope] >= RANK[scope] };
}

function signIn(message) {
  cleanup();
  cleanup = () => {};
  session = null;
  renderWho();
  const input = el("input", { type: "password", name: "key", placeholder: "rsk_…", class: "mono wide", autocomplete: "off" });
  clear(main).append(el("section", { class: "panel signin" },
    el("h1", {}, "Sign in"),
    el("p", {}, "Paste an API key. ", el("span", { class: "muted" },
      "Create one with rsched keys create --scope read --name dashboard; `rsched dev` prints an admin key.")),
    message ? el("p", { class: "error" }, message) : null,
    el("form", { onsubmit: (e) => { e.preventDefault(); setKey(input.value.trim()); start(); } },
      input, el("button", { type: "submit" }, "Sign in"))));
  input.focus();
}

function renderWho() {
  const who = clear(document.getElementById("who"));
  if (!session) return;
  if (!session.auth) { who.append(el("span", { class: "scope" }, "auth off")); return; }
  who.append(el("span", { title: session.keyId }, session.keyName || session.keyId), " ",
    el("span", { class: "scope", "data-scope": session.scope }, session.scope), " ",
    el("button", { class: "link", onclick: () => { setKey(""); signIn(); } }, "Sign out"));
}

function route() {
  if (!session) return;
  cleanup();
  const hash = location.hash || "#/";
  const [path, qs] = hash.slice(1).split("?");
  const params = new URLSearchParams(qs || "");
  let nav = "overview";
  const m = path.match(/^\/jobs\/(.+)$/);
  if (m) { nav = "jobs"; cleanup = jobPage(main, decodeURIComponent(m[1]), session); }
  else if (path.startsWith("/jobs")) { nav = "jobs"; cleanup = jobList(main, params); }
  else if (path.startsWith("/limits")) { nav = "limits"; cleanup = limitsPage(main, session); }
  else if (path.startsWith("/dead-letters")) { nav = "dead"; cleanup = deadLetters(main, session); }
  else cleanup = overview(main);
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.nav === nav);
}

async function badge() {
  if (!session) return;
  try {
    const st = await get("/status");
    const b = document.getElementById("dead-count");
    b.textContent = st.deadLetters;
    b.hidden = !st.deadLetters;
  } catch { /* the views show API errors */ }
}

async function start() {
  try {
    session = makeSession(await get("/ui/session"));
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) {
      signIn(getKey() ? "That key was not accepted." : null);
    } else {
      clear(main).append(el("p", { class: "error" }, `Cannot reach the API: ${err.message}`));
      setTimeout(start, 3000);
    }
    return;
  }
  renderWho();
  route();
  badge();
}

// `rsched dev` prints a link with the key in the fragment (never sent to the server).
if (location.hash.startsWith("#key=")) {
  setKey(decodeURIComponent(location.hash.slice(5)));
  history.replaceState(null, "", location.pathname + "#/");
}
window.addEventListener("hashchange", route);
window.addEventListener("rsched:unauthorized", () => { if (session && session.auth) signIn("The key is no longer accepted."); });
setInterval(badge, 10000);
start();
