import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { stringify } from "yaml";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq, waitFor } from "../helpers/processes.ts";
import { fakeStats } from "../fakes/fake-engine-control.ts";
import { asRole } from "../helpers/services.ts";
import { CONFIG_VERSION } from "../../src/config/config-versions.ts";

/** The rlq command as a user drives it: start, amend, pause, cancel, sql, export, db url. */
describe("the rlq CLI", () => {
  let w: World;
  let configFile: string;
  beforeAll(async () => {
    w = await createWorld("cli", { engineArgs: ["--token-delay-ms", "2"] });
    configFile = join(w.home, "run.yaml");
    writeFileSync(configFile, stringify(w.baseConfig({ num_rollout: 2 })));
  });
  afterAll(async () => {
    await w?.close();
  });
  const rlq = async (args: string[]) => {
    const p = spawnRlq(args, w.env);
    const code = await p.exited;
    return { code, out: p.output().replace(/^npm warn.*\n/gm, "") };
  };
  const runRow = async (id: string) => (await w.db.pool.query("SELECT status, step, config FROM runs WHERE id = $1", [id])).rows[0];

  it("run start prints the id; amend extends num_rollout (and refuses keys it cannot change); sql and export read the run", async () => {
    const start = await rlq(["run", "start", "--config", configFile, "--set", "rollout_batch_size=2", "--name", "cli-run"]);
    expect(start.code, start.out).toBe(0);
    const runId = start.out.trim().split("\n").pop() as string;
    expect(runId).toMatch(/^r[0-9a-z]+$/);
    expect((await runRow(runId)).config.rollout_batch_size).toBe(2);

    const amend = await rlq(["run", "amend", runId, "--set", "num_rollout=4"]);
    expect(amend.code, amend.out).toBe(0);
    // Refused before it is recorded (config/amend.ts, the check the controller applies too).
    const bad = await rlq(["run", "amend", runId, "--set", "lr=0.5"]);
    expect(bad.code).toBe(2);
    expect(bad.out).toMatch(/keys lr cannot be amended on a live run/);
    // A key under its name before config version 2: refused with its new name.
    const renamed = await rlq(["run", "amend", runId, "--set", "max_attempts=5"]);
    expect(renamed.code).toBe(2);
    expect(renamed.out).toMatch(/keys max_attempts cannot be amended .*'max_attempts' renamed to 'train_max_attempts' \(config version 2\)/);
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    expect(await runRow(runId)).toMatchObject({ status: "completed", step: 4 });
    const reqs = (await w.db.pool.query("SELECT kind, payload, error FROM run_requests WHERE run_id = $1 ORDER BY id", [runId])).rows;
    expect(reqs).toHaveLength(1);
    expect(reqs[0]).toMatchObject({ kind: "amend", error: null });
    const amended = (await w.db.pool.query("SELECT payload FROM decisions WHERE run_id = $1 AND kind = 'run.amended'", [runId])).rows;
    expect(amended).toEqual([{ payload: { changes: { num_rollout: 4, config_version: CONFIG_VERSION } } }]);

    const sql = await rlq([
      "sql",
      `SELECT trained_step, count(*)::int AS n FROM rollout_history WHERE run_id = '${runId}' AND trained_step IS NOT NULL GROUP BY 1 ORDER BY 1`,
      "--json",
    ]);
    expect(sql.code, sql.out).toBe(0);
    expect(JSON.parse(sql.out.trim())).toEqual([0, 1, 2, 3].map((s) => ({ trained_step: s, n: 8 })));
    const write = await rlq(["sql", "DELETE FROM runs"]);
    expect(write.code).toBe(1);
    expect(write.out).toMatch(/read-only queries only.*got DELETE/);

    const exp = await rlq(["export", runId, "--format", "jsonl"]);
    expect(exp.code).toBe(0);
    const lines = exp.out
      .trim()
      .split("\n")
      .filter((l) => l.startsWith("{"));
    const total = (await w.db.pool.query("SELECT count(*)::int AS n FROM rollout_history WHERE run_id = $1", [runId])).rows[0].n;
    expect(lines).toHaveLength(total);
    expect(JSON.parse(lines[0] as string)).toMatchObject({ run_id: runId });

    // The reader's URL unless asked for another (issue 22).
    const url = await rlq(["db", "url"]);
    expect(url.out.trim()).toBe(asRole(w.env.DATABASE_URL as string, "rlq_reader"));
    const runtimeUrl = await rlq(["db", "url", "--role", "runtime"]);
    expect(runtimeUrl.out.trim()).toBe(w.env.DATABASE_URL);
  });

  it("a run whose engines serve another run's weights pauses with a clear reason instead of waiting", async () => {
    // The first test left the shared engine at version 4; this run starts at 0 with no ref_load.
    const start = await rlq(["run", "start", "--config", configFile]);
    const runId = start.out.trim().split("\n").pop() as string;
    const up = spawnRlq(["up", "--run", runId], w.env);
    const paused = await waitFor("the run to pause", async () => {
      const r = (await w.db.pool.query("SELECT status, last_error FROM runs WHERE id = $1", [runId])).rows[0];
      return r.status === "paused" ? r : null;
    });
    up.kill("SIGTERM");
    await up.exited;
    expect(paused.last_error).toMatch(/the engines serve weight version 4 .*no ref_load/);
  });

  it("trainer_push: a run whose engines serve another run's weights loads its base (ref_load) into them from disk, since no push will bring version 0", async () => {
    // The shared engine is still at version 4. Before any step nothing will push version 0, so the
    // controller loads ref_load itself (controller/engine-admin.ts restoreVersion) and generates on it.
    expect((await fakeStats(w.engine.url)).weightVersion).toBe(4);
    const start = await rlq(["run", "start", "--config", configFile, "--set", "weight_sync=trainer_push", "--set", "ref_load=/base-model"]);
    expect(start.code, start.out).toBe(0);
    const runId = start.out.trim().split("\n").pop() as string;
    const up = spawnRlq(["up", "--run", runId], w.env);
    try {
      await waitFor("segments generated by the run", async () => {
        const r = await w.db.pool.query("SELECT count(*)::int AS n FROM sample_segments WHERE run_id = $1", [runId]);
        if (up.child.exitCode !== null) throw new Error(`rlq up exited (${up.child.exitCode}):\n${up.output()}`);
        return r.rows[0].n > 0;
      });
    } finally {
      up.kill("SIGTERM");
      await up.exited;
    }
    const versions = await w.db.pool.query("SELECT DISTINCT weight_version AS v FROM sample_segments WHERE run_id = $1", [runId]);
    expect(versions.rows).toEqual([{ v: 0 }]);
    const stats = await fakeStats(w.engine.url);
    expect(stats.weightVersion).toBe(0);
    expect(stats.loadedPaths.at(-1)).toMatch(/base-model$/);
  });

  it("pause stops the run deciding, resume continues it, cancel ends it", async () => {
    const engine = await w.freshEngine();
    const start = await rlq(["run", "start", "--config", configFile, "--set", "num_rollout=50", "--set", `engine={kind: sglang, urls: ['${engine}']}`]);
    const runId = start.out.trim().split("\n").pop() as string;
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    await waitFor("a committed step", async () => (await runRow(runId)).step >= 1);
    expect((await rlq(["run", "pause", runId])).code).toBe(0);
    await waitFor("the run to pause", async () => (await runRow(runId)).status === "paused");
    const seq = async () => (await w.db.pool.query("SELECT max(seq)::int AS s FROM decisions WHERE run_id = $1", [runId])).rows[0].s as number;
    const pausedAt = await seq();
    // A second pause, handled while paused, shows the controller went round its loop since: still nothing decided.
    expect((await rlq(["run", "pause", runId])).code).toBe(0);
    await waitFor("the second pause handled", async () => {
      const r = await w.db.pool.query("SELECT handled_seq FROM run_requests WHERE run_id = $1 ORDER BY id DESC LIMIT 1", [runId]);
      return r.rows[0]?.handled_seq !== null;
    });
    expect(await seq()).toBe(pausedAt); // nothing decided while paused
    expect((await rlq(["run", "resume", runId])).code).toBe(0);
    await waitFor("the run to move again", async () => (await seq()) > pausedAt + 1);
    expect((await rlq(["run", "cancel", runId])).code).toBe(0);
    expect(await up.exited, up.output()).toBe(0);
    const status = await rlq(["run", "status", runId]);
    expect(status.out).toMatch(/status:\s+cancelled/);
    const kinds = (
      await w.db.pool.query("SELECT payload->>'status' AS s FROM decisions WHERE run_id = $1 AND kind = 'run.status' ORDER BY seq", [runId])
    ).rows.map((r) => r.s);
    expect(kinds).toEqual(["running", "paused", "running", "cancelled"]);
  });
});
