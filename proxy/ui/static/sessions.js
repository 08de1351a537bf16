// The sessions page: filters in the URL, one keyset page at a time, counts capped by the server.

import { get } from "./api.js";
import { clip, count, duration, fill, h, num, statusBadge, versions, when } from "./dom.js";

const STATUSES = ["open", "finished", "training", "consumed", "failed"];
const FILTERS = ["status", "eval", "task", "group", "reward_min", "reward_max", "version_min", "version_max", "since", "until", "limit"];

function link(params, changes) {
  const next = new URLSearchParams(params);
  for (const [k, v] of Object.entries(changes)) {
    if (v === null || v === undefined || v === "") next.delete(k);
    else next.set(k, v);
  }
  const query = next.toString();
  return "#/sessions" + (query ? "?" + query : "");
}

function filtersOnly(params) {
  const out = new URLSearchParams();
  for (const name of FILTERS) if (params.get(name)) out.set(name, params.get(name));
  return out;
}

// datetime-local values are local wall-clock times; the API takes epoch seconds.
function toLocalInput(seconds) {
  if (!seconds) return "";
  const d = new Date(Number(seconds) * 1000);
  return new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 16);
}

function fromLocalInput(value) {
  return value ? String(new Date(value).getTime() / 1000) : "";
}

function filterBar(params) {
  const field = (label, input) => h("label", {}, label, input);
  const input = (name, cls, extra = {}) => h("input", { name, class: cls, value: params.get(name) || "", ...extra });
  const select = (name, options) =>
    h("select", { name }, options.map(([value, text]) => h("option", { value, text, selected: (params.get(name) || "") === value })));
  const form = h(
    "form",
    { class: "filters panel", id: "filters" },
    field("status", select("status", [["", "any"], ...STATUSES.map((s) => [s, s])])),
    field("kind", select("eval", [["", "any"], ["false", "training"], ["true", "evaluation"]])),
    field("task", input("task", "mid", { spellcheck: "false" })),
    field("group", input("group", "mid", { spellcheck: "false" })),
    field("reward ≥", input("reward_min", "short", { type: "number", step: "any" })),
    field("reward ≤", input("reward_max", "short", { type: "number", step: "any" })),
    field("version ≥", input("version_min", "short", { type: "number", min: "0", step: "1" })),
    field("version ≤", input("version_max", "short", { type: "number", min: "0", step: "1" })),
    field("since", h("input", { name: "since", type: "datetime-local", value: toLocalInput(params.get("since")) })),
    field("until", h("input", { name: "until", type: "datetime-local", value: toLocalInput(params.get("until")) })),
    field("rows", select("limit", ["50", "100", "200", "500"].map((n) => [n === "50" ? "" : n, n]))),
    h("button", { type: "submit", text: "Apply" }),
    h("a", { href: "#/sessions", text: "clear" }),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const next = new URLSearchParams();
    for (const name of FILTERS) {
      let value = String(data.get(name) || "").trim();
      if (name === "since" || name === "until") value = fromLocalInput(value);
      if (value) next.set(name, value);
    }
    location.hash = link(next, {});
  });
  return form;
}

function countsStrip(overview, params) {
  const statuses = overview.statuses || {};
  const t = overview.training || {};
  const total = Object.values(statuses).reduce((a, b) => a + b, 0);
  const base = filtersOnly(params);
  return h(
    "div",
    { class: "counts", id: "counts" },
    h("span", {}, h("b", { text: count(total) }), " sessions"),
    STATUSES.map((s) => h("a", { href: link(base, { status: s }), data: { status: s } }, statusBadge(s), " ", h("b", { text: count(statuses[s] || 0) }))),
    h("span", {}, "training sessions: ", h("b", { text: count(t.trained) }), " trained · ", h("b", { text: count(t.skipped) }), " skipped · ", h("b", { text: count(t.dropped_stale) }), " dropped stale"),
  );
}

function row(s) {
  const took = s.finished_at ? s.finished_at - s.created_at : null;
  return h(
    "tr",
    { data: { sessionId: s.session_id } },
    h("td", { class: "mono", title: when(s.created_at), text: when(s.created_at) }),
    h("td", { class: "mono" }, h("a", { href: `#/session/${encodeURIComponent(s.session_id)}`, class: "session-link", text: s.session_id })),
    h("td", {}, statusBadge(s.status), s.eval ? [" ", h("span", { class: "badge eval", text: "eval" })] : null, s.auto ? h("span", { class: "muted", text: " auto" }) : null),
    h("td", { class: "muted", text: s.status === "failed" ? "" : s.fate === s.status ? "" : clip(s.fate, 40) }),
    h("td", { class: "mono" }, s.task_id ? h("a", { href: link(new URLSearchParams(), { task: s.task_id }), text: clip(s.task_id, 24) }) : "–"),
    h("td", { class: "mono" }, s.group_id ? h("a", { href: `#/group/${encodeURIComponent(s.group_id)}`, class: "group-link", text: clip(s.group_id, 28) }) : "–"),
    h("td", { class: "num", text: String(s.num_completions) }),
    h("td", { class: "num reward", data: { value: s.reward }, text: num(s.reward) }),
    h("td", { class: "num", text: versions(s.min_version, s.max_version) }),
    h("td", { class: "num", text: duration(took) }),
    h("td", { class: "wrap", text: s.status === "failed" ? clip(s.failure, 120) : "" }),
  );
}

export async function render(main, _args, params, current) {
  const query = Object.fromEntries(filtersOnly(params));
  for (const name of ["older_than", "newer_than"]) if (params.get(name)) query[name] = params.get(name);
  const [page, overview] = await Promise.all([get("api/sessions", query), get("api/overview")]);
  if (!current()) return;
  document.getElementById("store").textContent = `${overview.store} · ${overview.model}`;
  const at = page.newer ? Number(params.get("at") || 0) : 0; // nothing newer: this is the top
  const limit = Number(params.get("limit") || 50);
  const base = filtersOnly(params);
  const shown = page.data.length;
  const total = page.total === null ? "" : page.total_capped ? `${count(page.total)}+` : count(page.total);
  const table = h(
    "table",
    { class: "list", id: "sessions" },
    h("thead", {}, h("tr", {}, ["created", "session", "status", "fate", "task", "group", "turns", "reward", "versions", "took", "failure"].map((c) => h("th", { class: ["turns", "reward", "versions", "took"].includes(c) ? "num" : "", text: c })))),
    h("tbody", {}, page.data.map(row)),
  );
  const go = (id, text, target) =>
    h("button", { type: "button", id, text, disabled: !target, onclick: () => (location.hash = target) });
  const pager = h(
    "div",
    { class: "pager" },
    go("newest", "⇤ newest", page.newer ? link(base, {}) : null),
    go("newer", "‹ newer", page.newer ? link(base, { newer_than: page.newer, at: Math.max(0, at - limit) }) : null),
    go("older", "older ›", page.older ? link(base, { older_than: page.older, at: at + shown }) : null),
    h("span", { class: "muted", id: "range" }, shown ? `${count(at + 1)}–${count(at + shown)}` : "none", total ? ` of ${total}` : ""),
  );
  fill(main,
    h("h1", { text: "Sessions" }),
    countsStrip(overview, params),
    filterBar(params),
    shown ? table : h("p", { class: "muted", text: "No session matches these filters." }),
    pager,
  );
}
