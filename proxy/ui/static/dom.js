// Building the page from data without ever parsing it as HTML: every string recorded by the
// proxy (model text, tool arguments, ids) enters the document as a text node.

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  setProps(el, props);
  append(el, children);
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";

export function s(tag, props, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setProps(el, props);
  append(el, children);
  return el;
}

function setProps(el, props) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.setAttribute("class", value);
    else if (key === "text") el.textContent = value;
    else if (key === "style") Object.assign(el.style, value);
    else if (key === "data") for (const [k, v] of Object.entries(value)) el.dataset[k] = v === null ? "" : String(v);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
}

// Replace an element's children (arrays flattened, nulls skipped).
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

// -- formatting --------------------------------------------------------------------------

export function num(x, digits = 4) {
  if (x === null || x === undefined) return "–";
  if (typeof x === "string") return x; // "NaN", "Infinity": the run log's non-finite numbers
  if (typeof x === "boolean") return String(x);
  if (Number.isInteger(x)) return String(x);
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return x.toExponential(2);
  return String(Number(x.toPrecision(digits)));
}

export function signed(x) {
  if (x === null || x === undefined) return "–";
  const t = num(x);
  return x > 0 ? "+" + t : t;
}

export function count(n) {
  return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US");
}

function pad(n) {
  return String(n).padStart(2, "0");
}

export function when(ts) {
  if (!ts) return "–";
  const d = new Date(ts * 1000);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
  return `${Math.floor(seconds / 3600)} h ${Math.round((seconds % 3600) / 60)} min`;
}

export function ago(ts) {
  if (!ts) return "–";
  const s = Date.now() / 1000 - ts;
  if (s < 0) return "just now";
  return duration(s) + " ago";
}

export function versions(lo, hi) {
  if (lo === null || lo === undefined) return "–";
  return lo === hi ? String(lo) : `${lo}…${hi}`;
}

export function clip(text, n) {
  text = String(text ?? "").replace(/\s+/g, " ").trim();
  return text.length > n ? text.slice(0, n - 1) + "…" : text;
}

export function statusBadge(status) {
  return h("span", { class: `badge ${status}`, text: status });
}

export function fact(key, value, extra = {}) {
  return h("div", { class: "fact", ...extra }, h("div", { class: "k", text: key }), h("div", { class: "v" }, value));
}

// -- a tooltip that follows the pointer (title attributes are slow and unstyled) -----------

let tip = null;

export function tooltip(el, text) {
  el.addEventListener("mousemove", (e) => {
    tip ??= document.body.appendChild(h("div", { class: "tipbox" }));
    tip.textContent = typeof text === "function" ? text() : text;
    tip.hidden = false;
    const x = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    const y = e.clientY + 18 + tip.offsetHeight > window.innerHeight ? e.clientY - tip.offsetHeight - 10 : e.clientY + 18;
    tip.style.left = `${x}px`;
    tip.style.top = `${y}px`;
  });
  el.addEventListener("mouseleave", () => {
    if (tip) tip.hidden = true;
  });
}

export function hideTooltip() {
  if (tip) tip.hidden = true;
}
