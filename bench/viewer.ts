/**
 * @file The rollout viewer's pages on a run with a million samples of history
 * (`npx tsx bench/viewer.ts [--samples 1000000] [--reps 7]`, JSON to bench/results/viewer.json).
 *
 * A demo run (examples/demo.yaml, so the sample page decodes with its real tokenizer) is given
 * `steps` steps of history by COPY: per step 96 groups of 8 samples (64 kept, 16 filtered with
 * slime's zero-std reason, 16 discarded as surplus, 4 of them aborted in a first round), varied
 * rewards, lengths of 4 to 64 tokens and per-token arrays, the train step and its metrics, and the
 * groups' decisions. Then each page the viewer serves (dashboard/viewer.ts) is asked `reps` times
 * through the reader pool, as the dashboard asks it, and the median and the slowest are kept. The
 * target is under 1 s a page (issue 44).
 *
 * `--keep-db` keeps the filled database (named on stderr) for EXPLAIN by hand.
 *
 * What it leaves out: sample_segments and sample_rewards rows (the sample page reads them by
 * primary key, so their number does not change its cost) and in-flight samples.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { pipeline } from "node:stream/promises";
import { Readable } from "node:stream";
import { from as copyFrom } from "pg-copy-streams";
import { createDb, type Db } from "../src/store/db.ts";
import { startRun } from "../src/api.ts";
import { fold } from "../src/core/run-state.ts";
import { loadDecisionsAfter } from "../src/store/decision-log.ts";
import { createRunContextCache } from "../src/runtime/run-context.ts";
import { resolveRmType, tokenizerFor } from "../src/runtime/plugins-registry.ts";
import { viewerPages } from "../src/dashboard/viewer.ts";
import { loadRunOverview, sql } from "../src/dashboard/queries.ts";
import { migrationsFolder } from "../src/store/migrate.ts";
import { readSelect } from "../src/store/dashboard-read.ts";
import { createTestDatabase } from "../test/helpers/services.ts";
import { repoRoot } from "../test/helpers/processes.ts";
import { median, prepareServices, writeResult } from "./lib.ts";

const { values } = parseArgs({
  options: { samples: { type: "string", default: "1000000" }, reps: { type: "string", default: "7" }, "keep-db": { type: "boolean", default: false } },
});
const targetSamples = Number(values.samples);
const reps = Number(values.reps);
const groupsPerStep = 96;
const n = 8;
const steps = Math.ceil(targetSamples / (groupsPerStep * n));

/** A seeded generator (mulberry32): the same history on every run of the bench. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const copyText = (v: string) => v.replace(/\\/g, "\\\\").replace(/\t/g, "\\t").replace(/\n/g, "\\n").replace(/\r/g, "\\r");
const arr = (xs: ArrayLike<number>) => `{${Array.prototype.join.call(xs, ",")}}`;

/** rollout_history lines of one step, in COPY's text format. */
function* historyLines(runId: string, step: number, random: () => number): Generator<string> {
  for (let j = 0; j < groupsPerStep; j++) {
    const g = step * groupsPerStep + j;
    const outcome = j < 64 ? "kept" : j < 80 ? "filtered" : "discarded";
    const p = random();
    const a = Math.floor(random() * 90) + 10;
    const b = Math.floor(random() * 90) + 10;
    const prompt = `${a}+${b}=`;
    const promptTokens = [1, ...[...prompt].map((c) => c.charCodeAt(0) % 30)];
    const allSame = outcome === "filtered" ? (random() < 0.5 ? 0 : 1) : null;
    for (let i = 0; i < n; i++) {
      const len = 4 + Math.floor(random() * 61);
      const reward = allSame ?? (random() < p ? 1 : 0);
      const answer = reward === 1 ? String(a + b) : String(Math.floor(random() * 200));
      const response = `\\boxed{${answer}}` + " ...".repeat(Math.max(0, Math.floor((len - 8) / 4)));
      const tokens = promptTokens.concat(Array.from({ length: len }, (_, k) => (k * 7 + i) % 30));
      const logProbs = Array.from({ length: len }, () => -(random() ** 3) * 4).map((x) => x.toFixed(4));
      const versions = new Array<number>(len).fill(step);
      const truncated = len === 64;
      const row = [
        runId,
        step,
        g,
        i,
        g,
        copyText(prompt),
        copyText(response),
        arr(tokens),
        promptTokens.length,
        len,
        arr(new Array<number>(len).fill(1)),
        `{${logProbs.join(",")}}`,
        arr(versions),
        `{${step}}`,
        1,
        truncated ? "truncated" : "completed",
        truncated ? "length" : "stop",
        reward,
        copyText(JSON.stringify({ correct: reward, format: 1 })),
        outcome === "kept" ? "t" : "f",
        outcome,
        outcome === "filtered" ? `zero_std_${allSame}.0` : outcome === "discarded" ? "surplus" : "\\N",
        outcome === "kept" ? step : "\\N",
      ];
      yield row.join("\t") + "\n";
    }
  }
}

async function copyRows(db: Db, sql: string, lines: Iterable<string>): Promise<void> {
  const client = await db.pool.connect();
  try {
    const chunks = function* () {
      let buf: string[] = [];
      for (const l of lines) {
        buf.push(l);
        if (buf.length >= 1000) {
          yield buf.join("");
          buf = [];
        }
      }
      if (buf.length) yield buf.join("");
    };
    await pipeline(Readable.from(chunks()), client.query(copyFrom(sql)));
  } finally {
    client.release();
  }
}

/** Writes the history; returns how many samples and decisions it wrote. */
async function fill(db: Db, runId: string): Promise<{ samples: number; decisions: number; fillMs: number }> {
  const t0 = performance.now();
  const random = rng(44);
  await copyRows(
    db,
    `COPY rollout_history (run_id, step, group_id, sample_index, draw_ordinal, prompt, response, tokens, prompt_length, response_length,
       loss_mask, rollout_log_probs, token_versions, weight_versions, num_segments, status, finish_reason, reward, reward_components,
       kept, outcome, outcome_reason, trained_step) FROM STDIN`,
    (function* () {
      for (let s = 0; s < steps; s++) yield* historyLines(runId, s, random);
    })(),
  );
  const state = fold(runId, await loadDecisionsAfter(db, runId, -1));
  const epoch = (await db.pool.query<{ epoch: number }>("SELECT epoch FROM run_leases WHERE run_id = $1", [runId])).rows[0]?.epoch ?? 0;
  let seq = state.seq;
  const decision = (kind: string, step: number, groupId: number | null, payload: unknown) =>
    [runId, ++seq, epoch, kind, step, groupId ?? "\\N", copyText(JSON.stringify(payload))].join("\t") + "\n";
  const decisions: string[] = [];
  for (let s = 0; s < steps; s++) {
    for (let j = 0; j < groupsPerStep; j++) {
      const g = s * groupsPerStep + j;
      decisions.push(decision("group.dispatched", s, g, { groupId: g, round: 0, step: s, weightVersion: s }));
      if (j >= 92) {
        decisions.push(decision("group.aborted", s, g, { groupId: g, round: 0, step: s, reason: `weight sync to version ${s + 1}` }));
        decisions.push(decision("group.dispatched", s, g, { groupId: g, round: 1, step: s, weightVersion: s }));
      }
      const outcome = j < 64 ? "kept" : j < 80 ? "filtered" : "discarded";
      decisions.push(decision("group.outcome", s, g, { groupId: g, step: s, outcome, reason: outcome === "discarded" ? "surplus" : null }));
    }
  }
  await copyRows(db, "COPY decisions (run_id, seq, lease_epoch, kind, step, group_id, payload) FROM STDIN", decisions);
  await db.pool.query("UPDATE runs SET last_seq = $2, step = $3, weight_version = $3, updated_at = now() WHERE id = $1", [runId, seq, steps]);
  const trainSteps: string[] = [];
  const metrics: string[] = [];
  for (let s = 0; s < steps; s++) {
    trainSteps.push([runId, s, "bench", s, s + 1, 64 * n, 64 * n * 34, "file:///dev/null", "0".repeat(64)].join("\t") + "\n");
    for (const [k, v] of [
      ["pg_loss", 1e-3 * Math.sin(s)],
      ["train_rollout_logprob_abs_diff", 2e-7 + 1e-8 * (s % 7)],
      ["grad_norm", 1 + (s % 5) / 10],
    ] as const)
      metrics.push([runId, s, k, v].join("\t") + "\n");
  }
  await copyRows(
    db,
    "COPY train_steps (run_id, step, attempt, weight_version_in, weight_version_out, num_samples, num_tokens, checkpoint_uri, checkpoint_sha256) FROM STDIN",
    trainSteps,
  );
  await copyRows(db, "COPY train_metrics (run_id, step, key, value) FROM STDIN", metrics);
  // The per-step summaries the train commits would have written (store/projections.ts), made as
  // migration 0010 makes them for runs recorded before it.
  const backfill = readFileSync(join(migrationsFolder, "0010_step_summaries.sql"), "utf8").split("--> statement-breakpoint").at(-1) ?? "";
  await db.pool.query(backfill);
  await db.pool.query("ANALYZE rollout_history, decisions, train_steps, train_metrics, step_summaries");
  return { samples: steps * groupsPerStep * n, decisions: decisions.length, fillMs: performance.now() - t0 };
}

/** The run page's statements (loadRunOverview) and their parameters. */
const overviewParams: Record<string, ((runId: string) => unknown[]) | undefined> = {
  run: undefined,
  trainMetrics: undefined,
  rewardPerStep: undefined,
  trainSteps: undefined,
  staleness: undefined,
  inFlight: undefined,
  busyFraction: undefined,
  decisionTail: (runId) => [runId, 40],
};

async function time(fn: () => Promise<unknown>): Promise<{ median_ms: number; max_ms: number; runs_ms: number[] }> {
  await fn(); // a first call warms the pool's connections and the page cache like a user's first click
  const runs: number[] = [];
  for (let r = 0; r < reps; r++) {
    const t = performance.now();
    await fn();
    runs.push(Math.round((performance.now() - t) * 10) / 10);
  }
  return { median_ms: median(runs), max_ms: Math.max(...runs), runs_ms: runs };
}

await prepareServices();
const database = await createTestDatabase("rlq_bviewer");
const db = createDb(database.adminUrl, { max: 4 });
const readerDb = createDb(database.readerUrl, { max: 4 });
try {
  const { runId } = await startRun(db, { config: join(repoRoot, "examples/demo.yaml"), set: [`num_rollout=${steps}`], name: "viewer-bench" });
  const filled = await fill(db, runId);
  process.stderr.write(`filled ${filled.samples} samples, ${filled.decisions} decisions in ${(filled.fillMs / 1000).toFixed(0)} s\n`);
  const pages = viewerPages({ readerDb, contexts: createRunContextCache(db, { resolveRmType, tokenizerFor }) });
  const mid = Math.floor(steps / 2);
  const midGroup = mid * groupsPerStep + 3;
  const cases: Array<[string, () => Promise<unknown>]> = [
    ["steps (newest page)", () => pages.steps(runId, {})],
    ["steps (a page mid-run)", () => pages.steps(runId, { before: mid })],
    ["step summary", () => pages.step(runId, mid)],
    ["step groups", () => pages.groups(runId, mid, {})],
    ["step groups, aborted only", () => pages.groups(runId, mid, { outcome: "aborted" })],
    ["step samples", () => pages.samples(runId, { step: mid })],
    ["step samples, reward >= 0.5", () => pages.samples(runId, { step: mid, rmin: 0.5 })],
    [
      "step samples, every filter",
      () =>
        pages.samples(runId, { step: mid, rmin: 0.5, lmin: 10, lmax: 60, status: "completed", outcome: "kept", version: mid, smin: 0, smax: 0, q: "boxed" }),
    ],
    ["group samples", () => pages.samples(runId, { step: mid, group: midGroup })],
    ["sample", () => pages.sample(runId, midGroup, 0)],
    [
      "compare two steps",
      () => Promise.all([pages.step(runId, mid), pages.step(runId, mid + 1), pages.groups(runId, mid, {}), pages.groups(runId, mid + 1, {})]),
    ],
    ["run-wide samples, first page", () => pages.samples(runId, {})],
    ["run-wide samples, reward >= 0.5, length >= 60", () => pages.samples(runId, { rmin: 0.5, lmin: 60 })],
    ["run-wide samples, text", () => pages.samples(runId, { q: "boxed{150}" })],
    ["run-wide samples, next page deep in the run", () => pages.samples(runId, { after: `${midGroup}:7` })],
  ];
  const results: Record<string, unknown> = {};
  for (const [name, fn] of cases) {
    results[name] = await time(fn);
    process.stderr.write(`${name}: ${JSON.stringify(results[name])}\n`);
  }
  // The run's chart page (dashboard/queries.ts, not the viewer): each of its statements alone, and
  // the whole page as the dashboard loads it (its statements at once).
  const overview: Record<string, number | string> = {};
  for (const [name, text] of Object.entries(sql)) {
    if (!(name in overviewParams)) continue;
    try {
      overview[name] = (await time(() => readSelect(readerDb, text, overviewParams[name]?.(runId) ?? [runId], 120_000))).median_ms;
    } catch (e) {
      overview[name] = `failed: ${(e as Error).message}`;
    }
    process.stderr.write(`run overview ${name}: ${overview[name]}\n`);
  }
  results["run overview page"] = await time(() => loadRunOverview(readerDb, runId));
  process.stderr.write(`run overview page: ${JSON.stringify(results["run overview page"])}\n`);
  const slowest = Math.max(...Object.values(results).map((r) => (r as { median_ms: number }).median_ms));
  await writeResult(values.samples === "1000000" ? "viewer" : `viewer-${values.samples}`, {
    bench: "viewer",
    samples: filled.samples,
    steps,
    groups_per_step: groupsPerStep,
    n_samples_per_prompt: n,
    decisions: filled.decisions,
    fill_s: Math.round(filled.fillMs / 100) / 10,
    reps,
    reader: "rlq_reader",
    target_ms: 1000,
    slowest_median_ms: slowest,
    pages: results,
    run_overview_statement_ms: overview,
  });
} finally {
  await readerDb.close();
  await db.close();
  // --keep-db: the filled database stays for EXPLAIN ANALYZE by hand (its name is printed).
  if (values["keep-db"]) process.stderr.write(`kept database ${database.name}\n`);
  else await database.drop();
}
