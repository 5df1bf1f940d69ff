import { copyFileSync, writeFileSync, appendFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { repoRoot, spawnRlq, waitFor } from "../helpers/processes.ts";

/**
 * Bad input gets a clear error naming what was wrong and where, and loses
 * nothing already recorded: a bad config, bad dataset rows, a plugin that
 * throws or returns the wrong shape, a dataset changed under a live run.
 */
describe("bad input", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("badin", { engineArgs: ["--token-delay-ms", "0"] });
  });
  afterAll(async () => {
    await w?.close();
  });
  const run = async (id: string) => (await w.db.pool.query("SELECT status, last_error, step FROM runs WHERE id = $1", [id])).rows[0];

  it("a bad config names the key, the value and what was expected", async () => {
    const file = join(w.home, "bad.yaml");
    writeFileSync(
      file,
      "prompt_data: x.jsonl\nrollout_batch_size: abc\nn_samples_per_prompt: 0\nnum_rollout: 1\nrollout_max_response_len: 8\nrm_type: math\nrollout_batch_sise: 3\n",
    );
    const p = spawnRlq(["run", "start", "--config", file], w.env);
    expect(await p.exited).toBe(2);
    const out = p.output();
    expect(out).toMatch(/rollout_batch_size = "abc": .*expected number/i);
    expect(out).toMatch(/n_samples_per_prompt = 0: .*expected number to be >0/);
    expect(out).toMatch(/unknown key\(s\) 'rollout_batch_sise'/);
    const set = spawnRlq(["run", "start", "--config", file, "--set", "rollout_batch_size=2", "--set", "n_samples_per_prompt"], w.env);
    expect(await set.exited).toBe(2);
    expect(set.output()).toMatch(/--set "n_samples_per_prompt": expected key=value/);
  });

  it("bad dataset rows are reported with their line numbers and the rest stays usable", async () => {
    const runId = await w.start({
      prompt_data: join(repoRoot, "test/fixtures/bad-rows.jsonl"),
      rollout_batch_size: 2,
      n_samples_per_prompt: 2,
      over_sampling_batch_size: 2,
      num_rollout: 2,
      dynamic_sampling_filter_path: null,
    });
    const created = (await w.db.pool.query("SELECT payload FROM decisions WHERE run_id = $1 AND kind = 'run.created'", [runId])).rows[0].payload;
    // 6 lines: 2 usable, 4 bad (invalid JSON, no input, an array, metadata not an object).
    expect(created.datasetSize).toBe(2);
    expect(created.datasetErrors).toHaveLength(4);
    expect(created.datasetErrors.join("\n")).toMatch(/bad-rows\.jsonl:2: not valid JSON/);
    expect(created.datasetErrors.join("\n")).toMatch(/bad-rows\.jsonl:3: input_key 'input' must be a non-empty string/);
    expect(created.datasetErrors.join("\n")).toMatch(/bad-rows\.jsonl:4: expected a JSON object, got an array/);
    expect(created.datasetErrors.join("\n")).toMatch(/bad-rows\.jsonl:5: metadata_key 'metadata' must be an object/);
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    expect((await run(runId)).status).toBe("completed");
    // Only valid rows were drawn (2 rows, 4 draws: the epoch wrapped).
    const idx = (await w.db.pool.query("SELECT dataset_index, epoch, prompt FROM drawn_prompts WHERE run_id = $1 ORDER BY draw_ordinal", [runId])).rows;
    expect(idx).toEqual([
      { dataset_index: 0, epoch: 0, prompt: "good 1" },
      { dataset_index: 1, epoch: 0, prompt: "good 3" },
      { dataset_index: 0, epoch: 1, prompt: "good 1" },
      { dataset_index: 1, epoch: 1, prompt: "good 3" },
    ]);
  });

  for (const [plugin, message] of [
    ["reward-throws.mjs", /custom_rm_path .*reward-throws\.mjs threw on sample 0: reward server exploded/],
    ["reward-bad-shape.mjs", /custom_rm_path .*reward-bad-shape\.mjs.* returned "not a number"; expected a finite number or an object/],
  ] as const) {
    it(`a reward plugin that ${plugin.includes("throws") ? "throws" : "returns the wrong shape"} pauses the run with the reason, facts intact`, async () => {
      const runId = await w.start({ custom_rm_path: join(repoRoot, "test/fixtures", plugin), engine: { kind: "sglang", urls: [await w.freshEngine()] } });
      const up = spawnRlq(["up", "--run", runId], w.env);
      const paused = await waitFor("the run to pause", async () => {
        const r = await run(runId);
        return r.status === "paused" ? r : null;
      });
      up.kill("SIGTERM");
      await up.exited;
      expect(paused.last_error).toMatch(message);
      // What was generated before the failure is still there.
      const segs = (await w.db.pool.query("SELECT count(*)::int AS n FROM sample_segments WHERE run_id = $1", [runId])).rows[0].n;
      expect(segs).toBeGreaterThan(0);
      const status = spawnRlq(["run", "status", runId], w.env);
      expect(await status.exited).toBe(0);
      expect(status.output()).toMatch(/status:\s+paused/);
      expect(status.output()).toMatch(message);
    });
  }

  it("a dataset changed under a live run refuses resume with a clear message, and the run stays intact", async () => {
    const data = join(w.home, "prompts-copy.jsonl");
    copyFileSync(join(repoRoot, "test/fixtures/prompts.jsonl"), data);
    const runId = await w.start({ prompt_data: data, num_rollout: 2, engine: { kind: "sglang", urls: [await w.freshEngine()] } });
    appendFileSync(data, JSON.stringify({ input: "a new row", label: "x" }) + "\n");
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    await up.exited;
    const r = await run(runId);
    expect(r.last_error).toMatch(/refuses to resume: prompt_data .*prompts-copy\.jsonl changed since the run started/);
    expect(r.status).toBe("running");
    const decisions = (await w.db.pool.query("SELECT count(*)::int AS n FROM decisions WHERE run_id = $1", [runId])).rows[0].n;
    expect(decisions).toBe(2); // created + running: nothing was decided on the changed data
    copyFileSync(join(repoRoot, "test/fixtures/prompts.jsonl"), data);
    const up2 = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up2.exited, up2.output()).toBe(0);
    expect((await run(runId)).status).toBe("completed");
  });
});
