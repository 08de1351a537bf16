// The group page: one task's sessions side by side (a GRPO group), with the advantage the trainer's
// estimator gives each of them and each of their turns, their fates and final replies.

import { get, path } from "./api.js";
import { clip, count, fact, fill, h, num, signed, statusBadge, versions } from "./dom.js";
import { contentText } from "./session.js";

const FORMULAS = {
  grpo: "A = (r − mean) / (std + ε), over the group",
  drgrpo: "A = r − mean, over the group",
  rloo: "A = r − mean of the group's other rewards",
  reinforce_pp: "A = (r − group mean) / std over the step's whole batch",
};

export async function render(main, [groupId], _params, current) {
  const g = await get(path("api/groups", groupId));
  if (!current()) return;
  fill(main,
    h("div", { class: "crumbs" }, h("a", { href: "#/sessions", text: "Sessions" }), " › ", h("a", { href: `#/sessions?group=${encodeURIComponent(groupId)}`, text: "listed" }), " › ", h("span", { class: "mono", text: `group ${groupId}` })),
    header(g),
    bars(g),
    h("div", { class: "cards", id: "cards" }, g.sessions.map((s) => card(s))),
  );
}

function header(g) {
  const st = g.stats;
  const tasks = [...new Set(g.sessions.map((s) => s.task_id).filter(Boolean))];
  const refs = [...new Set(g.sessions.map((s) => s.reference).filter((r) => r !== null && r !== undefined))];
  const open = g.sessions.filter((s) => s.status === "open").length;
  const evaluation = g.sessions.every((s) => s.eval);
  const notes = [];
  if (evaluation) notes.push(h("div", { class: "note info", text: "An evaluation group: scored, never trained, so no advantages." }));
  else if (open) notes.push(h("div", { class: "note warn", text: `${open} session(s) still open: the trainer claims a group only once none is; these advantages are provisional.` }));
  if (!evaluation && st.n > 1 && st.flat) notes.push(h("div", { class: "note warn", text: "Every reward in this group is equal: no learning signal (the trainer skips it, or trains it as unsolved with [trainer.unsolved])." }));
  if (g.estimator === "reinforce_pp") {
    notes.push(h("div", { class: "note info", text: g.batch_step === null ? "Scale: std over this group alone until a step claims it (then over that step's batch)." : `Scale: std over the batch of step ${g.batch_step}.` }));
  }
  return h(
    "div",
    { class: "panel" },
    h("h1", { class: "mono", text: `group ${g.group_id}` }),
    notes,
    h(
      "div",
      { class: "facts" },
      fact("task", tasks.join(", ") || "–"),
      fact("sessions", h("span", { id: "group-size", text: String(g.sessions.length) })),
      fact("scored", String(st.n)),
      fact("reward mean", num(st.mean)),
      fact("reward std", num(st.std)),
      fact("reward min · max", st.n ? `${num(st.min)} · ${num(st.max)}` : "–"),
      fact("estimator", h("span", { title: FORMULAS[g.estimator] || "", text: g.estimator })),
      fact("advantage", FORMULAS[g.estimator] || "–"),
      fact("reference", refs.length ? refs.map((r) => clip(r, 60)).join(" | ") : "–"),
    ),
  );
}

function bars(g) {
  const values = g.sessions.map((s) => (s.advantage ? Math.abs(s.advantage.value) : 0));
  const scale = Math.max(1e-9, ...values);
  return h(
    "div",
    { class: "panel" },
    h("h2", { text: "Rewards and advantages" }),
    h(
      "div",
      { class: "bars" },
      g.sessions.map((s) => {
        const a = s.advantage ? s.advantage.value : null;
        const width = a === null ? 0 : (Math.abs(a) / scale) * 100;
        return [
          h("a", { class: "mono", href: `#/session/${encodeURIComponent(s.session_id)}`, text: clip(s.session_id, 22) }),
          h("div", { class: "axis" }, a !== null && a < 0 ? h("div", { class: "bar neg", style: { width: `${width}%` } }) : null),
          h("div", { class: "axis" }, a !== null && a > 0 ? h("div", { class: "bar pos", style: { width: `${width}%` } }) : null),
          h("span", { class: "mono" }, `r ${num(s.reward)} · A ${a === null ? "–" : signed(a)}`),
        ];
      }),
    ),
  );
}

function finalReply(message) {
  if (!message) return h("div", { class: "final muted", text: "(no model call)" });
  const calls = (message.tool_calls || []).map((c) => `→ ${c.function ? c.function.name : "?"}(${c.function ? c.function.arguments : ""})`);
  const text = contentText(message.content);
  return h("div", { class: "final", text: [text, ...calls].filter(Boolean).join("\n") || "(empty reply)" });
}

function card(s) {
  const a = s.advantage;
  const why = !a ? (s.eval ? "evaluation" : s.status === "failed" ? "failed: not trained" : s.fate) : a.unsolved ? "trained as unsolved" : a.flat ? "flat group: skipped" : "";
  return h(
    "div",
    { class: "card", data: { sessionId: s.session_id, reward: s.reward, advantage: a ? a.value : null } },
    h("div", {}, h("a", { class: "mono", href: `#/session/${encodeURIComponent(s.session_id)}`, text: s.session_id })),
    h("div", {}, statusBadge(s.status), " ", h("span", { class: "muted", text: s.fate === s.status ? "" : clip(s.fate, 60) })),
    h(
      "div",
      { class: "facts" },
      fact("reward", h("span", { class: "reward", text: num(s.reward) })),
      fact("advantage", h("span", { class: "adv " + (a && a.value > 0 ? "pos" : a && a.value < 0 ? "neg" : ""), text: a ? signed(a.value) : "–" })),
    ),
    a ? h("div", { class: "muted mono", text: `b ${num(a.baseline)} · s ${num(a.scale)}` }) : null,
    why ? h("div", { class: "muted", text: why }) : null,
    s.failure && s.status === "failed" ? h("div", { class: "note bad", text: clip(s.failure, 200) }) : null,
    h(
      "table",
      {},
      h("tr", {}, ["turn", "finish", "r", "G", "A"].map((c) => h("th", { text: c }))),
      s.turns.map((t, i) => h("tr", { data: { nodeId: t.id } }, h("td", { text: `#${i + 1}` }), h("td", { text: t.finish_reason }), h("td", { text: num(t.reward) }), h("td", { text: num(t.return) }), h("td", { text: t.advantage === null ? "–" : signed(t.advantage) }))),
    ),
    h("div", { class: "muted", text: `${count(s.num_completions)} calls · versions ${versions(s.min_version, s.max_version)}` }),
    h("h3", { text: "final reply" }),
    finalReply(s.final),
  );
}
