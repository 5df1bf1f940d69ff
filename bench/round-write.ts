/**
 * The rollout worker's round write (store/rollout-facts.ts `writeRounds`): rounds of the cluster
 * simulation's shape (8 samples a group, lognormal lengths in rlq tokens) written in batches of 64,
 * as the worker's coalescer sends them. Compared, interleaved in the same run, with the encoding
 * rlq used before session 17: the same statement with one `{...}` text literal per segment and
 * column, which Postgres parsed number by number (float4in per log-prob).
 *
 * Reported per segment: wall time, the client's CPU (this process) and the server's (the backend,
 * from /proc). `npx tsx bench/round-write.ts [--reps 7] [--batches 20]` -> bench/results/round-write.json.
 */
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { median, prepareServices, writeResult } from "./lib.ts";
import { createTestDatabase } from "../test/helpers/services.ts";
import { createDb, type Db } from "../src/store/db.ts";
import { writeRounds, type RoundFacts } from "../src/store/rollout-facts.ts";
import { defaultParams, responseLength } from "./sim/model.ts";

const { values } = parseArgs({ options: { reps: { type: "string", default: "7" }, batches: { type: "string", default: "20" } } });
const reps = Number(values.reps);
const batches = Number(values.batches);
const p = defaultParams(64);
const SAMPLES = 8;
const BATCH = 64;

/** The text encoding before session 17: each segment's arrays as `{...}` literals, cast by Postgres. */
async function writeRoundsAsTextLiterals(db: Db, rounds: readonly RoundFacts[]): Promise<void> {
  const segs = rounds.flatMap((r) => r.segments.map((s) => ({ r, s })));
  await db.pool.query(
    `WITH marker AS (
       INSERT INTO group_rounds (run_id, group_id, round, step, job_id, is_complete, was_aborted)
       SELECT * FROM unnest($1::text[], $2::bigint[], $3::int[], $4::int[], $5::text[], $6::boolean[], $7::boolean[])
       ON CONFLICT DO NOTHING RETURNING run_id, group_id, round)
     INSERT INTO sample_segments (run_id, group_id, sample_index, segment_index, round, step, job_id,
       weight_version, expected_weight_version, is_version_mismatch, token_start, token_end, tokens, log_probs, loss_mask,
       engine, finish_reason, status, error)
     SELECT v.run_id, v.group_id, v.sample_index, 0, v.round, 0, 'j', 1, 1, false, 0, cardinality(v.tokens::int4[]),
            v.tokens::int4[], v.log_probs::float4[], v.loss_mask::int2[], 'e', 'stop', 'completed', NULL
       FROM unnest($8::text[], $9::bigint[], $10::int[], $11::int[], $12::text[], $13::text[], $14::text[])
         AS v(run_id, group_id, round, sample_index, tokens, log_probs, loss_mask)
       JOIN marker w ON w.run_id = v.run_id AND w.group_id = v.group_id AND w.round = v.round`,
    [
      rounds.map((r) => r.runId),
      rounds.map((r) => r.groupId),
      rounds.map((r) => r.round),
      rounds.map((r) => r.step),
      rounds.map((r) => r.jobId),
      rounds.map((r) => r.isComplete),
      rounds.map((r) => r.wasAborted),
      segs.map((x) => x.r.runId),
      segs.map((x) => x.r.groupId),
      segs.map((x) => x.r.round),
      segs.map((x) => x.s.sampleIndex),
      segs.map((x) => `{${x.s.tokens.join(",")}}`),
      segs.map((x) => `{${x.s.logProbs.join(",")}}`),
      segs.map((x) => `{${x.s.lossMask.join(",")}}`),
    ],
  );
}

let nextGroup = 0;
function makeRounds(runId: string): RoundFacts[] {
  return Array.from({ length: BATCH }, () => {
    const groupId = nextGroup++;
    return {
      runId,
      groupId,
      round: 0,
      step: 0,
      jobId: `gen-${groupId}`,
      expectedWeightVersion: 1,
      isComplete: true,
      wasAborted: false,
      segments: Array.from({ length: SAMPLES }, (_, i) => {
        const n = Math.max(1, Math.ceil(responseLength(`${runId}-${groupId}-${i}`, p) / p.tokenScale));
        const tokens = Array.from({ length: n }, (_, t) => (groupId * 7919 + t * 104_729) % 151_000);
        return {
          sampleIndex: i,
          segmentIndex: 0,
          round: 0,
          tokenStart: 0,
          error: null,
          weightVersion: 1,
          tokens,
          logProbs: tokens.map((t) => -((t % 9973) / 997.3)),
          lossMask: tokens.map(() => 1),
          finishReason: "stop",
          status: "completed" as const,
          engine: "e",
        };
      }),
    };
  });
}

function backendCpuMs(pid: number): number {
  const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.split(" ") ?? [];
  return (Number(f[11]) + Number(f[12])) * 10;
}

await prepareServices();
const database = await createTestDatabase("rlq_bench_roundwrite");
const db = createDb(database.adminUrl, { max: 1 });
try {
  const pid = (await db.pool.query<{ pid: number }>("SELECT pg_backend_pid() AS pid")).rows[0]?.pid as number;
  const ways = {
    binary: (rounds: RoundFacts[]) => writeRounds(db, rounds).then(() => undefined),
    text_literals: (rounds: RoundFacts[]) => writeRoundsAsTextLiterals(db, rounds),
  };
  type Way = keyof typeof ways;
  const per: Record<Way, { wall: number[]; client: number[]; server: number[] }> = {
    binary: { wall: [], client: [], server: [] },
    text_literals: { wall: [], client: [], server: [] },
  };
  let segments = 0;
  let tokens = 0;
  for (let rep = 0; rep < reps + 1; rep++) {
    // Interleaved, the order alternating; rep 0 warms up and is not counted.
    const order: Way[] = rep % 2 === 0 ? ["binary", "text_literals"] : ["text_literals", "binary"];
    for (const way of order) {
      const all = Array.from({ length: batches }, () => makeRounds(`rw-${way}-${rep}`));
      const n = all.reduce((a, b) => a + b.reduce((x, r) => x + r.segments.length, 0), 0);
      if (rep === 1 && way === "binary") {
        segments = n;
        tokens = all.flat().reduce((a, r) => a + r.segments.reduce((x, s) => x + s.tokens.length, 0), 0);
      }
      const c0 = process.cpuUsage();
      const s0 = backendCpuMs(pid);
      const w0 = performance.now();
      for (const rounds of all) await ways[way](rounds);
      const wall = performance.now() - w0;
      const c = process.cpuUsage(c0);
      const server = backendCpuMs(pid) - s0;
      if (rep === 0) continue;
      per[way].wall.push((wall * 1000) / n);
      per[way].client.push((c.user + c.system) / n);
      per[way].server.push((server * 1000) / n);
    }
  }
  const us = (xs: number[]) => Math.round(median(xs) * 10) / 10;
  const summary = Object.fromEntries(
    (Object.keys(per) as Way[]).map((w) => [
      w,
      { wall_us_per_segment: us(per[w].wall), client_cpu_us_per_segment: us(per[w].client), server_cpu_us_per_segment: us(per[w].server) },
    ]),
  ) as Record<Way, { wall_us_per_segment: number; client_cpu_us_per_segment: number; server_cpu_us_per_segment: number }>;
  const ratio = (k: keyof (typeof summary)["binary"]) => Math.round((summary.text_literals[k] / summary.binary[k]) * 100) / 100;
  await writeResult("round-write", {
    bench: "round-write",
    note: "medians over reps of per-segment costs; one connection; server CPU from /proc (10 ms ticks, so the per-rep totals are coarse); text_literals = the statement before session 17",
    reps,
    batches_per_rep: batches,
    rounds_per_batch: BATCH,
    segments_per_rep: segments,
    mean_tokens_per_segment: Math.round((tokens / Math.max(1, segments)) * 10) / 10,
    ...summary,
    text_over_binary: { wall: ratio("wall_us_per_segment"), client_cpu: ratio("client_cpu_us_per_segment"), server_cpu: ratio("server_cpu_us_per_segment") },
  });
} finally {
  await db.close();
  await database.drop();
}
