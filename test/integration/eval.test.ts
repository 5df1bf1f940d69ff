import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { repoRoot, spawnRlq } from "../helpers/processes.ts";

/**
 * Eval (slime's eval_interval, eval_prompt_data, n_samples_per_eval_prompt):
 * at step boundaries the eval datasets are generated at one pinned weight
 * version, scored, and stored with mean reward and pass@k per dataset.
 */
describe("evaluation", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("eval", { engineArgs: ["--token-delay-ms", "0"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("evaluates before training, every eval_interval steps and at the end, at the synced version", async () => {
    const runId = await w.start({
      num_rollout: 3,
      eval_interval: 2,
      eval_prompt_data: { small: join(repoRoot, "test/fixtures/eval.jsonl"), again: join(repoRoot, "test/fixtures/eval.jsonl") },
      n_samples_per_eval_prompt: 4,
      eval_pass_k: [1, 4],
      eval_max_response_len: 12,
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    const rows = (
      await w.db.pool.query(
        "SELECT step, dataset, weight_version, num_prompts, num_samples, mean_reward, pass_at_k FROM eval_results WHERE run_id = $1 ORDER BY step, dataset",
        [runId],
      )
    ).rows;
    expect(rows.map((r) => [r.step, r.dataset, r.weight_version])).toEqual([
      [0, "again", 0],
      [0, "small", 0],
      [2, "again", 2],
      [2, "small", 2],
      [3, "again", 3],
      [3, "small", 3],
    ]);
    for (const r of rows) {
      expect(r.num_prompts).toBe(8);
      expect(r.num_samples).toBe(32);
      // pass@k is the unbiased estimator over the stored samples: recompute it from eval_samples.
      const samples = (
        await w.db.pool.query(
          "SELECT prompt_index, reward, weight_version, array_length(tokens, 1) AS n FROM eval_samples WHERE run_id = $1 AND step = $2 AND dataset = $3",
          [runId, r.step, r.dataset],
        )
      ).rows;
      expect(samples).toHaveLength(32);
      for (const s of samples) expect(s.weight_version).toBe(r.weight_version);
      const byPrompt = new Map<number, number[]>();
      for (const s of samples) byPrompt.set(s.prompt_index, [...(byPrompt.get(s.prompt_index) ?? []), s.reward]);
      const pass1 = [...byPrompt.values()].reduce((a, rs) => a + rs.filter((x) => x >= 1).length / 4, 0) / 8;
      const pass4 = [...byPrompt.values()].reduce((a, rs) => a + (rs.some((x) => x >= 1) ? 1 : 0), 0) / 8;
      expect(r.pass_at_k["1"]).toBeCloseTo(pass1, 12);
      expect(r.pass_at_k["4"]).toBeCloseTo(pass4, 12);
      expect(r.mean_reward).toBeCloseTo(samples.reduce((a, s) => a + s.reward, 0) / 32, 12);
    }
    const status = spawnRlq(["run", "status", runId], w.env);
    expect(await status.exited).toBe(0);
    expect(status.output()).toMatch(/eval small: step 3 \(version 3\) mean reward [0-9.]+ pass@1 [0-9.]+ pass@4 [0-9.]+/);
    const replay = spawnRlq(["replay", runId, "--check"], w.env);
    expect(await replay.exited, replay.output()).toBe(0);
  });
});
