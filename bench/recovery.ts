/**
 * Recovery (issue 2): time from a controller restart after SIGKILL to its
 * first new decision (the outbox: a decision, then its job), with at least
 * 10k samples already in the run. Reported twice: from process spawn (what
 * an operator waits, including Node + tsx start-up) and inside the process
 * (fold the decision log + reconcile the queues + first decision).
 *
 *   npx tsx bench/recovery.ts [--reps 3] [--samples 10000]
 */
import { parseArgs } from "node:util";
import { join } from "node:path";
import { createWorld } from "../test/helpers/run-fixture.ts";
import { repoRoot, spawnRlq, waitFor } from "../test/helpers/processes.ts";
import { median, writeResult, prepareServices } from "./lib.ts";

const { values } = parseArgs({ options: { reps: { type: "string", default: "3" }, samples: { type: "string", default: "10000" } } });
const reps = Number(values.reps);
const targetSamples = Number(values.samples);

await prepareServices();
const w = await createWorld("brecov", { engineArgs: ["--token-delay-ms", "0", "--stop-prob", "0.2"], trainerArgs: ["--step-ms", "0"] });
const results: Array<{ fromSpawnMs: number; inProcessMs: number; samplesAtKill: number; decisionsAtKill: number }> = [];
try {
  const runId = await w.start({
    num_rollout: 1000,
    rollout_batch_size: 64,
    n_samples_per_prompt: 8,
    over_sampling_batch_size: 64,
    rollout_max_response_len: 16,
    dynamic_sampling_filter_path: null,
    custom_rm_path: join(repoRoot, "test/fixtures/reward-parity.mjs"),
    engine: { kind: "sglang", urls: [w.engine.url], logprob_check: "off" },
  });
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
  for (let i = 0; i < reps; i++) {
    const want = targetSamples * (1 + i * 0.1);
    await waitFor(`${want} samples`, async () => (await count()).s >= want, 600_000, 500);
    ctl.kill("SIGKILL");
    await ctl.exited;
    const at = await count();
    const spawnedAt = Date.now();
    ctl = spawnRlq(["up", "--run", runId, "--workers", ""], env);
    const first = await waitFor(
      "the first new decision",
      async () => {
        const r = await w.db.pool.query("SELECT created_at FROM decisions WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT 1", [runId, at.d]);
        return r.rows[0]?.created_at as Date | undefined;
      },
      60_000,
      10,
    );
    const took = /"ms":(\d+),"msg":"controller took the run"/.exec(ctl.output());
    const tookAt = /"time":(\d+),[^\n]*"msg":"controller took the run"/.exec(ctl.output());
    const startMs = tookAt && took ? Number(tookAt[1]) - Number(took[1]) : NaN;
    results.push({ fromSpawnMs: first.getTime() - spawnedAt, inProcessMs: first.getTime() - startMs, samplesAtKill: at.s, decisionsAtKill: at.d });
    process.stderr.write(`recovery ${i}: ${JSON.stringify(results[results.length - 1])}\n`);
  }
  ctl.kill("SIGTERM");
  workers.kill("SIGTERM");
  await Promise.all([ctl.exited, workers.exited]);
} finally {
  await w.close();
}
await writeResult("recovery", {
  bench: "recovery",
  target_samples: targetSamples,
  runs: results,
  median_from_spawn_ms: median(results.map((r) => r.fromSpawnMs)),
  median_in_process_ms: median(results.map((r) => r.inProcessMs)),
});
