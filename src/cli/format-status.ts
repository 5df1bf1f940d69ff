import type { RunStatusReport } from "../api.ts";
import { describeQueueEvent } from "../queue/queue-watch.ts";

export function formatStatus(r: RunStatusReport): string {
  const lines = [
    `run ${r.runId} (${r.name})`,
    `  status:          ${r.status}`,
    `  step:            ${r.step}${r.numRollout !== null ? ` / ${r.numRollout}` : ""}`,
    `  weight version:  ${r.weightVersion}${r.engineWeights === "frozen" ? " (weight_sync: none: the engines serve version 0 for the whole run; trained versions are never loaded into them, and step k trains on samples k versions stale)" : ""}`,
    `  train steps:     ${r.trainSteps}`,
  ];
  if (r.lastError) lines.push(`  last error:      ${r.lastError}`);
  const p = r.pipeline;
  const kv = (o: Record<string, number>) =>
    Object.keys(o).length === 0
      ? "-"
      : Object.entries(o)
          .map(([k, v]) => `${k}:${v}`)
          .join(" ");
  lines.push(`  in flight:       ${kv(Object.fromEntries(Object.entries(p.inflightByVersion).map(([v, n]) => [`v${v}`, n])))} (groups by weight version)`);
  lines.push(
    `  staleness:       ${kv(p.stalenessHistogram)} (trained samples by versions stale)${p.regenerations + p.staleDiscards > 0 ? `; ${p.regenerations} regenerated, ${p.staleDiscards} discarded as stale` : ""}`,
  );
  lines.push(
    `  trainer:         busy ${(100 * p.trainer.busyFraction).toFixed(0)}% (${p.trainer.busySeconds.toFixed(1)} s of ${p.trainer.wallSeconds.toFixed(1)} s)${p.sealedNotTrained > 0 ? `, ${p.sealedNotTrained} sealed step(s) waiting` : ""}`,
  );
  const tj = r.trainJob;
  if (tj) lines.push(`  train job:       step ${tj.step} ${tj.state}, ${tj.attemptsMade} attempt(s) used${tj.phase ? `, ${tj.phase}` : ""}`);
  const m = Object.entries(r.lastMetrics);
  if (m.length > 0) lines.push(`  last metrics:    ${m.map(([k, v]) => `${k}=${Number(v.toPrecision(4))}`).join(" ")}`);
  for (const e of r.evals) {
    lines.push(
      `  eval ${e.dataset}: step ${e.step} (version ${e.weightVersion}) mean reward ${e.meanReward.toFixed(3)} ${Object.entries(e.passAtK)
        .map(([k, v]) => `pass@${k} ${v.toFixed(3)}`)
        .join(" ")}`,
    );
  }
  for (const e of r.engines) {
    const lat = e.latencyMs.p50 === null ? "-" : `p50 ${e.latencyMs.p50.toFixed(0)} p95 ${e.latencyMs.p95?.toFixed(0)} p99 ${e.latencyMs.p99?.toFixed(0)} ms`;
    lines.push(
      `  engine ${e.engineId} (${e.worker}): ${e.state} v${e.weightVersion ?? "?"} requests ${e.requests} errors ${e.errors} aborted ${e.aborted} ${e.tokensPerSecond.toFixed(0)} tok/s latency ${lat}${engineNotes(e)}`,
    );
  }
  lines.push(...queueWatchLines(r.queueWatch));
  if (r.queues) {
    lines.push("  queues:");
    for (const [q, c] of Object.entries(r.queues)) {
      lines.push(
        `    ${q.padEnd(8)} ${Object.entries(c)
          .map(([k, v]) => `${k}=${v}`)
          .join(" ")}`,
      );
    }
  }
  return lines.join("\n") + "\n";
}

/**
 * The queue watch's findings (queue/queue-watch.ts): a queue paused now stalls every run on it, so
 * it leads; then what was seen and repaired since the run started, newest first.
 */
function queueWatchLines(w: RunStatusReport["queueWatch"]): string[] {
  if (w === null) return [];
  const lines: string[] = [];
  for (const p of w.pausedNow) {
    lines.push(
      p.byOperator
        ? `  QUEUE PAUSED:    ${p.queue} was paused by an operator in Bull Board: its jobs wait until it is resumed there`
        : `  QUEUE PAUSED:    ${p.queue} is paused, not by rlq: its jobs wait; a running controller (rlq up) resumes it within seconds`,
    );
  }
  if (w.events.length > 0) {
    lines.push("  queue watch:     (what was done to the queues outside rlq, and rlq's repair)");
    for (const e of w.events) lines.push(`    ${describeQueueEvent(e)}`);
  }
  return lines;
}

/** What an engine's metrics add when it matters: requests it refused, busy health checks, seeds it ignores, deaths. */
function engineNotes(e: { requestErrors?: number; busyChecks?: number; seedHonoured?: boolean | null; deaths?: number }): string {
  const notes: string[] = [];
  if ((e.requestErrors ?? 0) > 0) notes.push(`refused requests ${e.requestErrors}`);
  if ((e.busyChecks ?? 0) > 0) notes.push(`busy checks ${e.busyChecks}`);
  if ((e.deaths ?? 0) > 0) notes.push(`deaths ${e.deaths}`);
  if (e.seedHonoured === false) notes.push("seeds ignored (start SGLang with --enable-deterministic-inference to honour them)");
  return notes.length === 0 ? "" : `; ${notes.join(", ")}`;
}
