// Small SVG line charts for the run page: several series over training steps, an optional interval
// band (an evaluation's 95% interval), gaps where a value is missing, red marks where it was NaN,
// and a crosshair that reads every series at the step under the pointer.

import { h, num, s, tooltip } from "./dom.js";

const W = 560;
const M = { left: 52, right: 14, top: 10, bottom: 26 };
const MAX_POINTS = 2000; // beyond, every k-th point is drawn (the last one always)
export const COLOURS = ["#2f5dd3", "#e07b00", "#1c8a4a", "#c2352b", "#7c4dcc", "#0f8b8d", "#8a6d3b", "#d6457a"];

function niceStep(range, count) {
  const raw = range / count;
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  const error = raw / power;
  return power * (error >= 7.5 ? 10 : error >= 3.5 ? 5 : error >= 1.5 ? 2 : 1);
}

function ticks(lo, hi, count) {
  const step = niceStep(hi - lo, count);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  return out;
}

function domain(values, padFraction) {
  let lo = Math.min(...values);
  let hi = Math.max(...values);
  if (lo === hi) {
    const pad = lo === 0 ? 1 : Math.abs(lo) * 0.1;
    return [lo - pad, hi + pad];
  }
  const pad = (hi - lo) * padFraction;
  return [lo - pad, hi + pad];
}

function thin(points) {
  if (points.length <= MAX_POINTS) return points;
  const k = Math.ceil(points.length / MAX_POINTS);
  return points.filter((_, i) => i % k === 0 || i === points.length - 1);
}

// series: [{ name, points: [[x, y]], band?: [[x, low, high]], dashed? }]; y may be NaN (drawn as a gap
// with a red mark) or null (a gap).
export function lineChart({ key, title, series, height = 210, note = null }) {
  const H = height;
  const finite = (v) => typeof v === "number" && Number.isFinite(v);
  const xs = [];
  const ys = [];
  for (const se of series) {
    for (const [x, y] of se.points) if (finite(x) && finite(y)) (xs.push(x), ys.push(y));
    for (const [x, lo, hi] of se.band || []) if (finite(x) && finite(lo) && finite(hi)) (xs.push(x), ys.push(lo, hi));
  }
  const legend = h(
    "div",
    { class: "series-legend" },
    series.map((se, i) => h("span", {}, h("span", { class: "swatch", style: { background: COLOURS[i % COLOURS.length] } }), se.name)),
  );
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  const box = h("div", { class: "panel chart", data: { chart: key } }, h("h2", { text: title }), legend, svg, note);
  if (!xs.length) {
    svg.append(s("text", { class: "empty", x: W / 2, y: H / 2, "text-anchor": "middle", text: "no data yet" }));
    return box;
  }
  const [x0, x1] = xs.length === 1 ? [xs[0] - 1, xs[0] + 1] : [Math.min(...xs), Math.max(...xs)];
  const [y0, y1] = domain(ys, 0.06);
  const X = (x) => M.left + ((x - x0) / (x1 - x0)) * (W - M.left - M.right);
  const Y = (y) => H - M.bottom - ((y - y0) / (y1 - y0)) * (H - M.top - M.bottom);
  const grid = s("g", { class: "grid" });
  const axis = s("g", { class: "axis" });
  for (const t of ticks(y0, y1, 4)) {
    grid.append(s("line", { x1: M.left, x2: W - M.right, y1: Y(t), y2: Y(t) }));
    axis.append(s("text", { x: M.left - 6, y: Y(t) + 3.5, "text-anchor": "end", text: num(t, 3) }));
  }
  // Steps are whole numbers: no tick at step 1.5 (with few steps, each step is a tick).
  const integral = xs.every(Number.isInteger);
  let xTicks = ticks(x0, x1, 6);
  if (integral) xTicks = xTicks.filter(Number.isInteger);
  if (integral && xTicks.length < 2) xTicks = [...new Set(xs)].sort((a, b) => a - b);
  for (const t of xTicks) {
    axis.append(s("text", { x: X(t), y: H - M.bottom + 15, "text-anchor": "middle", text: num(t, 4) }));
  }
  axis.append(s("line", { x1: M.left, x2: W - M.right, y1: H - M.bottom, y2: H - M.bottom }));
  svg.append(grid, axis);
  series.forEach((se, i) => {
    const colour = COLOURS[i % COLOURS.length];
    const band = (se.band || []).filter(([x, lo, hi]) => finite(x) && finite(lo) && finite(hi));
    if (band.length) {
      const upper = band.map(([x, , hi]) => `${X(x)},${Y(hi)}`);
      const lower = band.map(([x, lo]) => `${X(x)},${Y(lo)}`).reverse();
      svg.append(s("polygon", { points: [...upper, ...lower].join(" "), fill: colour, "fill-opacity": band.length > 1 ? 0.16 : 0, stroke: "none" }));
      for (const [x, lo, hi] of band) svg.append(s("line", { x1: X(x), x2: X(x), y1: Y(lo), y2: Y(hi), stroke: colour, "stroke-opacity": 0.55, "stroke-width": 2 }));
    }
    const points = thin(se.points);
    let d = "";
    let pen = false;
    let drawn = 0;
    for (const [x, y] of points) {
      if (finite(x) && finite(y)) {
        d += `${pen ? "L" : "M"}${X(x).toFixed(1)},${Y(y).toFixed(1)}`;
        pen = true;
        drawn++;
      } else {
        pen = false;
        if (finite(x) && (y === "NaN" || Number.isNaN(y) || y === "Infinity" || y === "-Infinity")) {
          svg.append(s("path", { d: `M${X(x)},${H - M.bottom} l-4,7 h8 z`, fill: "#c2352b", class: "nan-mark" }));
        }
      }
    }
    svg.append(
      s("path", {
        d: d || "M0,0",
        fill: "none",
        stroke: colour,
        "stroke-width": 1.8,
        "stroke-dasharray": se.dashed ? "5 4" : null,
        "stroke-linejoin": "round",
        data: { series: se.name, points: se.points.filter(([x, y]) => finite(x) && finite(y)).length },
      }),
    );
    if (drawn <= 40) {
      for (const [x, y] of points) if (finite(x) && finite(y)) svg.append(s("circle", { cx: X(x), cy: Y(y), r: 2.6, fill: colour }));
    }
  });
  crosshair(svg, series, X, x0, x1, H);
  return box;
}

function crosshair(svg, series, X, x0, x1, H) {
  const steps = [...new Set(series.flatMap((se) => se.points.map(([x]) => x)).filter(Number.isFinite))].sort((a, b) => a - b);
  const line = s("line", { y1: M.top, y2: H - M.bottom, visibility: "hidden" });
  const hover = s("g", { class: "hover" }, line);
  const area = s("rect", { x: M.left, y: M.top, width: W - M.left - M.right, height: H - M.top - M.bottom, fill: "transparent" });
  svg.append(hover, area);
  let at = null;
  area.addEventListener("mousemove", (e) => {
    const r = svg.getBoundingClientRect();
    const x = x0 + (((e.clientX - r.left) * (W / r.width) - M.left) / (W - M.left - M.right)) * (x1 - x0);
    at = steps.reduce((best, v) => (best === null || Math.abs(v - x) < Math.abs(best - x) ? v : best), null);
    if (at === null) return;
    line.setAttribute("x1", X(at));
    line.setAttribute("x2", X(at));
    line.setAttribute("visibility", "visible");
  });
  area.addEventListener("mouseleave", () => line.setAttribute("visibility", "hidden"));
  tooltip(area, () => {
    if (at === null) return "";
    const lines = [`step ${at}`];
    for (const se of series) {
      const p = se.points.find(([x]) => x === at);
      if (p) lines.push(`${se.name}: ${num(p[1])}`);
      const b = (se.band || []).find(([x]) => x === at);
      if (b) lines.push(`  interval ${num(b[1])} … ${num(b[2])}`);
    }
    return lines.join("\n");
  });
}
