import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq } from "../helpers/processes.ts";

/**
 * Partial rollouts (slime's --partial-rollout): groups still generating when
 * a step is sealed are aborted by request id; their tokens so far go back to
 * the buffer as segments with their versions and resume next step from those
 * tokens with the remaining budget. Off: they are recorded as discarded.
 */
describe("partial rollouts", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("partial", { engineArgs: ["--token-delay-ms", "15", "--stop-prob", "0.04"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  const config = {
    num_rollout: 3,
    rollout_batch_size: 2,
    n_samples_per_prompt: 2,
    over_sampling_batch_size: 6,
    rollout_max_response_len: 48,
    dynamic_sampling_filter_path: null,
  };

  it("buffers aborted groups with their tokens and resumes them with the remaining budget", async () => {
    const runId = await w.start({ ...config, partial_rollout: true, mask_offpolicy_in_partial_rollout: true });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    const q = async (sql: string) => (await w.db.pool.query(sql, [runId])).rows;

    // Some requests were cut mid-generation and kept their tokens.
    const aborted = await q("SELECT group_id, sample_index, token_end FROM sample_segments WHERE run_id = $1 AND finish_reason = 'abort' AND token_end > 0");
    expect(aborted.length).toBeGreaterThan(0);
    const buffered = await q(
      "SELECT DISTINCT group_id FROM decisions WHERE run_id = $1 AND kind = 'group.outcome' AND payload->>'outcome' = 'buffered' AND payload->>'reason' = 'aborted'",
    );
    expect(buffered.length).toBeGreaterThan(0);

    // The train job goes out with the seal, before the aborted rounds land (the drain overlaps the
    // batch build); the weights sync only once every aborted round of the step has landed.
    const order = await q(
      "SELECT seq, kind, coalesce(step, (payload->>'step')::int) AS step, payload->>'reason' AS reason FROM decisions WHERE run_id = $1 AND kind IN ('step.sealed', 'train.dispatched', 'group.outcome', 'weights.synced') ORDER BY seq",
    );
    const drainedSteps = new Set(order.filter((d) => d.kind === "group.outcome" && d.reason === "aborted").map((d) => d.step as number));
    expect(drainedSteps.size).toBeGreaterThan(0);
    for (const step of drainedSteps) {
      const ofStep = order.filter((d) => d.step === step);
      const seqOf = (kind: string) => ofStep.find((d) => d.kind === kind)?.seq as number;
      const drainSeqs = ofStep.filter((d) => d.kind === "group.outcome" && d.reason === "aborted").map((d) => d.seq as number);
      expect(seqOf("train.dispatched")).toBe(seqOf("step.sealed") + 1);
      expect(seqOf("train.dispatched")).toBeLessThan(Math.min(...drainSeqs));
      if (seqOf("weights.synced") !== undefined) expect(seqOf("weights.synced")).toBeGreaterThan(Math.max(...drainSeqs));
    }

    // A buffered group is served first next step (from the buffer), in a new round.
    const drawn = await q("SELECT step, payload FROM decisions WHERE run_id = $1 AND kind = 'prompts.drawn' ORDER BY seq");
    const fromBuffer = drawn.flatMap((d) => (d.payload.fromBuffer as number[]).map((g) => ({ g, step: d.step })));
    expect(fromBuffer.length).toBeGreaterThan(0);

    // Resumed segments continue exactly where the aborted ones stopped, within the remaining budget.
    const resumed = await q(`
      SELECT s.group_id, s.sample_index, s.segment_index, s.token_start, s.token_end, s.finish_reason, p.token_end AS prev_end
      FROM sample_segments s JOIN sample_segments p
        ON p.run_id = s.run_id AND p.group_id = s.group_id AND p.sample_index = s.sample_index AND p.segment_index = s.segment_index - 1
      WHERE s.run_id = $1`);
    expect(resumed.length).toBeGreaterThan(0);
    for (const r of resumed) {
      expect(r.token_start).toBe(r.prev_end);
      expect(r.token_end).toBeLessThanOrEqual(48);
      if (r.finish_reason === "length") expect(r.token_end).toBe(48); // the budget was the remaining one
    }

    // mask_offpolicy_in_partial_rollout: tokens generated before the kept round have loss mask 0.
    const trainedResumed = await q(`
      SELECT h.group_id, h.sample_index, h.loss_mask, h.token_versions,
        (SELECT coalesce(sum(token_end - token_start), 0)::int FROM sample_segments s
          WHERE s.run_id = h.run_id AND s.group_id = h.group_id AND s.sample_index = h.sample_index
            AND s.round < (SELECT max((payload->>'round')::int) FROM decisions d WHERE d.run_id = h.run_id AND d.group_id = h.group_id AND d.kind = 'group.filtered')) AS old_tokens
      FROM rollout_history h WHERE h.run_id = $1 AND h.kept`);
    const withOld = trainedResumed.filter((r) => r.old_tokens > 0);
    expect(withOld.length).toBeGreaterThan(0);
    for (const r of withOld) {
      expect(r.loss_mask.slice(0, r.old_tokens).every((m: number) => m === 0)).toBe(true);
    }
    const replay = spawnRlq(["replay", runId, "--check"], w.env);
    expect(await replay.exited, replay.output()).toBe(0);
  });

  it("with partial_rollout off, aborted groups are discarded and their prompts recorded as discarded", async () => {
    // Groups must still be generating at the seal. A group's batch /generate (issue 15's default)
    // answers when its last sample ends, so what matters is the spread of sample lengths: with
    // stop-prob 0.1 most samples stop within ~10 tokens (the first groups complete and seal the
    // step) while some run towards the 48-token cap (30 ms a token), and those are aborted.
    const engine = await w.freshEngine(["--token-delay-ms", "30", "--stop-prob", "0.1"]);
    const runId = await w.start({ ...config, partial_rollout: false, engine: { kind: "sglang", urls: [engine] } });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    const rows = (
      await w.db.pool.query("SELECT outcome, outcome_reason, count(*)::int AS n FROM prompt_draws WHERE run_id = $1 GROUP BY 1, 2 ORDER BY 1, 2", [runId])
    ).rows;

    const discarded = rows.find((r) => r.outcome === "discarded" && r.outcome_reason === "aborted");
    expect(discarded?.n ?? 0).toBeGreaterThan(0);
    expect(rows.find((r) => r.outcome === "buffered")).toBeUndefined();
    expect(rows.find((r) => r.outcome === "trained")?.n).toBe(6);
    // Nothing drawn is unaccounted for: every prompt has an outcome.
    expect(rows.find((r) => r.outcome === "pending")).toBeUndefined();
  });
});
