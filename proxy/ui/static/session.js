// The session page: the conversation tree (branches, tool calls and results, each node's reward,
// return and advantage) beside one node's conversation, its reply as sampled tokens painted by
// logprob or policy version, and its exact prompt on demand.

import { get, path } from "./api.js";
import { clip, duration, fact, fill, h, num, signed, statusBadge, versions, when } from "./dom.js";
import { tokenPanel } from "./tokens.js";

export async function render(main, [id], params, current) {
  const view = await get(path("api/sessions", id));
  if (!current()) return;
  const tree = buildTree(view.completions);
  const state = { view, tree, advantages: new Map(), selected: null, main };
  const wanted = params.get("node");
  state.selected = tree.byId.get(wanted) || view.completions[view.completions.length - 1] || null;
  fill(main,
    h("div", { class: "crumbs" }, h("a", { href: "#/sessions", text: "Sessions" }), groupCrumb(view), " › ", h("span", { class: "mono", text: view.session_id })),
    header(view, tree),
    view.completions.length
      ? h("div", { class: "split" }, h("div", { class: "panel tree", id: "tree" }), h("div", { id: "detail" }))
      : h("p", { class: "muted", text: "This session recorded no model call." }),
  );
  if (view.completions.length) {
    drawTree(state);
    drawDetail(state);
  }
  if (view.group_id) loadAdvantages(state, current);
}

function groupCrumb(view) {
  if (!view.group_id) return null;
  return [" › ", h("a", { href: `#/group/${encodeURIComponent(view.group_id)}`, text: `group ${view.group_id}` })];
}

// -- the tree -----------------------------------------------------------------------------

function buildTree(nodes) {
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const children = new Map();
  const roots = [];
  nodes.forEach((n, i) => (n.index = i + 1)); // creation order: #1 is the first call
  for (const n of nodes) {
    if (n.parent_id && byId.has(n.parent_id)) {
      if (!children.has(n.parent_id)) children.set(n.parent_id, []);
      children.get(n.parent_id).push(n);
    } else roots.push(n);
  }
  const order = [];
  const walk = (node, indent, last, top) => {
    order.push({ node, guide: top ? "" : indent + (last ? "└ " : "├ ") });
    const kids = children.get(node.id) || [];
    kids.forEach((kid, i) => walk(kid, top ? "" : indent + (last ? "  " : "│ "), i === kids.length - 1, false));
  };
  roots.forEach((r) => walk(r, "", true, true));
  return { byId, children, roots, order };
}

function header(view, tree) {
  const branches = [...tree.children.values()].filter((kids) => kids.length > 1).length;
  const took = view.finished_at ? view.finished_at - view.created_at : null;
  const facts = h(
    "div",
    { class: "facts" },
    fact("status", [statusBadge(view.status), view.eval ? [" ", h("span", { class: "badge eval", text: "eval" })] : null]),
    fact("fate", view.fate),
    fact("reward", h("span", { class: "big", id: "session-reward", data: { value: view.reward }, text: num(view.reward) })),
    fact("advantage", h("span", { id: "session-advantage", class: "muted", text: view.group_id ? "…" : "no group" })),
    fact("task", view.task_id ?? "–"),
    fact("group", view.group_id ? h("a", { href: `#/group/${encodeURIComponent(view.group_id)}`, text: view.group_id }) : "–"),
    fact("reward function", view.reward_fn ?? "–"),
    fact("reference", view.reference ?? "–"),
    fact("model calls", h("span", { id: "node-count", text: String(view.completions.length) })),
    fact("roots · branches", `${tree.roots.length} · ${branches}`),
    fact("history rewrites", String(view.history_rewrites)),
    fact("policy versions", versions(view.min_version, view.max_version)),
    fact("created", when(view.created_at)),
    fact("took", duration(took)),
    fact("temperature", view.temperature === null ? "as requested" : `forced ${num(view.temperature)}`),
    fact("claimed by", view.claimed_step === null ? "–" : `step ${view.claimed_step}`),
  );
  const meta = Object.keys(view.metadata || {}).length
    ? h("details", {}, h("summary", { text: "metadata" }), h("pre", { text: JSON.stringify(view.metadata, null, 2) }))
    : null;
  const failure = view.status === "failed" && view.failure ? h("div", { class: "note bad", id: "failure", text: view.failure }) : null;
  const undecoded = view.tokens_decoded ? null : h("div", { class: "note warn", text: "No tokenizer could be loaded for this model: tokens are shown as ids (areal-proxy ui --model)." });
  return h("div", { class: "panel" }, h("h1", { class: "mono", text: view.session_id }), failure, undecoded, facts, meta);
}

function whatItDid(node) {
  const calls = node.response && node.response.tool_calls;
  if (calls && calls.length) return "→ " + calls.map((c) => (c.function ? c.function.name : "?")).join(", ");
  const text = contentText(node.response && node.response.content);
  return text ? `“${clip(text, 70)}”` : "(empty reply)";
}

function drawTree(state) {
  const box = state.main.querySelector("#tree");
  fill(box,
    h("h2", { text: "Conversation tree" }),
    state.tree.order.map(({ node, guide }) => {
      const kids = (state.tree.children.get(node.id) || []).length;
      const adv = state.advantages.get(node.id);
      return h(
        "button",
        {
          type: "button",
          class: "node" + (state.selected && state.selected.id === node.id ? " selected" : ""),
          data: { nodeId: node.id, reward: node.reward, return: node.return, depth: node.depth },
          onclick: () => select(state, node),
        },
        h("div", { class: "line1" }, h("span", { class: "guide", text: guide }), h("span", { class: "idx", text: `#${node.index}` }), h("span", { class: "what", text: whatItDid(node) })),
        h(
          "div",
          { class: "line2" },
          h("span", { class: "guide", text: guide.replace(/[├└]/g, "│").replace(/│ $/, "  ") }),
          h("span", { text: node.finish_reason }),
          h("span", {}, "out ", h("b", { text: String(node.output_ids.length) })),
          h("span", {}, "r ", h("b", { class: "r", text: num(node.reward) })),
          h("span", {}, "G ", h("b", { class: "g", text: num(node.return) })),
          adv === undefined ? null : h("span", {}, "A ", h("b", { class: "a " + (adv > 0 ? "pos" : adv < 0 ? "neg" : ""), text: signed(adv) })),
          node.segment_start ? h("span", { class: "badge seg", text: "new sequence" }) : null,
          kids > 1 ? h("span", { class: "badge", text: `${kids} branches` }) : null,
        ),
      );
    }),
  );
}

function select(state, node) {
  state.selected = node;
  const url = new URL(location.href);
  url.hash = `#/session/${encodeURIComponent(state.view.session_id)}?node=${encodeURIComponent(node.id)}`;
  history.replaceState(null, "", url); // a shareable link to this node, without re-rendering the page
  for (const el of state.main.querySelectorAll(".node")) el.classList.toggle("selected", el.dataset.nodeId === node.id);
  drawDetail(state);
}

async function loadAdvantages(state, current) {
  const target = state.main.querySelector("#session-advantage");
  try {
    const group = await get(path("api/groups", state.view.group_id));
    if (!current()) return;
    const mine = group.sessions.find((s) => s.session_id === state.view.session_id);
    if (!mine || !mine.advantage) {
      const v = state.view;
      target.textContent = v.eval ? "evaluation: not trained" : v.status === "failed" ? "failed: not trained" : v.status === "open" ? "still open" : v.fate;
      return;
    }
    for (const turn of mine.turns) if (turn.advantage !== null) state.advantages.set(turn.id, turn.advantage);
    const a = mine.advantage;
    target.textContent = `${signed(a.value)} (${group.estimator}${a.flat ? (a.unsolved ? ", unsolved" : ", flat group: skipped") : ""})`;
    target.className = a.value > 0 ? "pos" : a.value < 0 ? "neg" : "";
    target.dataset.value = a.value;
    if (state.selected) {
      drawTree(state);
      drawDetail(state);
    }
  } catch (error) {
    target.textContent = `unavailable: ${error.message}`;
  }
}

// -- one node -----------------------------------------------------------------------------

function conversation(state, node) {
  const chain = [];
  for (let n = node; n; n = state.tree.byId.get(n.parent_id)) chain.unshift(n);
  const messages = [];
  chain.forEach((n, i) => {
    if (i > 0) messages.push({ message: chain[i - 1].response, from: chain[i - 1], sampled: true });
    for (const m of n.new_messages) messages.push({ message: m, from: n, sampled: false });
  });
  return messages;
}

export function contentText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content
      .map((part) => {
        if (typeof part === "string") return part;
        if (part && typeof part.text === "string") return part.text;
        if (part && typeof part.content === "string") return part.content;
        return `[${(part && part.type) || "part"}]`;
      })
      .join("\n");
  }
  return JSON.stringify(content, null, 2);
}

function prettyArguments(args) {
  if (typeof args !== "string") return JSON.stringify(args, null, 2);
  try {
    return JSON.stringify(JSON.parse(args), null, 2);
  } catch {
    return args; // the model's broken JSON, as it sampled it
  }
}

function messageBox(message, extra = {}) {
  const role = message.role || "?";
  const calls = (message.tool_calls || []).map((c) =>
    h("div", { class: "call" }, h("span", { class: "name", text: c.function ? c.function.name : "?" }), h("span", { class: "muted", text: c.id ? `  ${c.id}` : "" }), h("pre", { text: prettyArguments(c.function ? c.function.arguments : c) })),
  );
  const text = contentText(message.content);
  return h(
    "div",
    { class: `msg ${role} ${extra.cls || ""}`, data: { role } },
    h("div", { class: "role" }, role, message.tool_call_id ? h("span", { class: "mono", text: `result of ${message.tool_call_id}` }) : null, message.name ? h("span", { class: "mono", text: message.name }) : null, extra.label || null),
    message.reasoning_content ? h("details", {}, h("summary", { text: "reasoning" }), h("div", { class: "body", text: message.reasoning_content })) : null,
    text ? h("div", { class: "body", text }) : calls.length ? null : h("div", { class: "body muted", text: "(no content)" }),
    calls,
  );
}

function nodeFacts(state, node) {
  const lps = node.output_logprobs;
  const mean = lps.length ? lps.reduce((a, b) => a + b, 0) / lps.length : null;
  const min = lps.length ? Math.min(...lps) : null;
  const unlikely = lps.filter((lp) => Math.exp(lp) < 0.1).length;
  const parent = state.tree.byId.get(node.parent_id);
  const vs = node.output_versions.length ? versions(Math.min(...node.output_versions), Math.max(...node.output_versions)) : "–";
  const adv = state.advantages.get(node.id);
  const sampling = node.sampling || {};
  return h(
    "div",
    { class: "facts", id: "node-facts" },
    fact("reward", h("span", { id: "node-reward", data: { value: node.reward }, text: num(node.reward) })),
    fact("return", h("span", { id: "node-return", data: { value: node.return }, text: num(node.return) })),
    fact("advantage", adv === undefined ? "–" : h("span", { class: adv > 0 ? "pos" : adv < 0 ? "neg" : "", text: signed(adv) })),
    fact("finish", node.finish_reason),
    fact("sampled tokens", String(node.output_ids.length)),
    fact("prompt tokens", `${node.prompt_len} (${node.new_prompt_tokens} new)`),
    fact("mean logprob", num(mean)),
    fact("min logprob", num(min)),
    fact("tokens with p < 0.1", String(unlikely)),
    fact("policy versions", vs),
    fact("temperature", num(node.temperature)),
    fact("max tokens", sampling.max_tokens ?? "–"),
    fact("api", node.api),
    fact("created", when(node.created_at)),
    fact("after parent", parent ? duration(node.created_at - parent.created_at) : "root"),
    fact("id", h("span", { class: "mono", text: node.id })),
  );
}

function drawDetail(state) {
  const node = state.selected;
  const box = state.main.querySelector("#detail");
  const messages = conversation(state, node);
  const earlier = messages.filter((m) => m.from !== node);
  const mine = messages.filter((m) => m.from === node);
  const parent = state.tree.byId.get(node.parent_id);
  fill(box,
    h(
      "div",
      { class: "panel" },
      h("h2", {}, `Call #${node.index}`, h("span", { class: "muted", text: ` · depth ${node.depth}` })),
      node.segment_start
        ? h(
            "div",
            { class: "note warn", id: "segment-note" },
            "New token sequence: the chat template re-rendered the history, so this prompt does not extend the tokens of ",
            h("a", { href: "#", onclick: (e) => (e.preventDefault(), select(state, parent)), text: `#${parent.index}` }),
            ". Its sequence is trained as a sample of its own; returns still flow through the link. Open the prompt below to see where it departs.",
          )
        : null,
      nodeFacts(state, node),
    ),
    h(
      "div",
      { class: "panel" },
      h("h2", { text: "Conversation" }),
      earlier.length
        ? h("details", {}, h("summary", { text: `${earlier.length} earlier messages (turns #1…#${parent ? parent.index : "?"})` }), earlier.map((m) => messageBox(m.message, { cls: m.sampled ? "sampled" : "", label: m.sampled ? h("a", { href: "#", onclick: (e) => (e.preventDefault(), select(state, m.from)), text: `reply of #${m.from.index}` }) : null })))
        : null,
      mine.map((m) => messageBox(m.message)),
      node.prompt ? h("div", { class: "msg user" }, h("div", { class: "role", text: "prompt (completions API)" }), h("div", { class: "body", text: typeof node.prompt === "string" ? node.prompt : JSON.stringify(node.prompt) })) : null,
      messageBox(node.response || {}, { cls: "reply", label: h("span", { text: `reply · ${node.finish_reason}` }) }),
    ),
    h("div", { class: "panel" }, h("h2", { text: "Sampled tokens" }), tokenPanel(node)),
    promptPanel(state, node),
  );
}

function promptPanel(state, node) {
  const body = h("div", { class: "prompt" }, h("p", { class: "muted", text: "loading…" }));
  const details = h("details", { class: "panel", id: "prompt-panel" }, h("summary", { text: `Prompt: ${node.prompt_len} tokens, ${node.new_prompt_tokens} new in this call` }), body);
  let loaded = false;
  details.addEventListener("toggle", async () => {
    if (!details.open || loaded) return;
    loaded = true;
    try {
      const p = await get(path("api/sessions", state.view.session_id, "prompts", node.id));
      fill(body, ...promptBody(p));
    } catch (error) {
      fill(body, h("p", { class: "error", text: error.message }));
    }
  });
  return details;
}

const SHOWN = 3000; // characters of the inherited prompt shown before "show all"

function promptBody(p) {
  const out = [];
  if (p.divergence) {
    const d = p.divergence;
    out.push(
      h(
        "div",
        { class: "diverge" },
        h("p", {}, `This prompt repeats the parent's sequence for ${d.at} of its ${d.parent_tokens} tokens (prompt + reply), then departs:`),
        d.common_text !== undefined
          ? h("pre", { class: "tokens" }, h("span", { class: "muted", text: d.common_text }), h("span", { class: "was", title: "the parent's sequence went on", text: d.parent_text || "(end)" }))
          : null,
        d.common_text !== undefined ? h("pre", { class: "tokens" }, h("span", { class: "muted", text: d.common_text }), h("span", { class: "now", title: "this prompt has instead", text: d.prompt_text || "(end)" })) : null,
        h("div", { class: "legend" }, h("span", {}, h("span", { class: "swatch was" }), "parent's sequence"), h("span", {}, h("span", { class: "swatch now" }), "this prompt")),
      ),
    );
  }
  if (p.inherited_text !== undefined) {
    const inherited = h("span", { class: "inherited" });
    const full = p.inherited_text;
    const showAll = () => (inherited.textContent = full);
    if (full.length > SHOWN) {
      inherited.append(h("button", { type: "button", class: "link", text: `… ${full.length - SHOWN} more characters`, onclick: showAll }), full.slice(-SHOWN));
    } else inherited.textContent = full;
    out.push(h("pre", { class: "tokens" }, inherited, h("span", { class: "new", text: p.new_text })));
    out.push(h("div", { class: "legend" }, h("span", {}, h("span", { class: "swatch prompt-new" }), `new in this call (${p.ids.length - p.inherited} tokens)`), h("span", { class: "muted", text: `from the parent's sequence: ${p.inherited} tokens` })));
  }
  out.push(h("details", {}, h("summary", { text: "token ids" }), h("pre", { class: "mono", text: JSON.stringify(p.ids) })));
  return out;
}
