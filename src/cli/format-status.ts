import type { RunStatusReport } from "../api.ts";

export function formatStatus(r: RunStatusReport): string {
  const lines = [
    `run ${r.runId} (${r.name})`,
    `  status:          ${r.status}`,
    `  step:            ${r.step}${r.numRollout !== null ? ` / ${r.numRollout}` : ""}`,
    `  weight version:  ${r.weightVersion}`,
    `  train steps:     ${r.trainSteps}`,
  ];
  if (r.lastError) lines.push(`  last error:      ${r.lastError}`);
  const m = Object.entries(r.lastMetrics);
  if (m.length > 0) lines.push(`  last metrics:    ${m.map(([k, v]) => `${k}=${Number(v.toPrecision(4))}`).join(" ")}`);
  for (const e of r.evals) {
    lines.push(`  eval ${e.dataset}: step ${e.step} (version ${e.weightVersion}) mean reward ${e.meanReward.toFixed(3)} ${Object.entries(e.passAtK).map(([k, v]) => `pass@${k} ${v.toFixed(3)}`).join(" ")}`);
  }
  for (const e of r.engines) {
    const lat = e.latencyMs.p50 === null ? "-" : `p50 ${e.latencyMs.p50.toFixed(0)} p95 ${e.latencyMs.p95?.toFixed(0)} p99 ${e.latencyMs.p99?.toFixed(0)} ms`;
    lines.push(`  engine ${e.engineId} (${e.worker}): ${e.state} v${e.weightVersion ?? "?"} requests ${e.requests} errors ${e.errors} aborted ${e.aborted} ${e.tokensPerSecond.toFixed(0)} tok/s latency ${lat}`);
  }
  if (r.queues) {
    lines.push("  queues:");
    for (const [q, c] of Object.entries(r.queues)) {
      lines.push(`    ${q.padEnd(8)} ${Object.entries(c).map(([k, v]) => `${k}=${v}`).join(" ")}`);
    }
  }
  return lines.join("\n") + "\n";
}
