/**
 * @file The outage fault script (issue 40): runs under `rlq up --exit-when-done`, each with several
 * Postgres and Redis outages of seeded random length (log-uniform) aimed at a phase (a train step,
 * a weight sync, the seal, an eval, the controller's commits), then one outage past
 * RLQ_OUTAGE_TIMEOUT_S per service and queue backend (exit 75, restart, clean finish). Sync and
 * async runs, on Redis and on BullMQ's Postgres backend. Every run is checked: draws exact, no
 * sample trained twice, `rlq replay --check` clean, no pause. Writes a JSON report after each run.
 *
 *   npm run fault:outages -- [--runs 10] [--outages-per-run 5] [--seed N] [--min-s 5] [--max-s 180]
 *     [--long-share 0] [--long-min-s 120] [--long-max-s 180] [--num-rollout 10]
 *     [--past-timeout-s 20] [--queues mixed|redis|postgres] [--past-timeout all|none|NAME,...]
 *     [--out bench/results/fault-outages.json]
 *
 * Needs root (the own Postgres runs as the postgres user), Postgres 15 binaries and redis-server
 * (test/helpers/own-services.ts). The services on 127.0.0.1:5432/6379 are never touched.
 */
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { register } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { parseArgs } from "node:util";
import type { PlannedOutage } from "../test/helpers/fault-schedule.ts";

// test/helpers/invariants.ts imports vitest's expect, which refuses to load outside vitest:
// the script's own two matchers stand in for it.
const shim = new URL("./fault-outages-expect.ts", import.meta.url).href;
register(
  `data:text/javascript,${encodeURIComponent(
    `export async function resolve(s, c, next) { return s === "vitest" ? { url: ${JSON.stringify(shim)}, shortCircuit: true } : next(s, c); }`,
  )}`,
);

const { values } = parseArgs({
  options: {
    runs: { type: "string", default: "10" },
    "outages-per-run": { type: "string", default: "5" },
    seed: { type: "string" },
    "min-s": { type: "string", default: "5" },
    "max-s": { type: "string", default: "180" },
    "long-share": { type: "string", default: "0" },
    "long-min-s": { type: "string", default: "120" },
    "long-max-s": { type: "string", default: "180" },
    "num-rollout": { type: "string", default: "10" },
    "past-timeout-s": { type: "string", default: "20" },
    queues: { type: "string", default: "mixed" },
    "past-timeout": { type: "string", default: "all" },
    out: { type: "string", default: "bench/results/fault-outages.json" },
  },
});

const fs = await import("../test/helpers/fault-schedule.ts");
const { ownServicesAvailable } = await import("../test/helpers/own-services.ts");

const why = ownServicesAvailable();
if (why) {
  process.stderr.write(`fault-outages: cannot start own Postgres and Redis: ${why}\n`);
  process.exit(1);
}
// BullMQ's Postgres backend is chosen by the absence of REDIS_URL: none may leak in from here.
delete process.env.REDIS_URL;

const seed = values.seed === undefined ? Math.floor(Math.random() * 2 ** 31) : Number(values.seed);
const rand = fs.seededRandom(seed);
const lengths = {
  minMs: Number(values["min-s"]) * 1000,
  maxMs: Number(values["max-s"]) * 1000,
  longShare: Number(values["long-share"]),
  longMinMs: Number(values["long-min-s"]) * 1000,
  longMaxMs: Number(values["long-max-s"]) * 1000,
};
const runs = Number(values.runs);
const perRun = Number(values["outages-per-run"]);
const numRollout = Number(values["num-rollout"]);
const pastTimeoutS = Number(values["past-timeout-s"]);
// Longer than the longest outage: the scheduled outages are ridden out, never exits.
const timeoutS = Math.ceil(Math.max(lengths.maxMs, lengths.longShare > 0 ? lengths.longMaxMs : 0) / 1000) + 120;
const log = (line: string) => process.stdout.write(`${new Date().toISOString()} ${line}\n`);
log(`fault-outages: seed ${seed} (replay with --seed ${seed}); ${runs} runs x ${perRun} outages; RLQ_OUTAGE_TIMEOUT_S ${timeoutS}`);

// The code under test: a copy outside git (run from an archive of a commit) names it in RLQ_FAULT_CODE_COMMIT.
const head = spawnSync("git", ["rev-parse", "HEAD"], { encoding: "utf8" });
const codeCommit = process.env.RLQ_FAULT_CODE_COMMIT ?? (head.status === 0 ? head.stdout.trim() : null);
const dir = mkdtempSync(join(tmpdir(), "rlq-fault-outages-"));
const world = await fs.createFaultWorld(dir, { trainerStepMs: 1500, loadDelayMs: 1500 });
const started = new Date().toISOString();
const records: Awaited<ReturnType<typeof fs.runWithOutages>>[] = [];
const pastTimeout: Awaited<ReturnType<typeof fs.runPastTimeout>>[] = [];

function writeReport(done: boolean): void {
  const outages = [...records, ...pastTimeout].flatMap((r) => r.outages);
  const applied = outages.filter((o) => o.phaseSeen !== null);
  const report = {
    script: "scripts/fault-outages.ts",
    command: `npx tsx scripts/fault-outages.ts ${process.argv.slice(2).join(" ")}`.trim(),
    seed,
    codeCommit,
    started,
    finished: done ? new Date().toISOString() : null,
    lengthDistribution: {
      note: "log-uniform in [minS, maxS]; a share longShare drawn log-uniform in [longMinS, longMaxS] instead",
      minS: lengths.minMs / 1000,
      maxS: lengths.maxMs / 1000,
      longShare: lengths.longShare,
      longMinS: lengths.longMinMs / 1000,
      longMaxS: lengths.longMaxMs / 1000,
    },
    outageTimeoutS: timeoutS,
    fakes: { trainerStepMs: 1500, engineLoadDelayMs: 1500, rolloutBatchSize: fs.RBS, numRollout },
    summary: {
      runs: records.length,
      outagesApplied: applied.length,
      outagesNotReached: outages.length - applied.length,
      outagesRiddenOut: applied.filter((o) => o.outcome === "ridden out").length,
      byService: { postgres: applied.filter((o) => o.service === "postgres").length, redis: applied.filter((o) => o.service === "redis").length },
      byPhase: Object.fromEntries(fs.PHASES.map((p) => [p, applied.filter((o) => o.phase === p).length])),
      totalOutageS: Math.round(applied.reduce((a, o) => a + o.lengthMs, 0) / 1000),
      runsExact: [...records, ...pastTimeout].filter((r) => r.exact && r.replayExit === 0 && r.paused.length === 0).length,
      runsPaused: [...records, ...pastTimeout].filter((r) => r.paused.length > 0).length,
      pastTimeoutExit75ThenClean: pastTimeout.filter((r) => r.upExits[0] === 75 && r.upExits[1] === 0 && r.exact && r.replayExit === 0).length,
      pastTimeoutRuns: pastTimeout.length,
    },
    runs: records,
    pastTimeout,
  };
  mkdirSync(dirname(values.out), { recursive: true });
  writeFileSync(values.out, JSON.stringify(report, null, 2) + "\n");
}

function runSummary(r: (typeof records)[number]): string {
  return `${r.run}: rlq up exits ${r.upExits.join(", ")}; ${r.stepsCommitted}/${r.numRollout} steps; exact ${r.exact}; paused ${r.paused.length}; replay ${r.replayExit}; ${r.durationS.toFixed(0)} s`;
}

try {
  for (let i = 0; i < runs; i++) {
    // Six in ten on Redis (Postgres and Redis outages), the rest on BullMQ's Postgres backend.
    const queue: "redis" | "postgres" =
      values.queues === "mixed" ? (i < Math.ceil(runs * 0.6) ? "redis" : "postgres") : values.queues === "postgres" ? "postgres" : "redis";
    const spec = {
      name: `run${i}-${i % 2 === 0 ? "sync" : "async"}-${queue}`,
      mode: i % 2 === 0 ? "sync" : "async",
      queue,
      numRollout,
      outageTimeoutS: timeoutS,
    } as const;
    const plan = fs.planOutages(rand, perRun, queue === "redis" ? ["postgres", "redis"] : ["postgres"], lengths);
    log(`${spec.name}: ${plan.map((o) => `${o.service} ${(o.lengthMs / 1000).toFixed(0)} s in ${o.phase}`).join("; ")}`);
    const rec = await fs.runWithOutages(world, spec, plan, log);
    records.push(rec);
    log(runSummary(rec));
    writeReport(false);
  }
  const past: [string, "redis" | "postgres", "postgres" | "redis", "sync" | "async"][] = [
    ["past-timeout-postgres", "redis", "postgres", "sync"],
    ["past-timeout-redis", "redis", "redis", "async"],
    ["past-timeout-postgres-queue", "postgres", "postgres", "async"],
  ];
  for (const [name, queue, service, mode] of past.filter(([n]) => values["past-timeout"] === "all" || values["past-timeout"].split(",").includes(n))) {
    const spec = { name, mode, queue, numRollout: 4, outageTimeoutS: pastTimeoutS };
    const [o] = fs.planOutages(rand, 1, [service], lengths);
    const rec = await fs.runPastTimeout(world, spec, { ...(o as PlannedOutage), phase: "train" }, log);
    pastTimeout.push(rec);
    log(`${runSummary(rec)}; the first exit came ${rec.exitAfterS?.toFixed(0)} s into the outage; stderr: ${rec.stderrReason}`);
    writeReport(false);
  }
  writeReport(true);
  log(`fault-outages: seed ${seed}; report in ${values.out}`);
} finally {
  await world.close();
  rmSync(dir, { recursive: true, force: true });
}
// The fakes' and pools' handles may outlive their close by a moment: the report is written.
process.exit(0);
