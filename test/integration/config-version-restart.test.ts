import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { repoRoot, spawnRlq, waitFor } from "../helpers/processes.ts";
import { insertRun } from "../../src/store/run-facts.ts";
import { loadDecisions } from "../../src/store/decision-log.ts";
import { decodeRecordedConfig } from "../../src/config/recorded-config.ts";
import { CONFIG_VERSION } from "../../src/config/config-versions.ts";

/**
 * A run recorded before a config key was renamed restarts under this rlq and ends exactly as a run
 * started today does. Its config is the one scripts/record-decision-logs.ts recorded (config
 * version 1: no config_version, the train job's attempts under `max_attempts`), with this world's
 * paths and servers and deterministic mode on; it is written as that rlq wrote a new run. `rlq up`
 * is killed once mid-run and started again, so the restart folds the old log (config/config-versions.ts),
 * and the run's facts equal, row for row, those of the same run started at today's version.
 */
const tables: Record<string, { order: string; drop: string[] }> = {
  decisions: { order: "seq", drop: ["created_at", "lease_epoch", "payload"] },
  drawn_prompts: { order: "draw_ordinal", drop: [] },
  sample_segments: { order: "group_id, sample_index, segment_index", drop: ["created_at"] },
  group_rounds: { order: "group_id, round", drop: ["created_at"] },
  sample_rewards: { order: "group_id, sample_index, round", drop: ["created_at"] },
  train_steps: { order: "step", drop: ["committed_at", "attempt", "checkpoint_uri"] },
  train_metrics: { order: "step, key", drop: [] },
  rollout_history: { order: "group_id, sample_index", drop: [] },
};

async function facts(w: World, runId: string): Promise<Record<string, unknown[]>> {
  const out: Record<string, unknown[]> = {};
  for (const [t, { order, drop }] of Object.entries(tables)) {
    const rows = (await w.db.pool.query(`SELECT * FROM ${t} WHERE run_id = $1 ORDER BY ${order}`, [runId])).rows;
    out[t] = rows.map((r) => {
      for (const d of [...drop, "run_id"]) delete r[d];
      return JSON.parse(
        JSON.stringify(r)
          .replaceAll(runId, "RUN")
          .replace(/attempt-[0-9a-z-]+/g, "attempt-X")
          .replace(/"engine":"[^"]*"/g, '"engine":"E"')
          .replace(/http:\/\/127\.0\.0\.1:\d+/g, "URL"),
      );
    });
  }
  return out;
}

/** Decision payloads after run.created (whose config is recorded at another version), run id and attempt ids masked. */
async function payloads(w: World, runId: string): Promise<unknown[]> {
  const after = (await loadDecisions(w.db, runId)).slice(1).map((d) => ({ kind: d.kind, payload: d.payload }));
  return JSON.parse(
    JSON.stringify(after)
      .replaceAll(runId, "RUN")
      .replace(/attempt-[0-9a-z-]+/g, "attempt-X"),
  ) as unknown[];
}

describe("a run recorded at config version 1 (max_attempts) under this rlq", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("cfgver", { engineArgs: ["--token-delay-ms", "2"], trainerArgs: ["--step-ms", "30"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("restarts from its log and ends with the facts of the same run started today", async () => {
    const values = { deterministic: true, num_rollout: 3, partial_rollout: true, mask_offpolicy_in_partial_rollout: true };
    const today = await w.start({ ...values, train_max_attempts: 2 });
    const up = spawnRlq(["up", "--run", today, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    const [created] = await loadDecisions(w.db, today);
    if (created?.kind !== "run.created") throw new Error("run.created is not decision 0");
    expect(created.payload.config.config_version).toBe(CONFIG_VERSION);

    const fixture = JSON.parse(readFileSync(join(repoRoot, "test/fixtures/decision-logs/sync-partial.json"), "utf8")) as Array<{
      payload: { config: Record<string, unknown> };
    }>;
    const v1 = fixture[0]?.payload.config ?? {};
    expect(v1).toHaveProperty("max_attempts");
    expect(v1).not.toHaveProperty("config_version");
    // Its own engine (the first run left the shared one at version 3), slower, so that the kill
    // lands mid-run; deterministic mode makes the facts independent of the timing.
    const engineUrl = await w.freshEngine(["--token-delay-ms", "15"]);
    const oldConfig: Record<string, unknown> = {
      ...v1,
      ...values,
      max_attempts: 2,
      prompt_data: join(repoRoot, "test/fixtures/prompts.jsonl"),
      custom_rm_path: join(repoRoot, "test/fixtures/reward-parity.mjs"),
      engine: { ...(v1.engine as object), urls: [engineUrl] },
      trainer: { ...(v1.trainer as object), url: w.trainer.url },
    };
    // The same run in both shapes: what makes "the same facts" the claim.
    const decoded = decodeRecordedConfig(oldConfig, "old");
    const todays = decodeRecordedConfig(created.payload.config, "today");
    expect({ ...decoded, engine: null }).toEqual({ ...todays, engine: null });

    const old = "rold_cfg_v1";
    const p = created.payload;
    await insertRun(w.db, {
      runId: old,
      name: old,
      config: oldConfig,
      datasetFingerprint: p.datasetFingerprint,
      datasetSize: p.datasetSize,
      datasetErrors: p.datasetErrors,
      pluginFingerprints: p.pluginFingerprints,
    });
    const first = spawnRlq(["up", "--run", old], w.env);
    const trained = async () => (await w.db.pool.query("SELECT 1 FROM train_steps WHERE run_id = $1", [old])).rowCount ?? 0;
    await waitFor("the old run's first train step", async () => (await trained()) > 0, 180_000, 100);
    first.kill("SIGKILL");
    await first.exited;
    const atKill = await w.db.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM train_steps WHERE run_id = $1", [old]);
    expect(atKill.rows[0]?.n, "killed before the run's last train step").toBeLessThan(3);
    const again = spawnRlq(["up", "--run", old, "--exit-when-done"], w.env);
    expect(await again.exited, again.output()).toBe(0);

    const status = await w.db.pool.query<{ status: string; config: Record<string, unknown> }>("SELECT status, config FROM runs WHERE id = $1", [old]);
    expect(status.rows[0]?.status).toBe("completed");
    expect(status.rows[0]?.config).toHaveProperty("max_attempts", 2); // the record itself is left as it was written

    const a = await facts(w, today);
    const b = await facts(w, old);
    for (const t of Object.keys(tables)) expect(b[t], `${t} rows`).toEqual(a[t]);
    expect(a.train_steps?.length).toBe(3);
    const pa = await payloads(w, today);
    expect(await payloads(w, old)).toEqual(pa);
  }, 600_000);
});
