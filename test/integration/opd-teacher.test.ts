import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq, waitFor } from "../helpers/processes.ts";
import { checkRunInvariants } from "../helpers/invariants.ts";
import { fakeStats, restartFake, startFake, type FakeServer } from "../fakes/fake-engine-control.ts";
import { inputTokenLogProb } from "../fakes/fake-lm.ts";
import { insertRunRequest } from "../../src/store/run-requests.ts";
import { loadTrainBatch } from "../../src/jobs/train-batch.ts";
import { encodeBatch } from "../../src/trainer/batch-codec.ts";
import { loadRunRow } from "../../src/store/run-facts.ts";
import { decodeRecordedConfig } from "../../src/config/recorded-config.ts";
import type { RunContext } from "../../src/runtime/run-context.ts";

/**
 * On-policy distillation with the teacher as an engine of its own: a second fake SGLang process
 * answers the reward jobs' prefill requests (/generate, max_new_tokens 0, return_logprob,
 * logprob_start_len 0: slime/rollout/on_policy_distillation.py). The teacher's per-token log-probs
 * land in sample_rewards and rollout_history beside the student's, equal to the teacher model's own
 * (fake-lm.ts computed here, independently), and travel in every train batch. The teacher is
 * SIGKILLed mid-run: its samples wait (no sample fails or is dropped for it) until it is back, and
 * the run completes with every trained sample carrying its teacher's log-probs, exactly as a
 * deterministic run whose teacher never died (the same samples, teacher log-probs and train batches).
 */
describe("on-policy distillation: a teacher engine, killed mid-run", () => {
  let w: World;
  const teachers: FakeServer[] = [];
  beforeAll(async () => {
    w = await createWorld("opd", { engineArgs: ["--token-delay-ms", "4", "--stop-prob", "0.05"], trainerArgs: ["--step-ms", "50"] });
    teachers.push(await startFake("sglang", ["--stop-prob", "0.05"]));
  });
  afterAll(async () => {
    for (const t of teachers) t.kill("SIGKILL");
    await w?.close();
  });

  it("stores the teacher's log-probs per token, waits out its death, and trains on them", async () => {
    const teacher = teachers[0] as FakeServer;
    const numRollout = 4;
    const config = {
      deterministic: true,
      num_rollout: numRollout,
      use_opd: true,
      opd_type: "sglang",
      opd_kl_coef: 1,
      opd_teacher: { kind: "sglang", url: teacher.url, request_timeout_s: 10, wait_s: 600 },
    };
    const runId = await w.start(config);
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    // Kill the teacher once it has scored samples of this run and before the run ends: pause the run
    // first (in-flight jobs go on, nothing new is dispatched) so the kill lands mid-run on any machine.
    await waitFor("teacher scoring", async () => (await fakeStats(teacher.url)).generate >= 8, 120_000, 20);
    await insertRunRequest(w.db, runId, "pause");
    teacher.kill("SIGKILL");
    await insertRunRequest(w.db, runId, "resume");
    // A sample waits for its teacher: the reward job retries it (logged), and nothing is scored meanwhile.
    await waitFor("a sample waiting for its teacher", () => /OPD teacher failed; the sample waits for it/.test(up.output()), 120_000);
    const before = (await w.db.pool.query("SELECT count(*)::int AS n FROM train_steps WHERE run_id = $1", [runId])).rows[0]?.n as number;
    expect(before).toBeLessThan(numRollout);
    teachers.push(await restartFake("sglang", teacher.port, ["--stop-prob", "0.05"]));

    expect(await up.exited, up.output()).toBe(0);
    await checkRunInvariants(w.db, runId, { numRollout, datasetSize: 64, shuffle: false, seed: 42, rbs: 4 });

    // Every score carries the teacher's log-probs, one per response token, and they are the teacher
    // model's: log softmax at T = 1 of each response token given the token before it (version 0).
    const rows = (
      await w.db.pool.query<{
        tokens: number[];
        prompt_length: number;
        response_length: number;
        teacher_log_probs: number[] | null;
        trained_step: number | null;
        reward: number | null;
      }>("SELECT tokens, prompt_length, response_length, teacher_log_probs, trained_step, reward FROM rollout_history WHERE run_id = $1", [runId])
    ).rows;
    const trained = rows.filter((r) => r.trained_step !== null);
    expect(trained.length).toBe(numRollout * 4 * 4);
    // Rows never scored (groups aborted at a seal: reward null) have no teacher log-probs either.
    for (const r of rows.filter((x) => x.reward === null)) expect(r.teacher_log_probs).toBeNull();
    for (const r of rows.filter((x) => x.reward !== null)) {
      expect(r.teacher_log_probs?.length).toBe(r.response_length);
      const want = Array.from({ length: r.response_length }, (_, t) => {
        const p = r.prompt_length + t;
        return Math.fround(inputTokenLogProb({ version: 0, position: p, prev: r.tokens[p - 1] as number, token: r.tokens[p] as number, stopProb: 0.05 }));
      });
      // float4 in SQL: pg prints its shortest decimal, which reads back to the same float32.
      expect(r.teacher_log_probs?.map((x) => Math.fround(x))).toEqual(want);
    }
    const missing = await w.db.pool.query("SELECT count(*)::int AS n FROM sample_rewards WHERE run_id = $1 AND teacher_log_probs IS NULL", [runId]);
    expect(missing.rows[0]?.n).toBe(0);

    // Each step's batch, as served to the trainer, is the one built afresh from SQL, teacher log-probs included.
    const ctx = { runId, config: decodeRecordedConfig((await loadRunRow(w.db, runId))?.config, `run ${runId} config`) } as RunContext;
    const digests = (await w.db.pool.query("SELECT step, value FROM train_metrics WHERE run_id = $1 AND key = 'batch_digest48' ORDER BY step", [runId])).rows;
    expect(digests.map((d) => d.step)).toEqual([0, 1, 2, 3]);
    for (const d of digests) {
      const { batch } = await loadTrainBatch(w.db, ctx, d.step as number);
      for (const s of batch.samples) expect(s.teacherLogProbs?.length).toBe(s.responseLength);
      const digest = Number.parseInt(
        createHash("sha256")
          .update(encodeBatch({ ...batch, runId: "" }))
          .digest("hex")
          .slice(0, 12),
        16,
      );
      expect(d.value, `step ${d.step}`).toBe(digest);
    }

    const replay = spawnRlq(["replay", runId, "--check"], w.env);
    expect(await replay.exited, replay.output()).toBe(0);

    // Exactly: the same run with a teacher that never died (deterministic mode, its own engine at version 0)
    // trains the same batches and records the same samples, teacher log-probs included.
    const clean = await w.start({ ...config, engine: { kind: "sglang", urls: [await w.freshEngine()] } });
    const up2 = spawnRlq(["up", "--run", clean, "--exit-when-done"], w.env);
    expect(await up2.exited, up2.output()).toBe(0);
    const history = async (id: string) =>
      (
        await w.db.pool.query(
          "SELECT group_id, sample_index, tokens, teacher_log_probs, reward, outcome, trained_step FROM rollout_history WHERE run_id = $1 ORDER BY group_id, sample_index",
          [id],
        )
      ).rows;
    const trainedDigests = async (id: string) =>
      (await w.db.pool.query("SELECT step, value FROM train_metrics WHERE run_id = $1 AND key = 'batch_digest48' ORDER BY step", [id])).rows;
    expect(await history(clean)).toEqual(await history(runId));
    expect(await trainedDigests(clean)).toEqual(digests);
  });
});
