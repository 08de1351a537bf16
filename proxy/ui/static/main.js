// The page's router: #/sessions?filters, #/session/ID?node=N, #/group/ID, #/run. Every view is
// a link that can be shared. A view module exports render(main, args, params) and may return a
// function that stops what it started (the run page's polling).

import { ApiError, checkKey, forgetKey, storeKey, storedKey } from "./api.js";
import { fill, h, hideTooltip } from "./dom.js";
import * as group from "./group.js";
import * as run from "./run.js";
import * as session from "./session.js";
import * as sessions from "./sessions.js";

const ROUTES = [
  [/^\/session\/([^/?]+)$/, session, "sessions"],
  [/^\/group\/(.+)$/, group, "sessions"],
  [/^\/run$/, run, "run"],
  [/^\/sessions$/, sessions, "sessions"],
];

const main = document.getElementById("main");
let stop = null;
let generation = 0;

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/sessions";
  const [path, query = ""] = raw.split("?", 2);
  return { path, params: new URLSearchParams(query) };
}

async function route() {
  const mine = ++generation;
  if (stop) stop();
  stop = null;
  hideTooltip();
  const { path, params } = parseHash();
  const found = ROUTES.find(([pattern]) => pattern.test(path));
  if (!found) {
    location.replace("#/sessions");
    return;
  }
  const [pattern, view, nav] = found;
  for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", a.dataset.nav === nav);
  const args = pattern.exec(path).slice(1).map(decodeURIComponent);
  try {
    const stopper = await view.render(main, args, params, () => mine === generation);
    if (mine === generation) {
      stop = stopper || null;
      main.dataset.rendered = location.hash; // which view the page shows now (tests wait on it)
    } else if (stopper) stopper();
  } catch (error) {
    if (mine !== generation) return;
    if (error instanceof ApiError && error.status === 401) {
      forgetKey();
      await askForKey("The stored admin key was refused.");
      route();
      return;
    }
    fill(main,
      h("div", { class: "note bad", role: "alert" }, h("b", { text: error instanceof ApiError ? `${error.status}: ` : "" }), error.message),
    );
  }
}

// -- the admin key ------------------------------------------------------------------------
const dialog = document.getElementById("key-dialog");

function askForKey(reason) {
  const form = document.getElementById("key-form");
  const input = document.getElementById("key-input");
  const error = document.getElementById("key-error");
  error.textContent = reason || "";
  input.value = "";
  dialog.showModal();
  input.focus();
  return new Promise((resolve) => {
    form.onsubmit = async (event) => {
      event.preventDefault();
      const key = input.value.trim();
      const answer = await checkKey(key);
      if (!answer.authorized) {
        error.textContent = "That is not the admin key.";
        input.select();
        return;
      }
      storeKey(key);
      dialog.close();
      showForget(true);
      resolve();
    };
  });
}

function showForget(shown) {
  const button = document.getElementById("forget");
  button.hidden = !shown;
  button.onclick = () => {
    forgetKey();
    location.reload();
  };
}

async function authorize() {
  dialog.addEventListener("cancel", (event) => event.preventDefault()); // nothing to show without it
  const answer = await checkKey(storedKey());
  if (!answer.key_required) return;
  if (answer.authorized) showForget(true);
  else await askForKey(storedKey() ? "The stored admin key was refused." : "");
}

document.getElementById("goto").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("goto-id");
  const id = input.value.trim();
  if (id) location.hash = `#/session/${encodeURIComponent(id)}`;
  input.value = "";
});

await authorize();
window.addEventListener("hashchange", route);
route();
