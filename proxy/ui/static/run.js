// The run page: the run's metrics.jsonl as curves (reward, accuracy, evaluation with its interval,
// staleness, throughput, loss), updated live by polling for the lines added since the last read.

import { get } from "./api.js";
import { lineChart } from "./chart.js";
import { ago, count, fact, fill, h, num } from "./dom.js";

const POLL_MS = 5000;
const SHOWN = new Set(["step", "time", "version"]);

function value(v) {
  if (typeof v === "number") return v;
  if (v === "NaN") return NaN; // the run log's non-finite numbers come as strings
  if (v === "Infinity") return Infinity;
  if (v === "-Infinity") return -Infinity;
  return null;
}

function points(rows, key) {
  return rows.filter((r) => key in r && "step" in r).map((r) => [r.step, value(r[key])]);
}

function mean(values) {
  const ok = values.filter(Number.isFinite);
  return ok.length ? ok.reduce((a, b) => a + b, 0) / ok.length : null;
}

function isEval(row) {
  return Object.keys(row).some((k) => k.startsWith("eval_"));
}

function charts(rows, chosen, choose) {
  const train = rows.filter((r) => "reward_mean" in r);
  const evals = rows.filter((r) => isEval(r) && "eval_accuracy" in r);
  const passAt = [...new Set(evals.flatMap((r) => Object.keys(r).filter((k) => /^eval_pass_at_\d+$/.test(k))))].sort();
  const line = (key, name = key, extra = {}) => ({ name, points: points(rows, key), ...extra });
  const numeric = [...new Set(rows.flatMap((r) => Object.keys(r).filter((k) => !SHOWN.has(k) && value(r[k]) !== null)))].sort();
  const picker = h(
    "select",
    { id: "metric-picker", onchange: (e) => choose(e.target.value) },
    numeric.map((k) => h("option", { value: k, text: k, selected: k === chosen })),
  );
  return [
    lineChart({ key: "reward", title: "Reward and accuracy (training samples)", series: [line("reward_mean", "reward mean"), line("accuracy")] }),
    lineChart({
      key: "eval",
      title: "Evaluation (held-out, never trained on)",
      series: [
        { name: "accuracy (95% interval)", points: points(evals, "eval_accuracy"), band: evals.filter((r) => "eval_accuracy_low" in r).map((r) => [r.step, value(r.eval_accuracy_low), value(r.eval_accuracy_high)]) },
        { name: "reward mean", points: points(evals, "eval_reward_mean"), dashed: true },
        ...passAt.map((k) => ({ name: k.replace("eval_pass_at_", "pass@"), points: points(evals, k), dashed: true })),
      ],
      note: evals.length ? null : h("p", { class: "muted", text: "No evaluation yet: [eval] in the run's config evaluates every few steps." }),
    }),
    lineChart({ key: "loss", title: "Loss", series: [line("loss")] }),
    lineChart({ key: "grad_norm", title: "Gradient norm", series: [line("grad_norm", "grad norm")] }),
    lineChart({ key: "staleness", title: "Staleness (policy versions behind)", series: [line("staleness_mean", "mean"), line("staleness_max", "max")] }),
    lineChart({ key: "throughput", title: "Throughput", series: [line("samples_per_s", "samples/s (train)")] }),
    lineChart({ key: "step_time", title: "Step time (s)", series: [line("wait_s", "waiting for sessions"), line("train_s", "training"), line("push_s", "pushing weights")] }),
    lineChart({ key: "batch", title: "Each step's sessions", series: [line("sessions", "claimed"), line("samples", "trained samples"), line("skipped_zero_variance", "skipped (flat group)"), line("dropped_stale", "dropped stale")] }),
    lineChart({ key: "lr", title: "Learning rate", series: [line("lr", "lr")] }),
    train.length || numeric.length
      ? h("div", {}, lineChart({ key: "picked", title: "Any metric", series: chosen ? [line(chosen)] : [] }), h("div", { class: "toolbar" }, h("span", { class: "muted", text: "metric:" }), picker))
      : null,
  ];
}

function warnings(rows) {
  const out = [];
  const bad = rows.filter((r) => ["loss", "grad_norm", "reward_mean"].some((k) => k in r && !Number.isFinite(value(r[k]))));
  if (bad.length) out.push(h("div", { class: "note bad", text: `Non-finite loss, gradient norm or reward at step ${bad.slice(0, 12).map((r) => r.step).join(", ")}${bad.length > 12 ? ", …" : ""}.` }));
  const last = rows.filter((r) => "reward_mean" in r).at(-1);
  if (last && last.stalled_steps) out.push(h("div", { class: "note warn", text: `Nothing trained in the last ${last.stalled_steps} steps: every group scored alike (see trainer.log).` }));
  const failed = rows.filter((r) => "eval_error" in r);
  if (failed.length) out.push(h("div", { class: "note warn", text: `Evaluation failed at step ${failed.map((r) => r.step).join(", ")}: ${failed.at(-1).eval_error}` }));
  return out;
}

function tiles(rows, data) {
  const train = rows.filter((r) => "reward_mean" in r);
  const last = train.at(-1) || {};
  const recent = train.slice(-10);
  // A step that trained nothing logs no loss: show the latest value there is, and its step.
  const latest = (key) => {
    const row = train.findLast((r) => key in r);
    if (!row) return "–";
    return row === last ? num(value(row[key])) : `${num(value(row[key]))} @${row.step}`;
  };
  const lastEval = rows.filter((r) => isEval(r) && "eval_accuracy" in r).at(-1);
  const t = data.training || {};
  const newest = rows.reduce((m, r) => Math.max(m, r.time || 0), 0);
  const live = newest && Date.now() / 1000 - newest < 120;
  return [
    h(
      "div",
      { class: "facts" },
      fact("step", h("span", { class: "big", id: "run-step", text: String(last.step ?? "–") })),
      fact("policy version", String(last.version ?? "–")),
      fact("reward (last 10)", num(mean(recent.map((r) => value(r.reward_mean))))),
      fact("accuracy (last 10)", num(mean(recent.map((r) => value(r.accuracy))))),
      fact("eval accuracy", lastEval ? `${num(value(lastEval.eval_accuracy))} [${num(value(lastEval.eval_accuracy_low))}, ${num(value(lastEval.eval_accuracy_high))}] @${lastEval.step}` : "–"),
      fact("staleness mean · max", last.staleness_mean === undefined ? "–" : `${num(value(last.staleness_mean))} · ${num(value(last.staleness_max))}`),
      fact("samples/s", latest("samples_per_s")),
      fact("loss", latest("loss")),
      fact("grad norm", latest("grad_norm")),
      fact("learning rate", latest("lr")),
      fact("metric rows", h("span", { id: "run-rows", text: count(rows.length) })),
      fact("updated", h("span", { class: live ? "live" : "live stale", id: "run-updated", data: { time: newest }, text: newest ? ago(newest) : "–" })),
    ),
    h(
      "div",
      { class: "counts" },
      h("span", { text: "training sessions:" }),
      ["open", "finished", "training", "trained", "skipped", "dropped_stale", "failed"].map((k) => h("span", {}, h("b", { text: count(t[k] ?? 0) }), ` ${k.replace("_", " ")}`)),
    ),
  ];
}

export async function render(main, _args, _params, current) {
  const rows = [];
  let offset = 0;
  let data = null;
  let chosen = null;
  let timer = null;
  let stopped = false;
  const draw = () => {
    if (!chosen) chosen = ["loss", "reward_mean"].find((k) => rows.some((r) => k in r)) || null;
    fill(main,
      h("h1", {}, "Run ", h("span", { class: "muted mono", text: data.run_dir })),
      data.exists ? null : h("div", { class: "note info", text: `No metrics.jsonl in ${data.run_dir} yet; this page updates as soon as the trainer writes one (areal-proxy ui --run-dir DIR).` }),
      warnings(rows),
      h("div", { class: "panel" }, tiles(rows, data)),
      h("div", { class: "charts" }, charts(rows, chosen, (k) => ((chosen = k), draw()))),
    );
  };
  const poll = async () => {
    data = await get("api/run", { offset });
    if (data.reset) rows.length = 0;
    const changed = data.rows.length > 0 || offset === 0 || data.reset;
    rows.push(...data.rows);
    offset = data.offset;
    return changed;
  };
  await poll();
  if (!current()) return;
  draw();
  const tick = async () => {
    try {
      if (!document.hidden && (await poll()) && !stopped) draw();
      const updated = main.querySelector("#run-updated");
      if (updated && Number(updated.dataset.time)) updated.textContent = ago(Number(updated.dataset.time));
    } catch (error) {
      if (stopped) return;
      main.prepend(h("div", { class: "note bad", text: `updating stopped: ${error.message}` }));
      return; // a refused key or a gone server: the reader reloads
    }
    if (!stopped) timer = setTimeout(tick, POLL_MS);
  };
  timer = setTimeout(tick, POLL_MS);
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
