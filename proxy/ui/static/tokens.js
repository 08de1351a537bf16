// A reply's sampled tokens as text, painted by how likely the policy found each one (behaviour
// logprob) or by the policy version that sampled it: where a reply went wrong, or where a
// weight update landed mid-reply, is visible at a glance. Hovering a token gives its numbers.

import { fill, h, tooltip } from "./dom.js";

const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
const SPECIAL = /^(<\|[^|]*\|>|<\/?s>|<\/?think>|\[\/?INST\])$/;
const MODES = [
  ["logprob", "logprob"],
  ["version", "policy version"],
  ["plain", "plain"],
];
let mode = "logprob"; // kept while the reader moves between nodes

function logprobColour(lp) {
  const p = Math.exp(lp);
  if (p >= 0.999) return "";
  const alpha = Math.min(0.9, Math.pow(1 - p, 0.8) * 0.9);
  return `rgba(214, 40, 40, ${alpha.toFixed(3)})`;
}

function versionColour(v, distinct) {
  return PALETTE[distinct.indexOf(v) % PALETTE.length] + "66";
}

export function tokenPanel(node) {
  const box = h("div");
  const draw = () => fill(box, toolbar(draw), legend(node), tokens(node));
  draw();
  return box;
}

function toolbar(redraw) {
  return h(
    "div",
    { class: "toolbar" },
    h("span", { class: "muted", text: "heat:" }),
    MODES.map(([value, text]) =>
      h("button", {
        type: "button",
        class: mode === value ? "on" : "",
        data: { heat: value },
        text,
        onclick: () => {
          mode = value;
          redraw();
        },
      }),
    ),
  );
}

function legend(node) {
  if (mode === "logprob") {
    return h(
      "div",
      { class: "legend" },
      [1, 0.5, 0.1, 0.01].map((p) => h("span", {}, h("span", { class: "swatch", style: { background: logprobColour(Math.log(p)) || "transparent" } }), `p = ${p}`)),
      h("span", { text: "(behaviour probability of each sampled token; forced tokens have p = 1)" }),
    );
  }
  if (mode === "version") {
    const distinct = [...new Set(node.output_versions)].sort((a, b) => a - b);
    return h(
      "div",
      { class: "legend" },
      distinct.map((v) => h("span", {}, h("span", { class: "swatch", style: { background: versionColour(v, distinct) } }), `v${v}: ${node.output_versions.filter((x) => x === v).length} tokens`)),
      distinct.length > 1 ? h("span", { class: "error", text: "weights changed during this reply" }) : null,
    );
  }
  return h("div", { class: "legend" });
}

function tokens(node) {
  const distinct = [...new Set(node.output_versions)].sort((a, b) => a - b);
  const pieces = node.output_pieces;
  const out = h("div", { class: "tokens", id: "tokens" });
  node.output_ids.forEach((id, i) => {
    const piece = pieces ? pieces[i] : `[${id}]`;
    const lp = node.output_logprobs[i];
    const v = node.output_versions[i];
    let cls = "tok";
    if (piece === "") cls += " empty";
    if (SPECIAL.test(piece)) cls += " special";
    const span = h("span", { class: cls, text: piece.replace(/\n/g, "↵\n") });
    if (mode === "logprob") span.style.background = logprobColour(lp);
    else if (mode === "version") span.style.background = versionColour(v, distinct);
    tooltip(span, () => `#${i}  id ${id}\n${JSON.stringify(piece)}${piece === "" ? " (part of the next token's character)" : ""}\nlogprob ${lp.toFixed(4)}  p ${Math.exp(lp).toFixed(4)}\nversion ${v}`);
    out.append(span);
  });
  if (!node.output_ids.length) out.append(h("span", { class: "muted", text: "(no token sampled)" }));
  return out;
}
