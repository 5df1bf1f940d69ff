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
    scales: { x: { time: false } },
    axes: [{ label: "step" }, {}],
    series: [{ label: "step" }, ...seriesList.map((s, i) => ({ label: s.label, stroke: palette[i % palette.length], width: 1.5, spanGaps: true }))],
    legend: { live: false },
  };
  charts.set(id, { key, plot: new uPlot(opts, data, box) });
}

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
  fillTable("#decisions", o.decisions, (d) => [
    d.seq,
    d.lease_epoch,
    { text: d.kind },
    d.step,
    d.group_id,
    { text: JSON.stringify(d.payload), cls: "payload" },
  ]);
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

async function refresh() {
  const m = /#run=([^&]+)/.exec(location.hash);
  currentRun = m ? decodeURIComponent(m[1]) : null;
  $("#run-view").hidden = currentRun === null;
  try {
    await showRuns();
    if (currentRun) {
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
