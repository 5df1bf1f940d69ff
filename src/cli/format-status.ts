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
  if (r.queues) {
    lines.push("  queues:");
    for (const [q, c] of Object.entries(r.queues)) {
      lines.push(`    ${q.padEnd(8)} ${Object.entries(c).map(([k, v]) => `${k}=${v}`).join(" ")}`);
    }
  }
  return lines.join("\n") + "\n";
}
