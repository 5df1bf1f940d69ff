/**
 * Control-plane throughput (issue 2): an instant fake engine, an instant
 * reward, group size 8. Samples per second from the first draw to the last
 * persisted reward, against the raw COPY rate of the same segment rows
 * measured in the same run (the Postgres ingest ceiling; `copyRate` says
 * into which tables). Both queue backends; medians of several runs.
 *
 *   npx tsx bench/control-plane.ts [--reps 3] [--steps 1] [--rbs 1024] [--queues redis,postgres] [--prof DIR]
 *     [--max-len 16] [--stop-prob 0.2]   (response length: at most max-len tokens, EOS with this probability per token)
 *     [--engine-model instant|full]     (the fake engine's token model: instant by default; full is the softmax fake the tests use)
 *     [--split]   (the rollout and reward workers in their own process, `rlq worker rollout reward`, beside
 *                  `rlq up --workers train,eval`: the controller's own CPU per sample, the part one run cannot spread)
 *
 * --prof DIR writes a V8 CPU profile of `rlq up` per run into DIR.
 */
import { cpus } from "node:os";
import { parseArgs } from "node:util";
import { join } from "node:path";
import { pipeline } from "node:stream/promises";
import { Readable } from "node:stream";
import pg from "pg";
import { from as copyFrom } from "pg-copy-streams";
import { createWorld } from "../test/helpers/run-fixture.ts";
import { repoRoot, spawnRlq } from "../test/helpers/processes.ts";
import { median, writeResult, prepareServices, startCpuSampler } from "./lib.ts";

const { values } = parseArgs({
  options: {
    reps: { type: "string", default: "3" },
    steps: { type: "string", default: "1" },
    rbs: { type: "string", default: "1024" },
    queues: { type: "string", default: "redis,postgres" },
    prof: { type: "string" },
    "max-len": { type: "string", default: "16" },
    "stop-prob": { type: "string", default: "0.2" },
    "engine-model": { type: "string", default: "instant" },
    split: { type: "boolean", default: false },
  },
});
const reps = Number(values.reps);
const steps = Number(values.steps);
const rbs = Number(values.rbs);

/**
 * The raw COPY rate of the run's segment rows (the same rows, repeated to at
 * least 50k in 1000-row chunks: a short COPY is mostly its fixed cost and too
 * noisy to compare with), into two tables:
 *   temp:   a temporary table with the same columns: no WAL, no index (the rate quoted since session 3);
 *   logged: a table LIKE sample_segments INCLUDING ALL (its primary key and
 *           (run_id, step) index, WAL-logged), committed: what ingesting those rows
 *           into a table a crash cannot lose costs, which is what the run's writes pay.
 */
async function copyRate(
  url: string,
  runId: string,
): Promise<{ rows: number; rowsPerS: number; loggedRowsPerS: number; pgCpuMsPerRow: number; loggedPgCpuMsPerRow: number }> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    const { rows } = await c.query("SELECT * FROM sample_segments WHERE run_id = $1", [runId]);
    const esc = (v: unknown): string => {
      if (v === null || v === undefined) return "\\N";
      if (Array.isArray(v)) return `{${v.join(",")}}`;
      if (v instanceof Date) return v.toISOString();
      return (typeof v === "string" ? v : JSON.stringify(v)).replace(/\\/g, "\\\\").replace(/\t/g, "\\t").replace(/\n/g, "\\n");
    };
    const cols = Object.keys(rows[0] as object);
    const copies = Math.max(1, Math.ceil(50_000 / rows.length));
    // Each copy of the rows under other group ids, so the logged table's primary key takes them all.
    const all: string[] = [];
    for (let k = 0; k < copies; k++) {
      for (const r of rows as Array<Record<string, unknown>>) {
        all.push(cols.map((col) => esc(col === "group_id" ? Number(r[col]) + k * 1_000_000 : r[col])).join("\t") + "\n");
      }
    }
    const chunks: string[] = [];
    for (let i = 0; i < all.length; i += 1000) chunks.push(all.slice(i, i + 1000).join(""));
    // Postgres's own CPU per row during the COPY (all its processes: the backend, the WAL writer, ...).
    const timeCopy = async (table: string): Promise<{ rowsPerS: number; pgCpuMsPerRow: number }> => {
      const cpu = startCpuSampler((_pid, cmd) => (/^postgres: /.test(cmd) ? "postgres" : null), 20);
      const t0 = performance.now();
      const w0 = Date.now();
      await c.query("BEGIN");
      await pipeline(Readable.from(chunks), c.query(copyFrom(`COPY ${table} (${cols.join(",")}) FROM STDIN`)));
      await c.query("COMMIT");
      const rowsPerS = all.length / ((performance.now() - t0) / 1000);
      await new Promise((r) => setTimeout(r, 40)); // one more sample after the commit
      cpu.stop();
      return { rowsPerS, pgCpuMsPerRow: ((cpu.between(w0, Date.now()).postgres ?? 0) * 1000) / all.length };
    };
    await c.query("CREATE TEMP TABLE seg_copy (LIKE sample_segments)");
    const temp = await timeCopy("seg_copy");
    await c.query("DROP TABLE IF EXISTS bench_seg_copy_logged");
    await c.query("CREATE TABLE bench_seg_copy_logged (LIKE sample_segments INCLUDING ALL)");
    try {
      const logged = await timeCopy("bench_seg_copy_logged");
      return {
        rows: all.length,
        rowsPerS: temp.rowsPerS,
        loggedRowsPerS: logged.rowsPerS,
        pgCpuMsPerRow: temp.pgCpuMsPerRow,
        loggedPgCpuMsPerRow: logged.pgCpuMsPerRow,
      };
    } finally {
      await c.query("DROP TABLE bench_seg_copy_logged");
    }
  } finally {
    await c.end();
  }
}

async function once(queue: "redis" | "postgres") {
  const w = await createWorld(`bcp${queue}`, {
    queue,
    engineArgs: ["--token-delay-ms", "0", "--stop-prob", values["stop-prob"], "--model", values["engine-model"]],
    trainerArgs: ["--step-ms", "0"],
  });
  try {
    const runId = await w.start({
      num_rollout: steps,
      rollout_batch_size: rbs,
      n_samples_per_prompt: 8,
      over_sampling_batch_size: rbs,
      rollout_max_response_len: Number(values["max-len"]),
      dynamic_sampling_filter_path: null,
      custom_rm_path: join(repoRoot, "test/fixtures/reward-parity.mjs"),
      engine: { kind: "sglang", urls: [w.engine.url], logprob_check: "off", stream: false, batch_group: true },
    });
    const upPid = { value: -1 };
    const workersPid = { value: -1 };
    const cpu = startCpuSampler((pid, cmd) => {
      if (pid === upPid.value) return values.split ? "rlq_up_controller" : "rlq_up";
      if (pid === workersPid.value) return "rlq_workers";
      if (pid === w.engine.child.pid) return "fake_engine";
      if (/^postgres: /.test(cmd)) return "postgres";
      if (cmd.startsWith("redis-server") || cmd.includes("/redis-server")) return "redis";
      return null;
    });
    const nodeFlags = process.env.BENCH_NODE_FLAGS ? process.env.BENCH_NODE_FLAGS.split(" ") : [];
    const workers = values.split
      ? spawnRlq(["worker", "rollout", "reward"], w.env, [...(values.prof ? ["--cpu-prof", `--cpu-prof-dir=${values.prof}/workers`] : []), ...nodeFlags])
      : null;
    workersPid.value = workers?.child.pid ?? -1;
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done", ...(values.split ? ["--workers", "train,eval"] : [])], w.env, [
      ...(values.prof ? ["--cpu-prof", `--cpu-prof-dir=${values.prof}`] : []),
      ...nodeFlags,
    ]);
    upPid.value = up.child.pid ?? -1;
    const code = await up.exited;
    cpu.stop();
    workers?.kill("SIGTERM");
    await workers?.exited;
    if (code !== 0) throw new Error(up.output());
    const t = (
      await w.db.pool.query(
        `SELECT (SELECT min(created_at) FROM decisions WHERE run_id = $1 AND kind = 'prompts.drawn') AS first_draw,
              (SELECT max(created_at) FROM sample_rewards WHERE run_id = $1) AS last_reward,
              (SELECT count(*)::int FROM sample_rewards WHERE run_id = $1) AS rewards`,
        [runId],
      )
    ).rows[0] as { first_draw: Date; last_reward: Date; rewards: number };
    const seconds = (t.last_reward.getTime() - t.first_draw.getTime()) / 1000;
    // CPU per process in the window (seconds, and ms per sample): what the control plane costs, whatever the box.
    const cpuInWindow = cpu.between(t.first_draw.getTime(), t.last_reward.getTime());
    const cpuMsPerSample = Object.fromEntries(Object.entries(cpuInWindow).map(([k, v]) => [k, Math.round((v / t.rewards) * 1e6) / 1000]));
    // Where the time went: ms after the first draw at which the first, median and last fact of each kind landed.
    const timeline = Object.fromEntries(
      (
        await w.db.pool.query<{ kind: string; ms: number[] }>(
          `WITH t0 AS (SELECT min(created_at) AS t FROM decisions WHERE run_id = $1 AND kind = 'prompts.drawn'),
            facts AS (
              SELECT 'dispatched' AS kind, created_at FROM decisions WHERE run_id = $1 AND kind = 'group.dispatched'
              UNION ALL SELECT 'generated', created_at FROM group_rounds WHERE run_id = $1
              UNION ALL SELECT 'rewarded', created_at FROM sample_rewards WHERE run_id = $1)
       SELECT kind, percentile_disc(ARRAY[0, 0.5, 1]::float8[]) WITHIN GROUP (ORDER BY ms) AS ms
         FROM (SELECT kind, (extract(epoch FROM created_at - (SELECT t FROM t0)) * 1000)::int AS ms FROM facts) f GROUP BY kind`,
          [runId],
        )
      ).rows.map((r) => [r.kind, r.ms]),
    );
    const copy = await copyRate(w.env.DATABASE_URL as string, runId);
    // The ceiling on this box: the most samples/s any control plane could reach if it cost no CPU at all,
    // while the fake engine still answers each sample and Postgres still ingests its row as a COPY
    // would (both share the box's cores), as a ratio to the COPY rate: the best `ratio_vs_copy` possible here.
    const engineMs = ((cpuInWindow.fake_engine ?? 0) * 1000) / t.rewards;
    const ceiling = (pgMsPerRow: number, rate: number) => (cpus().length * 1000) / (engineMs + pgMsPerRow) / rate;
    return {
      samplesPerS: t.rewards / seconds,
      samples: t.rewards,
      seconds,
      timelineMs: timeline,
      cpuSecondsInWindow: cpuInWindow,
      cpuMsPerSample,
      copyRowsPerS: copy.rowsPerS,
      copyLoggedRowsPerS: copy.loggedRowsPerS,
      copyRows: copy.rows,
      copyPgCpuMsPerRow: copy.pgCpuMsPerRow,
      copyLoggedPgCpuMsPerRow: copy.loggedPgCpuMsPerRow,
      ceilingRatioVsCopy: ceiling(copy.pgCpuMsPerRow, copy.rowsPerS),
      ceilingRatioVsCopyLogged: ceiling(copy.loggedPgCpuMsPerRow, copy.loggedRowsPerS),
    };
  } finally {
    await w.close();
  }
}

await prepareServices();
const out: Record<string, unknown> = {
  bench: "control-plane",
  split: values.split,
  steps,
  rollout_batch_size: rbs,
  n_samples_per_prompt: 8,
  reps,
  rollout_max_response_len: Number(values["max-len"]),
  stop_prob: Number(values["stop-prob"]),
  engine_model: values["engine-model"],
};
for (const queue of values.queues.split(",") as Array<"redis" | "postgres">) {
  const runs = [];
  for (let i = 0; i < reps; i++) runs.push(await once(queue));
  const sps = median(runs.map((r) => r.samplesPerS));
  const copy = median(runs.map((r) => r.copyRowsPerS));
  const logged = median(runs.map((r) => r.copyLoggedRowsPerS));
  out[queue] = {
    runs,
    median_samples_per_s: sps,
    median_copy_rows_per_s: copy,
    ratio_vs_copy: sps / copy,
    median_copy_logged_rows_per_s: logged,
    ratio_vs_copy_logged: sps / logged,
    median_ceiling_ratio_vs_copy: median(runs.map((r) => r.ceilingRatioVsCopy)),
    median_ceiling_ratio_vs_copy_logged: median(runs.map((r) => r.ceilingRatioVsCopyLogged)),
  };
  process.stderr.write(
    `${queue}: ${sps.toFixed(0)} samples/s vs COPY ${copy.toFixed(0)} rows/s into a temp table (x${(sps / copy).toFixed(2)}), ${logged.toFixed(0)} rows/s into a logged indexed table (x${(sps / logged).toFixed(2)}); ceiling on this box with a free control plane x${median(runs.map((r) => r.ceilingRatioVsCopy)).toFixed(2)} / x${median(runs.map((r) => r.ceilingRatioVsCopyLogged)).toFixed(2)}\n`,
  );
}
// The default shape keeps bench/results/control-plane.json; long responses get their own file.
await writeResult(`control-plane${values["max-len"] === "16" ? "" : `-len${values["max-len"]}`}${values.split ? "-split" : ""}`, out);
