/**
 * @file The rollout viewer's routes (docs/observability.md "Rollout viewer"):
 * run → steps → a step's groups → samples → one sample's tokens, and two steps
 * side by side. Each answer is JSON with the rows, the cursor of the next page
 * and the SQL that made it (`sql`: name, statement and the `rlq sql` command),
 * read through `readSelect` (store/dashboard-read.ts) on the reader pool. The
 * page itself is static/viewer.mjs, served here as /viewer.js.
 */
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Express, NextFunction, Request, Response } from "express";
import { z } from "zod";
import type { Db } from "../store/db.ts";
import { readSelect } from "../store/dashboard-read.ts";
import type { RunContextCache } from "../runtime/run-context.ts";
import { RlqError } from "../lib/errors.ts";
import { createLogger, type Logger } from "../observability/logger.ts";
import { readEnv } from "../config/env.ts";
import {
  groupDecisions,
  groupsPage,
  inlined,
  rlqSqlCommand,
  sampleRewardsOf,
  sampleRow,
  samplesPage,
  sampleSegmentsOf,
  stepSummary,
  stepsPage,
  type SampleFilter,
  type Statement,
} from "./viewer-sql.ts";

export interface ViewerOptions {
  /** The rlq_reader pool: every read of the viewer. */
  readerDb: Db;
  /** The run's tokenizer, to show each token's text. */
  contexts: RunContextCache;
  log?: Logger;
}

/** What a page shows under "SQL": the statement as `rlq sql` takes it. */
export interface ShownSql {
  name: string;
  sql: string;
  command: string;
}

const staticDir = join(dirname(fileURLToPath(import.meta.url)), "static");

const int = z.coerce.number().int();
const optNum = z
  .string()
  .optional()
  .transform((s, ctx) => {
    if (s === undefined || s.trim() === "") return undefined;
    const n = Number(s);
    if (!Number.isFinite(n)) {
      ctx.addIssue({ code: "custom", message: `expected a number, got '${s}'` });
      return z.NEVER;
    }
    return n;
  });
const optInt = optNum.refine((n) => n === undefined || Number.isInteger(n), "expected a whole number");
const optText = z
  .string()
  .optional()
  .transform((s) => (s === undefined || s === "" ? undefined : s));
const statusValues = ["pending", "completed", "truncated", "aborted", "failed"] as const;
const outcomeValues = ["kept", "filtered", "discarded"] as const;

const stepsQuery = z.object({ before: optInt, limit: optInt.pipe(z.number().int().min(1).max(500).optional()) });
const groupsQuery = z.object({
  after: optInt,
  outcome: optText.pipe(z.enum([...outcomeValues, "aborted"]).optional()),
  limit: optInt.pipe(z.number().int().min(1).max(500).optional()),
});
/** The samples list's query string: the same keys the page keeps in its URL hash. */
export const samplesQuery = z.object({
  step: optInt,
  group: optInt,
  rmin: optNum,
  rmax: optNum,
  lmin: optInt,
  lmax: optInt,
  status: optText.pipe(z.enum(statusValues).optional()),
  outcome: optText.pipe(z.enum(outcomeValues).optional()),
  version: optInt,
  smin: optInt,
  smax: optInt,
  q: optText.pipe(z.string().max(200).optional()),
  after: optText.pipe(
    z
      .string()
      .regex(/^\d+:\d+$/, "expected GROUP:SAMPLE, e.g. 12:3")
      .optional(),
  ),
  limit: optInt.pipe(z.number().int().min(1).max(500).optional()),
});

/** A page's query as parsed; every key may be left out. */
type Query<S extends z.ZodTypeAny> = Partial<z.infer<S>>;

export function sampleFilterOf(q: Query<typeof samplesQuery>): SampleFilter {
  const after = q.after?.split(":").map(Number) as [number, number] | undefined;
  return {
    step: q.step,
    group: q.group,
    rewardMin: q.rmin,
    rewardMax: q.rmax,
    lengthMin: q.lmin,
    lengthMax: q.lmax,
    status: q.status,
    outcome: q.outcome,
    version: q.version,
    stalenessMin: q.smin,
    stalenessMax: q.smax,
    text: q.q,
    after,
    limit: q.limit,
  };
}

/** Runs one statement as the reader and keeps it for the page's "SQL" panel. */
class Reads {
  readonly shown: ShownSql[] = [];
  constructor(private readonly db: Db) {}
  async run<Row = Record<string, unknown>>(name: string, s: Statement): Promise<Row[]> {
    this.shown.push({ name, sql: inlined(s), command: rlqSqlCommand(s) });
    return readSelect<Row>(this.db, s.text, s.params);
  }
}

/** bigint columns arrive as strings: the ids the page links by are numbers. */
function ids<T extends Record<string, unknown>>(rows: T[], keys: readonly string[] = ["group_id"]): T[] {
  for (const r of rows) for (const k of keys) if (typeof r[k] === "string") (r as Record<string, unknown>)[k] = Number(r[k]);
  return rows;
}

export interface ViewerPages {
  steps(runId: string, q: Query<typeof stepsQuery>): Promise<Record<string, unknown>>;
  step(runId: string, step: number): Promise<Record<string, unknown>>;
  groups(runId: string, step: number, q: Query<typeof groupsQuery>): Promise<Record<string, unknown>>;
  samples(runId: string, q: Query<typeof samplesQuery>): Promise<Record<string, unknown>>;
  sample(runId: string, groupId: number, sampleIndex: number): Promise<Record<string, unknown>>;
}

/** The viewer's pages as functions of their inputs (the routes below, bench/viewer.ts and the screenshots call these). */
export function viewerPages(options: ViewerOptions): ViewerPages {
  const { readerDb, contexts } = options;
  let log = options.log ?? null;
  const logger = () => (log ??= createLogger(readEnv().RLQ_LOG_LEVEL, "rlq-dashboard"));

  async function tokenPieces(runId: string, tokens: number[]): Promise<string[] | null> {
    try {
      const ctx = await contexts.get(runId);
      return tokens.map((t) => ctx.tokenizer.decode([t]));
    } catch (e) {
      // The page then shows token ids instead of text: nothing is hidden, only less readable.
      logger().warn({ runId, err: e }, "rollout viewer: the run's tokenizer could not be loaded; showing token ids");
      return null;
    }
  }

  return {
    async steps(runId, q) {
      const reads = new Reads(readerDb);
      const limit = q.limit ?? 25;
      const rows = await reads.run("steps", stepsPage(runId, q.before ?? null, limit));
      const last = rows.at(-1);
      return { steps: rows, next: rows.length === limit && last ? Number(last.step) : null, sql: reads.shown };
    },
    async step(runId, step) {
      const reads = new Reads(readerDb);
      const [summary] = await reads.run("step summary", stepSummary(runId, step));
      return { summary: summary ?? null, sql: reads.shown };
    },
    async groups(runId, step, q) {
      const reads = new Reads(readerDb);
      const limit = q.limit ?? 50;
      const rows = ids(await reads.run("groups", groupsPage(runId, step, { after: q.after ?? null, outcome: q.outcome ?? null, limit })));
      const last = rows.at(-1);
      return { groups: rows, next: rows.length === limit && last ? Number(last.group_id) : null, sql: reads.shown };
    },
    async samples(runId, q) {
      const reads = new Reads(readerDb);
      const filter = sampleFilterOf(q);
      const limit = filter.limit ?? 50;
      const rows = ids(await reads.run("samples", samplesPage(runId, { ...filter, limit })));
      const last = rows.at(-1);
      return { samples: rows, next: rows.length === limit && last ? `${Number(last.group_id)}:${Number(last.sample_index)}` : null, sql: reads.shown };
    },
    async sample(runId, groupId, sampleIndex) {
      const reads = new Reads(readerDb);
      const [row, segments, rewards, decisions] = await Promise.all([
        reads.run("sample", sampleRow(runId, groupId, sampleIndex)),
        reads.run("segments", sampleSegmentsOf(runId, groupId, sampleIndex)),
        reads.run("rewards", sampleRewardsOf(runId, groupId, sampleIndex)),
        reads.run("group decisions", groupDecisions(runId, groupId)),
      ]);
      const sample = ids(row)[0];
      if (!sample) throw new RlqError("sample_not_found", `run ${runId} has no sample ${groupId}/${sampleIndex} in rollout_history`);
      const pieces = await tokenPieces(runId, (sample.tokens as number[] | null) ?? []);
      return { sample: { ...sample, pieces }, segments, rewards, decisions: ids(decisions, ["seq", "group_id"]), sql: reads.shown };
    },
  };
}

/** Mounts /viewer.js and /api/viewer/... on `app`. */
export function mountViewer(app: Express, options: ViewerOptions): void {
  const pages = viewerPages(options);
  const wrap = (fn: (req: Request) => Promise<unknown>) => (req: Request, res: Response, next: NextFunction) => {
    fn(req).then((body) => res.json(body), next);
  };
  const runId = (req: Request) => String(req.params.runId);
  app.get("/viewer.js", (_req, res) => res.type("application/javascript").sendFile(join(staticDir, "viewer.mjs")));
  app.get(
    "/api/viewer/:runId/steps",
    wrap((req) => pages.steps(runId(req), stepsQuery.parse(req.query))),
  );
  app.get(
    "/api/viewer/:runId/steps/:step",
    wrap((req) => pages.step(runId(req), int.nonnegative().parse(req.params.step))),
  );
  app.get(
    "/api/viewer/:runId/steps/:step/groups",
    wrap((req) => pages.groups(runId(req), int.nonnegative().parse(req.params.step), groupsQuery.parse(req.query))),
  );
  app.get(
    "/api/viewer/:runId/samples",
    wrap((req) => pages.samples(runId(req), samplesQuery.parse(req.query))),
  );
  app.get(
    "/api/viewer/:runId/samples/:groupId/:sampleIndex",
    wrap((req) => pages.sample(runId(req), int.nonnegative().parse(req.params.groupId), int.nonnegative().parse(req.params.sampleIndex))),
  );
}
