/**
 * Recovery (issues 2 and 20): time from a controller restart after SIGKILL to
 * its first new decision (the outbox: a decision, then its job), with
 * `--samples` samples already in the run. Reported twice: from process spawn
 * (what an operator waits, including Node + tsx start-up) and inside the
 * process (the run's state from its snapshot and the decisions after it, the
 * queues reconciled, the first decision). Also, in the same run: a bare
 * `node -e 0` and the rlq CLI's `--version` (module loading, nothing else),
 * so the share of start-up that is Node's own shows on a loaded box.
 *
 * The history is written in bulk (bench/recovery-history.ts: whole sync steps,
 * decisions by COPY, facts by generate_series), then the real pipeline runs on
 * for `--live` samples before each SIGKILL, so the kill lands mid-step.
 * `--drop-snapshots` deletes the run's snapshots before each restart: the full
 * fold of the decision log, as before snapshots existed.
 *
 *   npx tsx bench/recovery.ts [--reps 3] [--samples 1000000] [--live 1500] [--drop-snapshots]
 */
import { parseArgs } from "node:util";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { createWorld } from "../test/helpers/run-fixture.ts";
import { repoRoot, spawnRlq, waitFor } from "../test/helpers/processes.ts";
import { rlqNodeFlags } from "../src/runtime/node-flags.ts";
import { median, writeResult, prepareServices } from "./lib.ts";
import { writeHistory } from "./recovery-history.ts";

const { values } = parseArgs({
  options: {
    reps: { type: "string", default: "3" },
    samples: { type: "string", default: "1000000" },
    live: { type: "string", default: "1500" },
    "drop-snapshots": { type: "boolean", default: false },
    // Alternate restarts without (even reps) and with (odd reps) the run's snapshots, in one run.
    "compare-snapshots": { type: "boolean", default: false },
    out: { type: "string", default: "recovery" },
  },
});
const reps = Number(values.reps);
const targetSamples = Number(values.samples);
const live = Number(values.live);
const dropSnapshots = values["drop-snapshots"] === true;
const compareSnapshots = values["compare-snapshots"] === true;
const rbs = 64;
const n = 8;

function summarize(rs: typeof results) {
  return {
    runs: rs.length,
    median_from_spawn_ms: median(rs.map((r) => r.fromSpawnMs)),
    median_in_process_ms: median(rs.map((r) => r.inProcessMs)),
    median_bare_node_ms: median(rs.map((r) => r.bareNodeMs)),
    median_cli_version_ms: median(rs.map((r) => r.cliVersionMs)),
    median_cli_version_sources_ms: median(rs.map((r) => r.cliVersionSourcesMs)),
  };
}

/** Wall ms from spawn to exit of a node command (median of `times`). */
async function timeNode(args: string[], times: number): Promise<number> {
  const ms: number[] = [];
  for (let i = 0; i < times; i++) {
    const t0 = performance.now();
    await new Promise<void>((resolve, reject) => {
      const c = spawn(process.execPath, args, {
        cwd: repoRoot,
        stdio: "ignore",
        env: { ...process.env, NODE_COMPILE_CACHE: join(tmpdir(), "node-compile-cache") },
      });
      c.on("error", reject);
      c.on("exit", () => resolve());
    });
    ms.push(performance.now() - t0);
  }
  return median(ms);
}

await prepareServices();
const w = await createWorld("brecov", { engineArgs: ["--token-delay-ms", "0", "--stop-prob", "0.2"], trainerArgs: ["--step-ms", "0"] });
const results: Array<{
  droppedSnapshots: boolean;
  fromSpawnMs: number;
  inProcessMs: number;
  samplesAtKill: number;
  decisionsAtKill: number;
  snapshotSeq: number | null;
  bareNodeMs: number;
  cliVersionMs: number;
  cliVersionSourcesMs: number;
  phasesMs: Record<string, number> | null;
}> = [];
let history = { decisions: 0, samples: 0, writeMs: 0 };
try {
  const runId = await w.start({
    num_rollout: 1_000_000,
    rollout_batch_size: rbs,
    n_samples_per_prompt: n,
    over_sampling_batch_size: rbs,
    rollout_max_response_len: 16,
    dynamic_sampling_filter_path: null,
    custom_rm_path: join(repoRoot, "test/fixtures/reward-parity.mjs"),
    engine: { kind: "sglang", urls: [w.engine.url], logprob_check: "off" },
  });
  const t0 = Date.now();
  const steps = Math.floor(targetSamples / (rbs * n));
  if (steps > 0) history = { ...(await writeHistory(w.db, runId, steps, w.home)), writeMs: 0 };
  history.writeMs = Date.now() - t0;
  process.stderr.write(`history: ${JSON.stringify(history)}\n`);
  const env = { ...w.env, RLQ_LOG_LEVEL: "info" };
  const workers = spawnRlq(["worker", "rollout", "reward", "train", "--concurrency", "16"], w.env);
  let ctl = spawnRlq(["up", "--run", runId, "--workers", ""], env);
  const count = async () =>
    (
      await w.db.pool.query(
        "SELECT (SELECT count(*)::int FROM sample_rewards WHERE run_id = $1) AS s, (SELECT max(seq)::int FROM decisions WHERE run_id = $1) AS d",
        [runId],
      )
    ).rows[0] as { s: number; d: number };
  let want = history.samples;
  for (let i = 0; i < reps; i++) {
    want += live;
    await waitFor(`${want} samples`, async () => (await count()).s >= want, 600_000, 500);
    ctl.kill("SIGKILL");
    await ctl.exited;
    const at = await count();
    const drop = compareSnapshots ? i % 2 === 0 : dropSnapshots;
    if (drop) await w.db.pool.query("DELETE FROM run_snapshots WHERE run_id = $1", [runId]);
    const snap = await w.db.pool.query<{ seq: string }>("SELECT max(seq) AS seq FROM run_snapshots WHERE run_id = $1", [runId]);
    // Node's own start-up and the CLI's module loading, measured now, next to this restart.
    const bareNodeMs = await timeNode(["-e", "0"], 3);
    // bin/rlq.js as the restart below starts it (dist/bundle/ while it matches the sources), and the sources through tsx.
    const cliVersionMs = await timeNode([...rlqNodeFlags, "bin/rlq.js", "--version"], 3);
    const cliVersionSourcesMs = await timeNode([...rlqNodeFlags, "--import", "tsx", "src/cli/main.ts", "--version"], 3);
    const spawnedAt = Date.now();
    ctl = spawnRlq(["up", "--run", runId, "--workers", ""], env);
    const first = await waitFor(
      "the first new decision",
      async () => {
        const r = await w.db.pool.query("SELECT created_at FROM decisions WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT 1", [runId, at.d]);
        return r.rows[0]?.created_at as Date | undefined;
      },
      120_000,
      10,
    );
    const tookLine = ctl
      .output()
      .split("\n")
      .find((l) => l.includes('"msg":"controller took the run"'));
    const took = tookLine ? (JSON.parse(tookLine) as { time: number; ms: number; phasesMs?: Record<string, number> }) : null;
    const startMs = took ? took.time - took.ms : NaN;
    const seqRaw = snap.rows[0]?.seq ?? null;
    results.push({
      droppedSnapshots: drop,
      fromSpawnMs: first.getTime() - spawnedAt,
      inProcessMs: first.getTime() - startMs,
      phasesMs: took?.phasesMs ?? null,
      samplesAtKill: at.s,
      decisionsAtKill: at.d,
      snapshotSeq: seqRaw === null ? null : Number(seqRaw),
      bareNodeMs: Math.round(bareNodeMs),
      cliVersionMs: Math.round(cliVersionMs),
      cliVersionSourcesMs: Math.round(cliVersionSourcesMs),
    });
    process.stderr.write(`recovery ${i}: ${JSON.stringify(results[results.length - 1])}\n`);
  }
  ctl.kill("SIGTERM");
  workers.kill("SIGTERM");
  await Promise.all([ctl.exited, workers.exited]);
} finally {
  await w.close();
}
const load = (await import("node:os")).loadavg();
await writeResult(values.out ?? "recovery", {
  bench: "recovery",
  target_samples: targetSamples,
  history,
  drop_snapshots: compareSnapshots ? "even reps" : dropSnapshots,
  load_average_1m_at_end: load[0],
  runs: results,
  ...(compareSnapshots
    ? {
        without_snapshot: summarize(results.filter((r) => r.droppedSnapshots)),
        with_snapshot: summarize(results.filter((r) => !r.droppedSnapshots)),
      }
    : {}),
  median_from_spawn_ms: median(results.map((r) => r.fromSpawnMs)),
  median_in_process_ms: median(results.map((r) => r.inProcessMs)),
  median_bare_node_ms: median(results.map((r) => r.bareNodeMs)),
  median_cli_version_ms: median(results.map((r) => r.cliVersionMs)),
  median_cli_version_sources_ms: median(results.map((r) => r.cliVersionSourcesMs)),
  entry: "bin/rlq.js (dist/bundle/ when it matches the sources: npm run bundle)",
});
