import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { repoRoot, spawnRlq } from "../helpers/processes.ts";
import { checkRunInvariants } from "../helpers/invariants.ts";
import { startFake, type FakeServer } from "../fakes/fake-engine-control.ts";

/**
 * Whole runs against two fake SGLang servers that behave as SGLang does
 * (issue 15): both started with --api-key, rollout_temperature 0.7, responses
 * of 2048 tokens, one engine whose weight load takes 30 s (its
 * /health_generate blocks 20 s, then answers 503, meanwhile), and one prompt
 * over the servers' context length. Sync, and async with partial rollouts.
 * The runs complete; the over-long prompt's samples are failed samples with
 * their reason; no engine is marked dead by a load; segment versions hold.
 */
describe("runs on two SGLang servers as they are", () => {
  let w: World;
  const key = "sk-rlq-real-run-7f3a9c";
  const extra: FakeServer[] = [];
  let promptFile = "";
  const common = ["--api-key", key, "--stop-prob", "0", "--context-length", "2600"];
  beforeAll(async () => {
    w = await createWorld("realeng", { engineArgs: common });
    const dir = mkdtempSync(join(tmpdir(), "rlq-realeng-"));
    promptFile = join(dir, "prompts.jsonl");
    const lines = readFileSync(join(repoRoot, "test/fixtures/prompts.jsonl"), "utf8").trim().split("\n");
    // The first prompt drawn is over the context length (3000 byte tokens > 2600).
    lines[0] = JSON.stringify({ input: `Q0: ${"x".repeat(3000)} =`, label: "0", metadata: { i: 0 } });
    writeFileSync(promptFile, lines.join("\n") + "\n");
  }, 60_000);
  afterAll(async () => {
    for (const f of extra) f.kill("SIGKILL");
    await w?.close();
  });

  const q = async (sql: string, runId: string) => (await w.db.pool.query(sql, [runId])).rows;

  for (const mode of ["sync", "async"] as const) {
    it(`${mode}${mode === "async" ? " with partial rollouts" : ""}: completes; the over-long prompt fails its samples with the reason; no engine dies of a load; versions hold`, async () => {
      // Fresh engines per run (a run starting from version 0 refuses engines left on another run's
      // version). Engine A loads at once; engine B takes 30 s per load.
      const a = await startFake("sglang", common);
      const b = await startFake("sglang", [...common, "--load-delay-ms", "30000"]);
      extra.push(a, b);
      const runId = await w.start({
        prompt_data: promptFile,
        num_rollout: 2,
        rollout_batch_size: 2,
        n_samples_per_prompt: 2,
        over_sampling_batch_size: 2,
        rollout_max_response_len: 2048,
        rollout_temperature: 0.7,
        dynamic_sampling_filter_path: null,
        rollout_health_check_interval: 1,
        engine: { kind: "sglang", urls: [a.url, b.url], api_key: { env: "RLQ_TEST_ENGINE_KEY" } },
        ...(mode === "async" ? { train_async: true, partial_rollout: true, max_staleness: 1, staleness_policy: "mask" } : {}),
      });
      const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], { ...w.env, RLQ_TEST_ENGINE_KEY: key });
      expect(await up.exited, up.output().slice(-4000)).toBe(0);
      await checkRunInvariants(w.db, runId, { numRollout: 2, datasetSize: 64, shuffle: false, seed: 42, rbs: 2 });

      // The over-long prompt (draw ordinal 0): its samples failed with the server's reason.
      const failed = await q(
        "SELECT sample_index, status, finish_reason, error FROM sample_segments WHERE run_id = $1 AND group_id = 0 ORDER BY sample_index",
        runId,
      );
      expect(failed.length).toBe(2);
      for (const s of failed)
        expect(s).toMatchObject({ status: "failed", finish_reason: "error", error: expect.stringMatching(/longer than the model's context length/) });
      // Every other sample generated 2048 tokens at T = 0.7.
      const lengths = await q(
        "SELECT min(response_length)::int AS lo, max(response_length)::int AS hi FROM rollout_history WHERE run_id = $1 AND group_id <> 0",
        runId,
      );
      expect(lengths[0]).toEqual({ lo: 2048, hi: 2048 });

      // No engine was marked dead (by the 30 s load or by the bad prompt), in any process.
      expect(up.output()).not.toMatch(/engine left the rotation/);
      const deaths = await q(
        "SELECT coalesce(max((e->>'deaths')::int), 0)::int AS d, coalesce(sum((e->>'busyChecks')::int), 0)::int AS busy FROM engine_metrics m, jsonb_array_elements(m.snapshot->'engines') e WHERE m.run_id = $1",
        runId,
      );
      expect(deaths[0]?.d).toBe(0);
      // Both engines loaded every synced version; B took 30 s each time.
      const loadsB = ((await (await fetch(`${b.url}/stats`)).json()) as { loads: number }).loads;
      expect(loadsB).toBeGreaterThan(0);

      // Versions in SQL: every segment's version is what the engines served when it was generated:
      // never ahead of the run, never behind its expected version in sync mode; in async mode a
      // sample's segments never go back in version, and history's per-token versions are the segments'.
      const segs = await q(
        "SELECT group_id, sample_index, segment_index, weight_version, expected_weight_version, step, is_version_mismatch FROM sample_segments WHERE run_id = $1 AND status <> 'failed' ORDER BY group_id, sample_index, segment_index",
        runId,
      );
      expect(segs.length).toBeGreaterThan(0);
      for (const s of segs) {
        expect(s.weight_version).toBeLessThanOrEqual(2);
        if (mode === "sync") expect(s).toMatchObject({ weight_version: s.expected_weight_version, is_version_mismatch: false });
      }
      const backwards = await q(
        `SELECT a.group_id, a.sample_index FROM sample_segments a JOIN sample_segments b USING (run_id, group_id, sample_index)
         WHERE a.run_id = $1 AND b.segment_index = a.segment_index + 1 AND b.weight_version < a.weight_version`,
        runId,
      );
      expect(backwards).toEqual([]);
      const mismatch = await q(
        `SELECT h.group_id, h.sample_index FROM rollout_history h
         WHERE h.run_id = $1 AND h.trained_step IS NOT NULL AND h.response_length > 0 AND h.token_versions[1] <> (
           SELECT s.weight_version FROM sample_segments s WHERE s.run_id = h.run_id AND s.group_id = h.group_id AND s.sample_index = h.sample_index AND s.token_start = 0
           ORDER BY s.segment_index DESC LIMIT 1)`,
        runId,
      );
      expect(mismatch).toEqual([]);
      // The key reached the servers and never the runs table.
      expect(JSON.stringify(await q("SELECT config FROM runs WHERE id = $1", runId))).not.toContain(key);
      expect(JSON.stringify(await q("SELECT config FROM runs WHERE id = $1", runId))).toContain("RLQ_TEST_ENGINE_KEY");
      expect(((await (await fetch(`${b.url}/stats`)).json()) as { unauthorized: number }).unauthorized).toBe(0);
      expect(up.output()).not.toContain(key);
    }, 600_000);
  }
});
