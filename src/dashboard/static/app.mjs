// The rlq dashboard page (served as /app.js). Plain browser JavaScript, no build step:
// it reads /api/* (single SELECTs over docs/sql.md's tables) and draws with uPlot,
// which the server serves from node_modules. Every chart element carries
// data-points (how many steps it drew) so a browser test can check what rendered.
"use strict";

const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs = {}, text) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = String(text);
  return e;
};
const fmt = (v, d = 3) =>
  v === null || v === undefined || Number.isNaN(v)
    ? "–"
    : typeof v === "number"
      ? Math.abs(v) >= 1000 || Number.isInteger(v)
        ? String(Math.round(v * 1000) / 1000)
        : v.toPrecision(d)
      : String(v);
const getJson = async (url) => {
  const res = await fetch(url);
  const body = await res.json();
  if (!res.ok) throw new Error(body?.error?.message ?? res.statusText);
  return body;
};

const palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const versionColour = (v) => (v < 0 ? "#ddd" : `hsl(${(v * 47) % 360} 70% 82%)`);

// Chart definitions: [id, title, series: [label, pick(step row) -> number|null]].
// Keys follow what the trainer records in train_metrics (docs/algorithms.md).
const chartDefs = [
  [
    "reward",
    "reward (mean)",
    [
      ["trained samples", (r) => r.reward_trained],
      ["all outcomes (filter's view)", (r) => r.reward_all],
      ["filtered out", (r) => r.reward_filtered],
    ],
  ],
  [
    "groups",
    "groups kept / filtered",
    [
      ["kept", (r) => r.groups_kept],
      ["filtered", (r) => r.groups_filtered],
    ],
  ],
  [
    "response_length",
    "response length",
    [
      ["mean (trained)", (r) => r.response_length_mean],
      ["max", (r) => r.response_length_max],
    ],
  ],
  ["pg_loss", "pg_loss", [["pg_loss", (r) => r.m.pg_loss]]],
  [
    "kl",
    "KL",
    [
      ["ppo_kl", (r) => r.m.ppo_kl],
      ["kl_loss", (r) => r.m.kl_loss],
    ],
  ],
  ["entropy", "entropy", [["entropy_loss", (r) => r.m.entropy_loss]]],
  [
    "clipfrac",
    "clip fraction",
    [
      ["pg_clipfrac", (r) => r.m.pg_clipfrac],
      ["tis_clipfrac", (r) => r.m.tis_clipfrac],
    ],
  ],
  ["grad_norm", "grad norm", [["grad_norm", (r) => r.m.grad_norm]]],
  [
    "tis",
    "TIS / MIS",
    [
      ["tis", (r) => r.m.tis],
      ["mis", (r) => r.m.mis ?? r.m.mis_ratio],
    ],
  ],
  ["logprob_diff", "|train − rollout| log-prob", [["train_rollout_logprob_abs_diff", (r) => r.m.train_rollout_logprob_abs_diff]]],
  [
    "throughput",
    "throughput",
    [
      ["samples/s", (r) => r.samples_per_s],
      ["tokens/s", (r) => r.tokens_per_s],
    ],
  ],
  [
    "staleness_mean",
    "staleness",
    [
      ["mean", (r) => r.m.staleness_mean],
      ["max", (r) => r.m.staleness_max],
    ],
  ],
  ["pass_at_k", "eval pass@k", []],
];

const charts = new Map();
// Exposed for the browser test (test/integration/dashboard.test.ts), which compares the plotted data with SQL.
window.rlqCharts = charts;
let currentRun = null;
let canControl = false;

// Tick labels that read at every scale: a span under 1e-3 (the ~2e-7 train/rollout log-prob
// mismatch) or from 1e6 up is written in scientific notation, never rounded to "0, 0".
function tickLabel(v, magnitude) {
  if (v === 0) return "0";
  if (magnitude < 1e-3 || magnitude >= 1e6) return Number(v.toPrecision(3)).toExponential();
  return String(Number(v.toPrecision(6)));
}
const axisValues = (_u, splits) => {
  const magnitude = Math.max(...splits.map((v) => Math.abs(v)));
  return splits.map((v) => tickLabel(v, magnitude));
};
// A constant series gets a range around its value (±10%, ±1 at zero), not uPlot's 0-100.
function yRange(_u, min, max) {
  if (min === null || max === null || !Number.isFinite(min) || !Number.isFinite(max)) return [0, 1];
  if (min === max) {
    const pad = min === 0 ? 1 : Math.abs(min) * 0.1;
    return [min - pad, max + pad];
  }
  return uPlot.rangeNum(min, max, 0.1, true);
}

// Charts with nothing to draw (TIS/MIS when off, eval when never run) fold into one line under the grid.
const emptyCharts = new Map();
function foldEmpty(box, id, title, drawn) {
  box.hidden = drawn === 0;
  if (drawn === 0) emptyCharts.set(id, title);
  else emptyCharts.delete(id);
  const line = $("#charts-empty");
  line.hidden = emptyCharts.size === 0;
  line.textContent = `no data: ${[...emptyCharts.values()].join(", ")}`;
}

function drawChart(id, title, xs, seriesList) {
  let box = document.getElementById(`chart-${id}`);
  if (!box) {
    box = el("div", { id: `chart-${id}`, class: "chart", "data-chart": id });
    box.append(el("h4", {}, title));
    $("#charts").append(box);
  }
  const data = [xs, ...seriesList.map((s) => s.values)];
  const drawn = seriesList.filter((s) => s.values.some((v) => v !== null)).length;
  box.dataset.points = String(xs.length);
  box.dataset.series = String(drawn);
  foldEmpty(box, id, title, drawn);
  const key = `${id}:${seriesList.map((s) => s.label).join("|")}`;
  const existing = charts.get(id);
  if (existing && existing.key === key) {
    existing.plot.setData(data);
    return;
  }
  if (existing) existing.plot.destroy();
  const opts = {
    width: 380,
    height: 180,
    scales: { x: { time: false }, y: { range: yRange } },
    axes: [{ label: "step" }, { values: axisValues, size: 64 }],
    series: [{ label: "step" }, ...seriesList.map((s, i) => ({ label: s.label, stroke: palette[i % palette.length], width: 1.5, spanGaps: true }))],
    legend: { live: false },
  };
  charts.set(id, { key, plot: new uPlot(opts, data, box) });
}

// The decision log as a timeline: one readable line per decision, its JSON one click away.
const describers = {
  "run.created": (p) => `run created: ${p.name}, ${p.datasetSize} prompts`,
  "run.status": (p) => `status ${p.status}${p.reason ? ` (${p.reason})` : ""}`,
  "run.amended": (p) => `config amended: ${Object.keys(p.changes ?? {}).join(", ")}`,
  "step.started": (p) => `step ${p.step} started at version ${p.weightVersion}`,
  "prompts.drawn": (p) => `${p.fresh?.length ?? 0} prompts drawn, ${p.fromBuffer?.length ?? 0} from the buffer`,
  "group.dispatched": (p) => `group ${p.groupId} round ${p.round} sent at version ${p.weightVersion}`,
  "group.filtered": (p) => `group ${p.groupId} ${p.keep ? "passes" : "fails"} the filter${p.reason ? `: ${p.reason}` : ""}`,
  "group.outcome": (p) => `group ${p.groupId} ${p.outcome}${p.reason ? ` (${p.reason})` : ""}`,
  "group.cut": (p) => `group ${p.groupId}: samples ${p.samples?.join(",")} cut (${p.reason}), round ${p.round}`,
  "group.aborted": (p) => `group ${p.groupId} round ${p.round} aborted: ${p.reason}`,
  "step.sealed": (p) => `step ${p.step} sealed: ${p.kept?.length ?? 0} groups kept, ${p.aborted?.length ?? 0} rounds aborted`,
  "train.dispatched": (p) => `train step ${p.step} sent (version ${p.weightVersionIn} in)`,
  "step.trained": (p) => `step ${p.step} trained → version ${p.weightVersionOut}`,
  "weights.syncing": (p) => `engines to load version ${p.weightVersion} (${p.mode})`,
  "weights.synced": (p) => `engines at version ${p.weightVersion}`,
  "eval.dispatched": (p) => `eval at version ${p.weightVersion}`,
  "eval.recorded": (p) => `eval of step ${p.step} recorded`,
};
const describe = (d) => {
  const f = describers[d.kind];
  if (f) return f(d.payload ?? {});
  const text = JSON.stringify(d.payload);
  return text.length > 80 ? `${text.slice(0, 80)}…` : text;
};
const kindClass = (kind) => `kind kind-${kind.split(".")[0]}`;

// Decisions whose JSON is open: kept across the page's refreshes, which rebuild the rows.
const openJson = new Set();
/** Rows of a timeline table; also used by the rollout viewer (viewer.mjs) for a group's decisions. */
function timelineRows(decisions) {
  return decisions.map((d) => {
    const tr = el("tr", { "data-seq": d.seq });
    const json = el("pre", { class: "json" }, JSON.stringify(d.payload, null, 2));
    json.hidden = !openJson.has(String(d.seq));
    const toggle = el("button", { type: "button", class: "json-toggle" }, "JSON");
    toggle.addEventListener("click", () => {
      json.hidden = !json.hidden;
      if (json.hidden) openJson.delete(String(d.seq));
      else openJson.add(String(d.seq));
    });
    const what = el("td", {}, describe(d));
    what.append(json);
    const button = el("td");
    button.append(toggle);
    const at = d.created_at ? new Date(d.created_at).toLocaleTimeString() : "";
    tr.append(el("td", {}, d.seq), el("td", {}, at), el("td", {}, fmt(d.lease_epoch)), el("td", { class: kindClass(d.kind) }, d.kind));
    tr.append(el("td", {}, fmt(d.step ?? d.payload?.step)), el("td", {}, fmt(d.group_id)), what, button);
    return tr;
  });
}
window.rlqTimeline = (decisions, id) => {
  const t = el("table", { id, class: "timeline" });
  const head = el("tr");
  for (const h of ["seq", "time", "epoch", "kind", "step", "group", "what", ""]) head.append(el("th", {}, h));
  t.append(el("thead"), el("tbody"));
  t.tHead.append(head);
  t.tBodies[0].replaceChildren(...timelineRows(decisions));
  return t;
};

function fillTable(sel, rows, cells, onClick) {
  const body = $(`${sel} tbody`);
  body.replaceChildren(
    ...rows.map((r) => {
      const tr = el("tr", onClick ? { class: "clickable" } : {});
      for (const c of cells(r)) {
        const td = el("td", typeof c === "object" && c !== null && c.cls ? { class: c.cls } : {}, typeof c === "object" && c !== null ? c.text : fmt(c));
        tr.append(td);
      }
      if (onClick) tr.addEventListener("click", () => onClick(r));
      return tr;
    }),
  );
}

async function control(runId, action) {
  const token = $("#token").value;
  const res = await fetch(`/api/runs/${encodeURIComponent(runId)}/${action}`, { method: "POST", headers: { authorization: `Bearer ${token}` } });
  const body = await res.json();
  alert(res.ok ? `${action} sent (request ${body.request})` : body.error.message);
}

async function showRuns() {
  const { runs, canControl: cc } = await getJson("/api/runs");
  canControl = cc;
  $("#token-box").hidden = !cc;
  const body = $("#runs tbody");
  body.replaceChildren(
    ...runs.map((r) => {
      const tr = el("tr", { class: "clickable", "data-run": r.id });
      for (const v of [r.id, r.name, r.status, `${r.step}/${r.num_rollout ?? "?"}`, r.weight_version, new Date(r.updated_at).toLocaleTimeString()])
        tr.append(el("td", {}, v));
      const td = el("td");
      if (canControl) {
        for (const action of ["pause", "resume"]) {
          const b = el("button", { "data-action": action }, action);
          b.addEventListener("click", (ev) => {
            ev.stopPropagation();
            void control(r.id, action);
          });
          td.append(b);
        }
      }
      tr.append(td);
      tr.addEventListener("click", () => {
        location.hash = `#run=${encodeURIComponent(r.id)}`;
      });
      return tr;
    }),
  );
}

function stepRows(o) {
  const byStep = new Map();
  const row = (step) => {
    let r = byStep.get(step);
    if (!r) byStep.set(step, (r = { step, m: {} }));
    return r;
  };
  for (const r of o.rewardPerStep) Object.assign(row(r.step), r);
  for (const t of o.trainMetrics) row(t.step).m[t.key] = t.value;
  for (const t of o.trainSteps) {
    const r = row(t.step);
    r.samples_per_s = t.seconds > 0 ? t.num_samples / t.seconds : null;
    r.tokens_per_s = t.seconds > 0 && t.response_tokens !== null ? t.response_tokens / t.seconds : null;
  }
  // Only committed steps are charted: a step's rollout_history rows land before its train commit.
  const committed = new Set(o.trainSteps.map((t) => t.step));
  return [...byStep.values()].filter((r) => committed.has(r.step)).sort((a, b) => a.step - b.step);
}

async function showRun(runId) {
  const o = await getJson(`/api/runs/${encodeURIComponent(runId)}`);
  const run = o.run;
  $("#run-title").textContent = `${run.name} (${run.id})`;
  const tj = o.trainJob
    ? `train job (step ${o.trainJob.step}): ${o.trainJob.state}${o.trainJob.phase ? `, ${o.trainJob.phase}` : ""}, attempts ${o.trainJob.attemptsMade}`
    : "train job: none pending";
  $("#run-status").textContent =
    `status ${run.status} · step ${run.step}/${run.num_rollout} · weight version ${run.weight_version} · trainer busy ${o.busyFraction === null ? "–" : `${(o.busyFraction * 100).toFixed(0)}%`} · ${tj}${run.last_error ? ` · last error: ${run.last_error}` : ""}`;
  const rows = stepRows(o);
  const xs = rows.map((r) => r.step);
  for (const [id, title, series] of chartDefs) {
    if (id === "pass_at_k") continue;
    drawChart(
      id,
      title,
      xs,
      series.map(([label, pick]) => ({ label, values: rows.map((r) => pick(r) ?? null) })),
    );
  }
  // pass@k: one series per (dataset, k), x = eval step.
  const evalSteps = [...new Set(o.evals.map((e) => e.step))].sort((a, b) => a - b);
  const evalSeries = new Map();
  for (const e of o.evals) {
    for (const [k, v] of Object.entries(e.pass_at_k ?? {})) {
      const label = `${e.dataset} pass@${k}`;
      if (!evalSeries.has(label)) evalSeries.set(label, new Array(evalSteps.length).fill(null));
      evalSeries.get(label)[evalSteps.indexOf(e.step)] = v;
    }
  }
  drawChart(
    "pass_at_k",
    "eval pass@k",
    evalSteps,
    [...evalSeries.entries()].map(([label, values]) => ({ label, values })),
  );

  fillTable("#staleness", o.staleness, (r) => [r.staleness, r.samples]);
  fillTable("#inflight", o.inFlight, (r) => [r.weight_version, r.groups]);
  const engines = o.engines.flatMap((w) => (w.snapshot?.engines ?? []).map((e) => ({ worker: w.worker, ...e })));
  fillTable("#engines", engines, (e) => [
    e.worker,
    e.engineId,
    e.state,
    e.weightVersion,
    e.inFlight,
    e.requests,
    e.errors,
    e.tokensPerSecond,
    e.latencyMs?.p95,
  ]);
  fillTable("#evals", o.evals, (e) => [e.step, e.dataset, e.weight_version, e.mean_reward, { text: JSON.stringify(e.pass_at_k) }]);
  $("#decisions tbody").replaceChildren(...timelineRows(o.decisions));
}

async function showSamples(runId) {
  const step = $("#sample-step").value;
  const { samples } = await getJson(`/api/runs/${encodeURIComponent(runId)}/samples${step === "" ? "" : `?step=${Number(step)}`}`);
  fillTable(
    "#samples",
    samples,
    (s) => [
      s.step,
      s.group_id,
      s.sample_index,
      s.reward,
      s.response_length,
      { text: s.outcome },
      s.trained_step,
      { text: (s.weight_versions ?? []).join(",") },
    ],
    (s) => void showSample(runId, s.group_id, s.sample_index),
  );
}

async function showSample(runId, groupId, sampleIndex) {
  const { sample: s } = await getJson(`/api/runs/${encodeURIComponent(runId)}/samples/${groupId}/${sampleIndex}`);
  $("#sample-detail").hidden = false;
  $("#sample-title").textContent =
    `sample ${groupId}/${sampleIndex} · step ${s.step} · reward ${fmt(s.reward)} · ${s.outcome}${s.outcome_reason ? ` (${s.outcome_reason})` : ""} · trained at step ${s.trained_step ?? "–"}`;
  $("#sample-prompt").textContent = s.prompt;
  const response = (s.tokens ?? []).slice(s.prompt_length);
  const spans = response.map((t, i) => {
    const version = s.token_versions?.[i] ?? -1;
    const mask = s.loss_mask?.[i] ?? 1;
    const span = el(
      "span",
      {
        "data-version": String(version),
        "data-mask": String(mask),
        title: `token ${t} · version ${version} · loss mask ${mask}`,
        class: mask === 0 ? "masked" : "",
      },
      s.response_pieces?.[i] ?? `⟨${t}⟩`,
    );
    span.style.background = versionColour(version);
    return span;
  });
  $("#sample-tokens").replaceChildren(...spans);
  $("#sample-meta").textContent =
    `finish ${s.finish_reason ?? "–"} · segment versions ${(s.weight_versions ?? []).join(", ")} · reward components ${JSON.stringify(s.reward_components)}`;
  $("#sample-detail").dataset.loaded = `${groupId}/${sampleIndex}`;
}

/**
 * The queue banner: queues paused now and what the queue watch saw in the last hour
 * (queue/queue-watch.ts, served by Bull Board's mount at /queues/api/rlq-watch), on every view.
 */
async function showQueueBanner() {
  const { queueWatch } = await getJson("/queues/api/rlq-watch");
  const recent = queueWatch.events.filter((e) => Date.parse(e.at) > Date.now() - 3600_000 && !e.kind.startsWith("operator_"));
  const lines = [
    ...queueWatch.pausedNow.map((p) =>
      p.byOperator
        ? `${p.queue} is paused by an operator (Bull Board): its jobs wait until it is resumed`
        : `${p.queue} is paused, not by rlq: its jobs wait (rlq up resumes it)`,
    ),
    ...recent.map((e) => `${new Date(e.at).toLocaleTimeString()} ${e.detail}`),
  ];
  const banner = $("#queue-banner");
  banner.replaceChildren(...lines.map((l) => el("div", {}, l)));
  banner.hidden = lines.length === 0;
  banner.className = queueWatch.pausedNow.length > 0 ? "banner alert" : "banner";
  banner.dataset.paused = queueWatch.pausedNow.map((p) => p.queue).join(",");
  banner.dataset.events = String(recent.length);
}

async function refresh() {
  const params = new URLSearchParams(location.hash.slice(1));
  currentRun = params.get("run");
  // A rollout viewer page (viewer.mjs) replaces the run's charts; it refreshes on navigation only.
  const isViewer = params.has("view");
  $("#run-view").hidden = currentRun === null || isViewer;
  try {
    await showQueueBanner();
    await showRuns();
    if (currentRun && !isViewer) {
      await showRun(currentRun);
      await showSamples(currentRun);
    }
    document.body.dataset.refreshed = String(Date.now());
    document.body.dataset.error = "";
  } catch (e) {
    document.body.dataset.error = String(e.message ?? e);
  }
}

window.addEventListener("hashchange", () => void refresh());
$("#sample-step").addEventListener("change", () => currentRun && void showSamples(currentRun));
void refresh();
setInterval(() => void refresh(), 3000);
