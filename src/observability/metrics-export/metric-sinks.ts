/**
 * The metric sinks of one run: read committed points from Postgres and hand
 * each sink the ones it has not acknowledged. Each sink knows what it wrote
 * (TensorBoard: its event files; W&B: its state file, saved after the server
 * took the lines), so a crash at any point re-reads and re-offers points and
 * the sink drops the ones already there: nothing dropped, nothing doubled.
 */

import { isAbsolute, join, resolve } from "node:path";
import { z } from "zod";
import type { Db } from "../../store/db.ts";
import { readSelect } from "../../store/dashboard-read.ts";
import { tryAdvisoryLock } from "../../store/advisory-lock.ts";
import { readSecret } from "../../config/secrets.ts";
import type { Logger } from "../logger.ts";
import { sleep } from "../../lib/sleep.ts";
import { metricExportKeys, type MetricExportConfig } from "./config.ts";
import { readEvalPoints, readTrainPoints, type MetricPoint } from "./points.ts";
import { openTensorboardSink, type TensorboardSink } from "./tensorboard-sink.ts";
import { openWandbSink, type WandbSink } from "./wandb-sink.ts";
import { RlqError } from "../../lib/errors.ts";

export interface MetricSinkDeps {
  db: Db;
  /** RLQ_HOME: relative tensorboard_dir / wandb_dir are under it. */
  home: string;
  /** The process environment (for wandb_key: {env}). */
  secrets: Readonly<Record<string, string | undefined>>;
  log?: Logger;
  fetchImpl?: typeof fetch;
}

const exportConfigSchema = z.object(metricExportKeys);
const runRowSql = "SELECT id, name, status, config FROM runs WHERE id = $1";

export interface RunSinks {
  tensorboard: TensorboardSink | null;
  wandb: WandbSink | null;
  close(): void;
}

const under = (home: string, p: string) => (isAbsolute(p) ? p : resolve(home, p));

export async function openRunSinks(deps: MetricSinkDeps, runId: string): Promise<RunSinks & { status: string }> {
  const [row] = await readSelect<{ id: string; name: string; status: string; config: Record<string, unknown> }>(deps.db, runRowSql, [runId]);
  if (!row) throw new RlqError("run_not_found", `run ${runId} does not exist`);
  // Runs recorded before these keys existed get the defaults (no sinks).
  const cfg: MetricExportConfig = exportConfigSchema.parse(Object.fromEntries(Object.keys(metricExportKeys).map((k) => [k, row.config[k] ?? undefined])));
  const tensorboard = cfg.tensorboard_dir === null ? null : openTensorboardSink(join(under(deps.home, cfg.tensorboard_dir), runId));
  let wandb: WandbSink | null = null;
  if (cfg.use_wandb && cfg.wandb_project !== null) {
    wandb = await openWandbSink({
      mode: cfg.wandb_mode,
      host: cfg.wandb_host,
      apiKey: cfg.wandb_key === null ? null : readSecret(cfg.wandb_key, `run ${runId}: wandb_key`, deps.secrets),
      project: cfg.wandb_project,
      entity: cfg.wandb_team,
      group: cfg.wandb_group,
      runName: runId,
      displayName: row.name,
      config: row.config,
      dir: join(under(deps.home, cfg.wandb_dir), `${cfg.wandb_mode}-run-${runId}`),
      ...(deps.fetchImpl ? { fetchImpl: deps.fetchImpl } : {}),
    });
  }
  return { tensorboard, wandb, status: row.status, close: () => tensorboard?.close() };
}

/** One pass: every committed point not yet in a sink goes there. Returns how many points each sink took. */
export async function syncRunSinks(deps: MetricSinkDeps, runId: string, sinks: RunSinks): Promise<{ tensorboard: number; wandb: number }> {
  const counts = { tensorboard: 0, wandb: 0 };
  if (!sinks.tensorboard && !sinks.wandb) return counts;
  // Start after the last train step both sinks hold; points already held are skipped per sink.
  // Train steps commit in order, so each sink's last train step says which steps it holds.
  let after = Math.min(sinks.tensorboard?.lastTrainStep() ?? Number.POSITIVE_INFINITY, sinks.wandb?.lastTrainStep() ?? Number.POSITIVE_INFINITY);
  for (;;) {
    const train = await readTrainPoints(deps.db, runId, after, 200);
    if (train.length === 0) break;
    counts.tensorboard += offerTensorboard(sinks, train);
    if (sinks.wandb) counts.wandb += await sinks.wandb.write(train);
    after = (train[train.length - 1] as MetricPoint).step;
  }
  const evals = await readEvalPoints(deps.db, runId);
  counts.tensorboard += offerTensorboard(sinks, evals);
  if (sinks.wandb) counts.wandb += await sinks.wandb.write(evals);
  return counts;
}

function offerTensorboard(sinks: RunSinks, points: readonly MetricPoint[]): number {
  let n = 0;
  if (!sinks.tensorboard) return 0;
  for (const p of points) {
    if (sinks.tensorboard.has(p)) continue;
    sinks.tensorboard.write(p);
    n++;
  }
  return n;
}

/**
 * Keep a run's sinks up to date until `signal` aborts or the run is over
 * (then one last pass, and W&B is told the run finished). Only the process
 * holding the run's sink lock writes; others wait for it.
 */
export async function runMetricSinks(deps: MetricSinkDeps, runId: string, signal: AbortSignal, intervalMs = 2000): Promise<void> {
  // Most runs export nothing: decide that before taking a lock (which holds a pool connection).
  const [wanted] = await readSelect<{ wanted: boolean }>(
    deps.db,
    "SELECT (config->>'tensorboard_dir') IS NOT NULL OR coalesce((config->>'use_wandb')::boolean, false) AS wanted FROM runs WHERE id = $1",
    [runId],
  );
  if (wanted?.wanted !== true) return;
  let lock: Awaited<ReturnType<typeof tryAdvisoryLock>> = null;
  while (!signal.aborted && lock === null) {
    lock = await tryAdvisoryLock(deps.db, `rlq-metric-sinks:${runId}`).catch((e: unknown) => {
      // The points wait in Postgres: the lock is asked for again after intervalMs.
      deps.log?.warn({ runId, err: (e as Error).message }, "metric sinks: cannot take the sink lock yet, will retry");
      return null;
    });
    if (lock === null) await sleep(intervalMs, signal);
  }
  if (lock === null) return;
  let sinks: (RunSinks & { status: string }) | null = null;
  try {
    // W&B may be unreachable at first (upsertBucket): keep trying; the points wait in Postgres.
    while (sinks === null) {
      try {
        sinks = await openRunSinks(deps, runId);
      } catch (e) {
        deps.log?.warn({ runId, err: (e as Error).message }, "metric sinks: cannot open yet, will retry");
        if (signal.aborted) return;
        await sleep(intervalMs, signal);
      }
    }
    if (!sinks.tensorboard && !sinks.wandb) return;
    for (;;) {
      // One more pass after the signal: a run that just completed gets its last points and its finish.
      const isStopping = signal.aborted;
      try {
        const [row] = await readSelect<{ status: string }>(deps.db, "SELECT status FROM runs WHERE id = $1", [runId]);
        const isOver = row?.status === "completed" || row?.status === "cancelled";
        await syncRunSinks(deps, runId, sinks);
        if (isOver) {
          await sinks.wandb?.finish();
          return;
        }
      } catch (e) {
        deps.log?.warn({ runId, err: (e as Error).message }, "metric sink: will retry");
      }
      if (isStopping) return;
      await sleep(intervalMs, signal);
    }
  } finally {
    sinks?.close();
    await lock.release();
  }
}
