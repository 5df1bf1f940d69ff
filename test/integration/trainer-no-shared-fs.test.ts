import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawnRlq, waitFor } from "../helpers/processes.ts";
import { createWorld, type World } from "../helpers/run-fixture.ts";

/**
 * `trainer: {checkpoints: fetch, api_key}`: the fake trainer (test/fakes/fake-trainer.ts, which
 * follows workers/trainer-torch/server.py + transfer.py) keeps its checkpoints in its own
 * directory, never in rlq's RLQ_HOME, and every request to it needs the bearer token. The batch
 * is fetched with the attempt's own token. rlq downloads each committed checkpoint into its
 * RLQ_HOME and verifies the sha256. (Across real network namespaces: test/cluster/.)
 */
const TOKEN_ENV = "RLQ_T16_TRAINER_TOKEN";
const token = `t16-${Math.random().toString(36).slice(2)}`;

describe("a trainer without a shared filesystem, behind a bearer token", () => {
  let w: World;
  let trainerDir: string;
  beforeAll(async () => {
    process.env[TOKEN_ENV] = token;
    trainerDir = mkdtempSync(join(tmpdir(), "rlq-t16-trainer-"));
    w = await createWorld("nosharedfs", { trainerArgs: ["--token-env", TOKEN_ENV, "--checkpoint-dir", trainerDir] });
  });
  afterAll(async () => {
    await w?.close();
    rmSync(trainerDir, { recursive: true, force: true });
  });

  it("refuses a request without the token, and the batch URL without the attempt's token", async () => {
    const res = await fetch(`${w.trainer.url}/v1/health`);
    expect(res.status).toBe(401);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe("unauthorized");
    const ok = await fetch(`${w.trainer.url}/v1/health`, { headers: { authorization: `Bearer ${token}` } });
    expect(ok.status).toBe(200);
  });

  it("trains a run: checkpoints copied to rlq's host and verified, the trainer's copy in its own directory", async () => {
    const runId = await w.start({ trainer: { kind: "remote", url: w.trainer.url, api_key: { env: TOKEN_ENV }, checkpoints: "fetch" } });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    try {
      expect(await up.exited, up.output()).toBe(0);
    } finally {
      up.kill("SIGTERM");
    }
    const rows = (await w.db.pool.query("SELECT step, checkpoint_uri, checkpoint_sha256 FROM train_steps WHERE run_id = $1 ORDER BY step", [runId])).rows;
    expect(rows.map((r) => r.step)).toEqual([0, 1, 2]);
    for (const r of rows) {
      const dir = fileURLToPath(String(r.checkpoint_uri));
      expect(dir.startsWith(w.home)).toBe(true);
      const mine = readFileSync(join(dir, "weights.safetensors"));
      expect(createHash("sha256").update(mine).digest("hex")).toBe(r.checkpoint_sha256);
      // The trainer wrote on its own disk, under its own directory, the same bytes.
      const theirs = join(trainerDir, runId, basename(dirname(dir)), basename(dir), "weights.safetensors");
      expect(existsSync(theirs)).toBe(true);
      expect(readFileSync(theirs).equals(mine)).toBe(true);
    }
    // The token never reached the database: only its reference.
    const cfg = (await w.db.pool.query("SELECT config::text AS c FROM runs WHERE id = $1", [runId])).rows[0].c as string;
    expect(cfg).toContain(TOKEN_ENV);
    expect(cfg).not.toContain(token);
  });

  it("a wrong token pauses the run with the trainer's unauthorized answer", async () => {
    process.env.RLQ_T16_WRONG = "not-the-token";
    const runId = await w.start({
      num_rollout: 1,
      engine: { kind: "sglang", urls: [await w.freshEngine()] },
      trainer: { kind: "remote", url: w.trainer.url, api_key: { env: "RLQ_T16_WRONG" }, checkpoints: "fetch" },
    });
    const up = spawnRlq(["up", "--run", runId], { ...w.env, RLQ_T16_WRONG: "not-the-token" });
    try {
      const reason = await waitFor("the run to pause", async () => {
        const r = (await w.db.pool.query("SELECT status, last_error FROM runs WHERE id = $1", [runId])).rows[0];
        return r?.status === "paused" ? String(r.last_error) : null;
      });
      expect(reason).toMatch(/unauthorized/);
    } finally {
      up.kill("SIGTERM");
      await up.exited;
    }
  });
});
