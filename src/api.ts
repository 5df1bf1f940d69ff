import { refuseTiedReload } from "./engines/openai-compat.ts";
import { redactDeep } from "./lib/redact.ts";
import { checkConfig } from "./config/config-check.ts";
import { randomBytes } from "node:crypto";
import { dirname, isAbsolute, resolve } from "node:path";
import type { Db } from "./store/db.ts";
import { insertRun, loadRunRow } from "./store/run-facts.ts";
import { pipelineReport, type PipelineReport } from "./store/pipeline.ts";
import { listTrainSteps } from "./store/train-facts.ts";
import { loadEvalResults } from "./store/eval-facts.ts";
import { loadEngineMetrics } from "./store/engine-metrics.ts";
import type { EngineMetricsSnapshot } from "./engines/metrics.ts";
import { insertRunRequest, type RunRequestKind } from "./store/run-requests.ts";
import { applyOverrides, readConfigFile } from "./config/load.ts";
import { parseRunConfig, type RunConfig } from "./config/run-config.ts";
import { upgradeRecordedConfig, withConfigVersion } from "./config/config-versions.ts";
import { checkAmend } from "./config/amend.ts";
import { normalizeSlimeForms } from "./config/slime-traps.ts";
import { createByteTokenizer } from "./data/tokenizer.ts";
import { loadRunDataset, tokenizerFor } from "./runtime/plugins-registry.ts";
import { fingerprintPlugins, pluginKeys } from "./controller/fingerprints.ts";
import { refuseIncompatibleSource } from "./controller/recorded-collect.ts";
import type { Queues } from "./queue/queues.ts";
import type { QueueWatchReport } from "./queue/queue-watch.ts";
import { jobIds } from "./queue/payloads.ts";
import { RlqError } from "./lib/errors.ts";

/** Relative paths in a config file are relative to the file, not to the shell's directory. */
function resolvePaths(raw: Record<string, unknown>, baseDir: string): Record<string, unknown> {
  const out = { ...raw };
  const fix = (key: string) => {
    const v = out[key];
    // py:relative/file.py:fn (a Python plugin file) is relative to the config file too.
    if (typeof v === "string" && /^py:.*\.py:\w+$/.test(v) && !isAbsolute(v.slice(3))) {
      out[key] = `py:${resolve(baseDir, v.slice(3))}`;
      return;
    }
    if (typeof v === "string" && v.length > 0 && !isAbsolute(v) && !/^https?:\/\//i.test(v) && (v.startsWith(".") || v.includes("/")))
      out[key] = resolve(baseDir, v);
  };
  for (const key of ["prompt_data", "ref_load", ...pluginKeys]) fix(key);
  const evals = out.eval_prompt_data;
  if (evals !== null && typeof evals === "object" && !Array.isArray(evals)) {
    out.eval_prompt_data = Object.fromEntries(
      Object.entries(evals as Record<string, unknown>).map(([k, v]) => {
        const rel = (p: unknown) => (typeof p === "string" && !isAbsolute(p) ? resolve(baseDir, p) : p);
        // A dataset with overrides ({path, ...}: config/eval-datasets.ts) has its path resolved the same way.
        if (v !== null && typeof v === "object" && !Array.isArray(v)) return [k, { ...v, path: rel((v as { path?: unknown }).path) }];
        return [k, rel(v)];
      }),
    );
  }
  return out;
}

export function newRunId(): string {
  return `r${Date.now().toString(36)}${randomBytes(3).toString("hex")}`;
}

export interface StartRunOptions {
  /** A config file path, or an already-built config object. */
  config: string | Record<string, unknown>;
  set?: readonly string[];
  name?: string;
  /** Base directory for relative paths when `config` is an object. */
  baseDir?: string;
}

/** Validate a config, fingerprint its dataset and plugins, and record the run. Returns the run id. */
export async function startRun(
  db: Db,
  options: StartRunOptions,
): Promise<{ runId: string; config: RunConfig; datasetErrors: string[]; configWarnings: string[] }> {
  const raw = typeof options.config === "string" ? await readConfigFile(options.config) : options.config;
  const baseDir = typeof options.config === "string" ? dirname(resolve(options.config)) : (options.baseDir ?? process.cwd());
  const source = typeof options.config === "string" ? options.config : "config";
  const written = resolvePaths(normalizeSlimeForms(applyOverrides(raw, options.set ?? [])) as Record<string, unknown>, baseDir);
  const config = parseRunConfig(written, source, "user");
  // What `rlq config check` warns of (keys that change nothing, slime defaults rlq does not share),
  // said at start too, so that no difference from slime passes in silence.
  const configWarnings = checkConfig(written, config).map((w) => w.message);
  if (config.engine.kind === "openai" && config.weight_sync === "disk") await refuseTiedReload(config.hf_checkpoint ?? config.ref_load, source);
  const tokenizer = config.tokenizer === "bytes" ? createByteTokenizer() : await tokenizerFor(config);
  const { dataset, report } = await loadRunDataset(config, tokenizer);
  if (report) dataset.errors.push(`rollout_max_prompt_len ${report.maxPromptLen}: dropped ${report.filtered} longer prompt(s)`);
  await refuseIncompatibleSource(db, config, dataset.fingerprint);
  const pluginFingerprints = await fingerprintPlugins(config);
  const runId = newRunId();
  await insertRun(db, {
    runId,
    name: options.name ?? runId,
    config: withConfigVersion(config),
    datasetFingerprint: dataset.fingerprint,
    datasetSize: dataset.rows.length,
    datasetErrors: dataset.errors,
    pluginFingerprints,
  });
  return { runId, config, datasetErrors: dataset.errors, configWarnings };
}

function latestEvals(rows: Awaited<ReturnType<typeof loadEvalResults>>): RunStatusReport["evals"] {
  const seen = new Set<string>();
  const out: RunStatusReport["evals"] = [];
  for (const r of rows) {
    if (seen.has(r.dataset)) continue;
    seen.add(r.dataset);
    out.push({ dataset: r.dataset, step: r.step, weightVersion: r.weightVersion, meanReward: r.meanReward, passAtK: r.passAtK as Record<string, number> });
  }
  return out;
}

export interface RunStatusReport {
  runId: string;
  name: string;
  status: string;
  step: number;
  numRollout: number | null;
  weightVersion: number;
  /** frozen: weight_sync none, the engines keep version 0 for the whole run; synced: they load each trained version. */
  engineWeights: "synced" | "frozen";
  lastError: string | null;
  trainSteps: number;
  lastMetrics: Record<string, number>;
  queues: Record<string, Record<string, number>> | null;
  /**
   * The job of the next step to commit, when queues were given and it exists:
   * its state, attempts used, and last progress (e.g. "waiting for the
   * trainer: unreachable for 42 s").
   */
  trainJob: { step: number; state: string; attemptsMade: number; phase: string | null } | null;
  /**
   * When queues were given: queues paused now, and what the queue watch saw since the run was
   * created (a pause it resumed, an emptied queue, this run's jobs it added back; queue/queue-watch.ts).
   */
  queueWatch: QueueWatchReport | null;
  /** Latest eval per dataset: step, weight version, mean reward, pass@k. */
  evals: Array<{ dataset: string; step: number; weightVersion: number; meanReward: number; passAtK: Record<string, number> }>;
  /** Engine-pool metrics as last published by each rollout worker process. */
  engines: Array<{
    worker: string;
    at: string;
    engineId: string;
    state: string;
    weightVersion: number | null;
    requests: number;
    errors: number;
    aborted: number;
    tokensPerSecond: number;
    latencyMs: { p50: number | null; p95: number | null; p99: number | null };
    deaths: number;
    requestErrors: number;
    busyChecks: number;
    seedHonoured: boolean | null;
  }>;
  /** The pipeline: groups in flight per version, staleness of trained samples, trainer busy fraction. */
  pipeline: PipelineReport;
  updatedAt: string;
}

/** A run's status for people: every string passes through lib/redact (no secret in status output). */
export async function runStatus(db: Db, runId: string, queues?: Queues): Promise<RunStatusReport> {
  return redactDeep(await buildRunStatus(db, runId, queues));
}

async function buildRunStatus(db: Db, runId: string, queues?: Queues): Promise<RunStatusReport> {
  const row = await loadRunRow(db, runId);
  if (!row) throw new RlqError("run_not_found", `run ${runId} does not exist`);
  const config = row.config as { num_rollout?: number | null; weight_sync?: string };
  const steps = await listTrainSteps(db, runId);
  const { rows } = await db.pool.query<{ key: string; value: number }>(
    "SELECT key, value FROM train_metrics WHERE run_id = $1 AND step = (SELECT max(step) FROM train_steps WHERE run_id = $1)",
    [runId],
  );
  return {
    runId,
    name: row.name,
    status: row.status,
    step: row.step,
    numRollout: config.num_rollout ?? null,
    weightVersion: row.weightVersion,
    engineWeights: config.weight_sync === "none" ? "frozen" : "synced",
    lastError: row.lastError,
    trainSteps: steps.length,
    lastMetrics: Object.fromEntries(rows.map((r) => [r.key, r.value])),
    queues: queues ? await queues.depths() : null,
    trainJob: queues ? await trainJobReport(queues, runId, steps.length) : null,
    queueWatch: queues ? await queues.watch.report({ runId, since: row.createdAt }) : null,
    evals: latestEvals(await loadEvalResults(db, runId)),
    engines: (await loadEngineMetrics(db, runId)).flatMap((m) =>
      ((m.snapshot as { engines?: EngineMetricsSnapshot[] }).engines ?? []).map((e) => ({
        worker: m.worker,
        at: m.at.toISOString(),
        engineId: e.engineId,
        state: e.state,
        weightVersion: e.weightVersion,
        requests: e.requests,
        errors: e.errors,
        aborted: e.aborted,
        tokensPerSecond: e.tokensPerSecond,
        latencyMs: e.latencyMs,
        deaths: e.deaths ?? 0,
        // Snapshots written before these existed lack them.
        requestErrors: e.requestErrors ?? 0,
        busyChecks: e.busyChecks ?? 0,
        seedHonoured: e.seedHonoured ?? null,
      })),
    ),
    pipeline: await pipelineReport(db, runId),
    updatedAt: row.updatedAt.toISOString(),
  };
}

async function trainJobReport(queues: Queues, runId: string, step: number): Promise<RunStatusReport["trainJob"]> {
  const info = await queues.info("train", jobIds.train({ runId, step }));
  if (info.state === "missing") return null;
  const phase = (info.progress as { phase?: unknown } | null)?.phase;
  return { step, state: info.state, attemptsMade: info.attemptsMade, phase: typeof phase === "string" ? phase : null };
}

/**
 * Ask the run's controller to pause, resume, cancel or amend (it records the decision). An amend's
 * payload is the changed keys (`{num_rollout: 10}`) or, as the CLI sends it, `{changes: {...}}`; it
 * is checked (config/amend.ts) before it is recorded, so a key that cannot be amended or a bad
 * value throws ConfigError here. Returns the request's id: `changeOutcome` / `waitForChange`
 * (run-watch.ts) read whether the controller applied or refused it.
 */
export async function requestRunChange(db: Db, runId: string, kind: RunRequestKind, payload: Record<string, unknown> = {}): Promise<number> {
  const row = await loadRunRow(db, runId);
  if (!row) throw new RlqError("run_not_found", `run ${runId} does not exist`);
  const isWrapped = Object.keys(payload).length === 1 && typeof payload.changes === "object" && payload.changes !== null;
  if (kind !== "amend") return insertRunRequest(db, runId, kind, payload);
  const changes = (isWrapped ? payload.changes : payload) as Record<string, unknown>;
  checkAmend(changes, upgradeRecordedConfig(row.config, `run ${runId}'s config`), `amend of run ${runId}`);
  return insertRunRequest(db, runId, kind, { changes });
}
