import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq } from "../helpers/processes.ts";
import { loadTrainBatch } from "../../src/jobs/train-batch.ts";
import { createBatchStager } from "../../src/jobs/batch-stager.ts";
import { encodeBatch } from "../../src/trainer/batch-codec.ts";
import { loadRunRow } from "../../src/store/run-facts.ts";
import { decodeRecordedConfig } from "../../src/config/recorded-config.ts";
import type { RunContext } from "../../src/runtime/run-context.ts";

/**
 * The train worker reads kept groups while their step collects (jobs/batch-stager.ts, woken by
 * rlq_kept) and the train job reads only the rest after the seal. The batch must be the one a
 * train job building it afresh gets, byte for byte: the fake trainer reports the first 48 bits of
 * the sha256 of what it was served, encoded without the run id (metric batch_digest48).
 */
describe("train batch staged while the step collects", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("stager", { engineArgs: ["--token-delay-ms", "10", "--stop-prob", "0.05"], trainerArgs: ["--step-ms", "100"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  const digest48 = (bytes: Uint8Array) => Number.parseInt(createHash("sha256").update(bytes).digest("hex").slice(0, 12), 16);

  async function contextOf(runId: string): Promise<RunContext> {
    const row = await loadRunRow(w.db, runId);
    return { runId, config: decodeRecordedConfig(row?.config, "batch-stager run") } as RunContext;
  }

  // Both modes train groups resumed over several rounds (sync: buffered at a seal; async: aborted at
  // a weight sync, generation being slower than a train step), so the staged loads carry a round.
  const modes = {
    "sync, partial rollouts, masked off-policy rounds": {
      engine: ["--token-delay-ms", "10", "--stop-prob", "0.05"],
      config: { partial_rollout: true, mask_offpolicy_in_partial_rollout: true, over_sampling_batch_size: 6, rollout_max_response_len: 32 },
    },
    "async, max_staleness 1, stale tokens masked": {
      engine: ["--token-delay-ms", "20", "--stop-prob", "0.02"],
      config: { train_async: true, max_staleness: 1, staleness_policy: "mask", over_sampling_batch_size: null, rollout_max_response_len: 40 },
    },
  };
  for (const [name, mode] of Object.entries(modes)) {
    it(`${name}: each step trained on exactly the batch built afresh, most of it read before the seal`, async () => {
      const steps = 4;
      const runId = await w.start({
        ...mode.config,
        num_rollout: steps,
        dynamic_sampling_filter_path: null,
        engine: { kind: "sglang", urls: [await w.freshEngine(mode.engine)] },
      });
      const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], { ...w.env, RLQ_LOG_LEVEL: "debug" });
      expect(await up.exited, up.output()).toBe(0);

      const laterRounds = await w.db.pool.query(
        "SELECT count(*)::int AS n FROM decisions WHERE run_id = $1 AND kind = 'group.filtered' AND (payload->>'keep')::boolean AND (payload->>'round')::int > 0",
        [runId],
      );
      expect(laterRounds.rows[0].n).toBeGreaterThan(0);
      const trained = (
        await w.db.pool.query("SELECT step, value AS digest FROM train_metrics WHERE run_id = $1 AND key = 'batch_digest48' ORDER BY step", [runId])
      ).rows;
      expect(trained.map((r) => r.step)).toEqual([0, 1, 2, 3]);
      const ctx = await contextOf(runId);
      for (const r of trained) {
        const fresh = await loadTrainBatch(w.db, ctx, r.step as number);
        expect(fresh.stagedGroups).toBe(0);
        expect(r.digest, `step ${r.step}`).toBe(digest48(encodeBatch({ ...fresh.batch, runId: "" })));
      }
      // The train job reported how much of each batch was staged: after its first step, some was.
      const built = up
        .output()
        .split("\n")
        .filter((l) => l.includes("train batch built"))
        .map((l) => JSON.parse(l) as { step: number; groups: number; stagedGroups: number });
      expect(built.map((b) => b.step)).toEqual([0, 1, 2, 3]);
      expect(built[0]?.stagedGroups).toBe(0);
      expect(built.slice(1).reduce((a, b) => a + b.stagedGroups, 0)).toBeGreaterThan(0);

      // The stager's own derivation, over the whole finished run: every kept group of every step
      // is staged with the load the train job derives, and the batch is the same bytes.
      const stager = createBatchStager(w.db);
      try {
        stager.take(ctx, -1);
        await stager.settled(runId);
        for (const r of trained) {
          const staged = stager.take(ctx, r.step as number);
          const built2 = await loadTrainBatch(w.db, ctx, r.step as number, staged);
          expect(built2.stagedGroups, `step ${r.step}`).toBe(built2.groupIds.length);
          expect(digest48(encodeBatch({ ...built2.batch, runId: "" }))).toBe(r.digest);
        }
      } finally {
        stager.close();
      }
    });
  }
});
