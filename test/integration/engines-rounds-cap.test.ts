import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq } from "../helpers/processes.ts";
import { waitFor } from "../helpers/processes.ts";
import { MAX_ROUNDS_PER_GROUP } from "../../src/jobs/generate-group-round.ts";

/**
 * Issue 15, point 6: a sample the server keeps aborting is not resubmitted
 * forever. Here the fake SGLang aborts every request after one token (fault
 * abort_mid), as a server under pause_generation / error aborts would: each
 * round keeps its one token and the group goes round again, until round
 * MAX_ROUNDS_PER_GROUP, where each sample fails with the reason and no
 * further round is dispatched for the group.
 */
describe("the rounds cap", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("roundscap", { engineArgs: ["--stop-prob", "0", "--fault", "abort_mid", "--fault-after-tokens", "1"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  it(`a sample aborted in every round fails at round ${MAX_ROUNDS_PER_GROUP} with the reason`, async () => {
    const runId = await w.start({
      num_rollout: 1,
      rollout_batch_size: 1,
      n_samples_per_prompt: 2,
      over_sampling_batch_size: 1,
      rollout_max_response_len: 4 * MAX_ROUNDS_PER_GROUP,
      dynamic_sampling_filter_path: null,
    });
    const up = spawnRlq(["up", "--run", runId], w.env);
    try {
      const q = async (sql: string) => (await w.db.pool.query(sql, [runId])).rows;
      const failed = await waitFor(
        "a sample failed by the rounds cap",
        async () => {
          const rows = await q("SELECT group_id, sample_index, round, token_end, error FROM sample_segments WHERE run_id = $1 AND status = 'failed'");
          return rows.length > 0 ? rows : null;
        },
        240_000,
      );
      const first = failed[0] as { group_id: number; sample_index: number; round: number; token_end: number; error: string };
      expect(first.error).toMatch(new RegExp(`^aborted in ${MAX_ROUNDS_PER_GROUP} rounds \\(the most one group may take\\); last engine `));
      expect(first.round).toBe(MAX_ROUNDS_PER_GROUP - 1);
      // One token a round: the sample kept every round's token, and it failed well inside its budget.
      expect(first.token_end).toBe(MAX_ROUNDS_PER_GROUP);
      const segs = await q(
        `SELECT round, finish_reason, status, token_start, token_end FROM sample_segments WHERE run_id = $1 AND group_id = ${first.group_id} AND sample_index = ${first.sample_index} ORDER BY segment_index`,
      );
      expect(segs.map((s) => s.round)).toEqual(Array.from({ length: MAX_ROUNDS_PER_GROUP }, (_, i) => i));
      expect(segs.slice(0, -1).every((s) => s.status === "aborted" && s.finish_reason === "abort")).toBe(true);
      // The group's last round is the cap's: nothing was dispatched after it (rounds are written
      // in order, so wait for the group's marker, then check none follows).
      await waitFor(
        "the last round's marker",
        async () =>
          (await q(`SELECT 1 FROM group_rounds WHERE run_id = $1 AND group_id = ${first.group_id} AND round = ${MAX_ROUNDS_PER_GROUP - 1}`)).length > 0,
      );
      const later = await q(`SELECT round FROM group_rounds WHERE run_id = $1 AND group_id = ${first.group_id} AND round >= ${MAX_ROUNDS_PER_GROUP}`);
      expect(later).toEqual([]);
    } finally {
      up.kill("SIGTERM");
      await up.exited;
    }
  }, 300_000);
});
