import { join } from "node:path";
import { existsSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { keepRestarting, repoRoot, spawnRlq, waitFor } from "../helpers/processes.ts";
import { checkRunInvariants } from "../helpers/invariants.ts";

/**
 * rollout_function_path (docs/plugins.md): the example rollout function
 * (examples/rollout-function, slime's over-sampling + dynamic filter loop)
 * plans every step. The controller is SIGKILLed at three points of step 0
 * (after a draw, after a generate's dispatch before its jobs are enqueued,
 * after the function returned but before the seal) and restarted: each
 * restart replays the function against the log, so no prompt is drawn twice
 * and no round generated twice, and the run finishes with every invariant.
 */
const ROLLOUT_FN = join(repoRoot, "examples/rollout-function/rollout.ts:rollout");

async function rows<T = Record<string, unknown>>(w: World, text: string, params: unknown[]): Promise<T[]> {
  return (await w.db.pool.query(text, params)).rows as T[];
}

describe("rollout_function_path", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("rollfn", { engineArgs: ["--token-delay-ms", "1"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("over-samples, filters and trains rollout_batch_size groups per step; a killed controller resumes without re-drawing or re-generating", async () => {
    const numRollout = 3;
    const runId = await w.start({
      rollout_function_path: ROLLOUT_FN,
      partial_rollout: true,
      num_rollout: numRollout,
      eval_interval: 2,
      eval_prompt_data: { small: join(repoRoot, "test/fixtures/eval.jsonl") },
      n_samples_per_eval_prompt: 2,
      eval_pass_k: [1, 2],
      eval_max_response_len: 12,
    });
    const points = ["rollout_fn.after_draw", "rollout_fn.after_generate", "rollout_fn.before_seal"];
    const marks = points.map((_, i) => join(w.home, `crash-${i}`));
    const crashEnv = { ...w.env, RLQ_CRASH_AT: points.map((p, i) => `${p}:once=${marks[i]}`).join(",") };
    const up = keepRestarting(() => spawnRlq(["up", "--run", runId, "--workers", "eval"], crashEnv));
    const worker = spawnRlq(["worker", "rollout", "reward", "train", "--concurrency", "8"], w.env);
    try {
      await waitFor(
        "the run to complete",
        async () => {
          up.check();
          const r = await rows<{ status: string; last_error: string | null }>(w, "SELECT status, last_error FROM runs WHERE id = $1", [runId]);
          if (r[0]?.status === "paused") throw new Error(`run paused: ${r[0].last_error}\n${up.current().output().slice(-3000)}`);
          return r[0]?.status === "completed";
        },
        200_000,
        250,
      );
    } finally {
      up.current().kill("SIGTERM");
      worker.kill("SIGTERM");
      await Promise.all([up.current().exited, worker.exited]);
    }
    expect(up.restarts()).toBe(points.length);
    for (const m of marks) expect(existsSync(m)).toBe(true);

    await checkRunInvariants(w.db, runId, { numRollout, datasetSize: 64, shuffle: false, seed: 42, rbs: 4 });

    // Every prompt drawn once, ordinals gapless; more drawn than trained (over-sampling).
    const drawn = await rows<{ n: number; d: number; hi: number }>(
      w,
      "SELECT count(*)::int AS n, count(DISTINCT draw_ordinal)::int AS d, max(draw_ordinal)::int AS hi FROM drawn_prompts WHERE run_id = $1",
      [runId],
    );
    expect(drawn[0]?.n).toBe(drawn[0]?.d);
    expect(drawn[0]?.hi).toBe((drawn[0]?.n ?? 0) - 1);
    expect(drawn[0]?.n).toBeGreaterThan(numRollout * 4);

    // Each draw call recorded once: as many prompts.drawn decisions as draw records, step by step.
    const draws = await rows<{ step: number; kind: string; n: number }>(
      w,
      "SELECT step, kind, count(*)::int AS n FROM decisions WHERE run_id = $1 AND (kind = 'prompts.drawn' OR (kind = 'rollout_fn.called' AND payload->>'op' = 'draw')) GROUP BY 1, 2 ORDER BY 1, 2",
      [runId],
    );
    for (let step = 0; step < numRollout; step++) {
      const byKind = Object.fromEntries(draws.filter((d) => d.step === step).map((d) => [d.kind, d.n]));
      expect(byKind["prompts.drawn"], `step ${step}`).toBeGreaterThan(0);
      expect(byKind["rollout_fn.called"], `step ${step}`).toBe(byKind["prompts.drawn"]);
    }
    // Call ordinals gapless per step, each recorded once.
    const calls = await rows<{ step: number; ordinals: number[] }>(
      w,
      "SELECT step, array_agg((payload->>'ordinal')::int ORDER BY seq) AS ordinals FROM decisions WHERE run_id = $1 AND kind = 'rollout_fn.called' GROUP BY step ORDER BY step",
      [runId],
    );
    expect(calls.map((c) => c.step)).toEqual([...Array(numRollout).keys()]);
    for (const c of calls) expect(c.ordinals).toEqual([...c.ordinals.keys()]);

    // No round generated twice: one dispatch per (group, round), at most one group_rounds row each.
    expect(
      await rows(w, "SELECT group_id, payload->>'round' FROM decisions WHERE run_id = $1 AND kind = 'group.dispatched' GROUP BY 1, 2 HAVING count(*) > 1", [
        runId,
      ]),
    ).toEqual([]);
    expect(await rows(w, "SELECT group_id, round FROM group_rounds WHERE run_id = $1 GROUP BY 1, 2 HAVING count(*) > 1", [runId])).toEqual([]);
    expect(
      await rows(
        w,
        "SELECT r.group_id, r.round FROM group_rounds r WHERE r.run_id = $1 AND NOT EXISTS (SELECT 1 FROM decisions d WHERE d.run_id = r.run_id AND d.kind = 'group.dispatched' AND d.group_id = r.group_id AND (d.payload->>'round')::int = r.round)",
        [runId],
      ),
    ).toEqual([]);

    // A replay that drew again would leave the first draw's groups unused; one that generated again would
    // leave a group with two finished rounds in one step (the example never buffers a finished group).
    expect(
      await rows(
        w,
        "SELECT d.draw_ordinal FROM drawn_prompts d WHERE d.run_id = $1 AND NOT EXISTS (SELECT 1 FROM decisions x WHERE x.run_id = d.run_id AND x.kind = 'group.dispatched' AND x.group_id = d.draw_ordinal)",
        [runId],
      ),
    ).toEqual([]);
    expect(await rows(w, "SELECT 1 FROM decisions WHERE run_id = $1 AND kind = 'group.outcome' AND payload->>'reason' = 'unused'", [runId])).toEqual([]);
    expect(await rows(w, "SELECT group_id, step FROM group_rounds WHERE run_id = $1 AND is_complete GROUP BY 1, 2 HAVING count(*) > 1", [runId])).toEqual([]);
    const generates = await rows<{ calls: number; groups: number }>(
      w,
      "SELECT (SELECT count(*)::int FROM decisions WHERE run_id = $1 AND kind = 'rollout_fn.called' AND payload->>'op' = 'generate') AS calls, (SELECT count(DISTINCT (group_id, step))::int FROM decisions WHERE run_id = $1 AND kind = 'group.dispatched') AS groups",
      [runId],
    );
    expect(generates[0]?.calls).toBe(generates[0]?.groups);

    // Each step trained exactly the returned groups, once, and each passed the dynamic filter (rewards not all equal).
    const seals = await rows<{ step: number; kept: number[] }>(
      w,
      "SELECT step, payload->'kept' AS kept FROM decisions WHERE run_id = $1 AND kind = 'step.sealed' ORDER BY step",
      [runId],
    );
    expect(seals.map((s) => s.kept.length)).toEqual([4, 4, 4]);
    const allKept = seals.flatMap((s) => s.kept);
    expect(new Set(allKept).size).toBe(allKept.length);
    const trained = await rows<{ group_id: number; trained_step: number; rewards: number }>(
      w,
      "SELECT group_id::int, trained_step, count(DISTINCT reward)::int AS rewards FROM rollout_history WHERE run_id = $1 AND outcome = 'kept' GROUP BY 1, 2 ORDER BY 2, 1",
      [runId],
    );
    expect(trained.map((t) => t.group_id).sort((a, b) => a - b)).toEqual([...allKept].sort((a, b) => a - b));
    for (const t of trained) {
      expect(seals[t.trained_step]?.kept).toContain(t.group_id);
      expect(t.rewards).toBeGreaterThan(1);
    }
    // Groups the function rejected are recorded with the filter's reason.
    const filtered = await rows<{ reason: string }>(
      w,
      "SELECT DISTINCT payload->>'reason' AS reason FROM decisions WHERE run_id = $1 AND kind = 'group.outcome' AND payload->>'outcome' = 'filtered'",
      [runId],
    );
    for (const f of filtered) expect(f.reason).toMatch(/^zero_std/);

    // The eval branch of the same function: eval_results like the built-in eval's, at 0, 2 and 3.
    const evals = await rows<{ step: number; num_prompts: number; num_samples: number; mean_reward: number; pass_at_k: Record<string, number> }>(
      w,
      "SELECT step, num_prompts, num_samples, mean_reward, pass_at_k FROM eval_results WHERE run_id = $1 AND dataset = 'small' ORDER BY step",
      [runId],
    );
    expect(evals.map((e) => e.step)).toEqual([0, 2, 3]);
    for (const e of evals) {
      expect([e.num_prompts, e.num_samples]).toEqual([8, 16]);
      const samples = await rows<{ prompt_index: number; reward: number }>(
        w,
        "SELECT prompt_index, reward FROM eval_samples WHERE run_id = $1 AND step = $2 AND dataset = 'small'",
        [runId, e.step],
      );
      expect(samples).toHaveLength(16);
      expect(e.mean_reward).toBeCloseTo(samples.reduce((a, s) => a + s.reward, 0) / 16, 12);
      const byPrompt = new Map<number, number[]>();
      for (const s of samples) byPrompt.set(s.prompt_index, [...(byPrompt.get(s.prompt_index) ?? []), s.reward]);
      expect(e.pass_at_k["2"]).toBeCloseTo([...byPrompt.values()].filter((rs) => rs.some((r) => r >= 1)).length / 8, 12);
    }

    const replay = spawnRlq(["replay", runId, "--check"], w.env);
    expect(await replay.exited, replay.output()).toBe(0);
  });

  it("a bad return pauses the run with a clear reason; resuming replays the step without drawing again", async () => {
    const path = join(repoRoot, "test/fixtures/rollout-bad-return.mjs");
    // A fresh engine: the first run left the shared one serving its trained version.
    const engine = { kind: "sglang", urls: [await w.freshEngine()] };
    const runId = await w.start({ rollout_function_path: path, num_rollout: 1, dynamic_sampling_filter_path: null, engine });
    const up = spawnRlq(["up", "--run", runId], w.env);
    const paused = async () => {
      const r = await rows<{ status: string; last_error: string | null }>(w, "SELECT status, last_error FROM runs WHERE id = $1", [runId]);
      return r[0]?.status === "paused" ? r[0] : null;
    };
    try {
      const first = await waitFor("the run to pause", paused, 120_000, 200);
      expect(first.last_error).toContain(
        `plugin_bad_return: rollout_function_path ${path} (step 0) returned 3 group(s); expected exactly rollout_batch_size = 4 groups of n_samples_per_prompt = 4 samples`,
      );
      const before = await rows<{ n: number }>(w, "SELECT count(*)::int AS n FROM drawn_prompts WHERE run_id = $1", [runId]);
      const dispatches = await rows<{ n: number }>(w, "SELECT count(*)::int AS n FROM decisions WHERE run_id = $1 AND kind = 'group.dispatched'", [runId]);
      expect(before[0]?.n).toBe(4);
      // Resume: the function is replayed from the log (its draw and generates return at once) and fails the same way.
      const resume = spawnRlq(["run", "resume", runId], w.env);
      expect(await resume.exited, resume.output()).toBe(0);
      await waitFor(
        "the resume to be handled",
        async () => (await rows(w, "SELECT 1 FROM run_requests WHERE run_id = $1 AND handled_seq IS NULL", [runId])).length === 0,
        60_000,
        200,
      );
      await waitFor(
        "the run to pause again",
        async () => {
          const r = await rows<{ n: number }>(
            w,
            "SELECT count(*)::int AS n FROM decisions WHERE run_id = $1 AND kind = 'run.status' AND payload->>'status' = 'paused'",
            [runId],
          );
          return (r[0]?.n ?? 0) >= 2;
        },
        60_000,
        200,
      );
      expect(await rows(w, "SELECT count(*)::int AS n FROM drawn_prompts WHERE run_id = $1", [runId])).toEqual(before);
      expect(await rows(w, "SELECT count(*)::int AS n FROM decisions WHERE run_id = $1 AND kind = 'group.dispatched'", [runId])).toEqual(dispatches);
      expect((await paused())?.last_error).toContain("plugin_bad_return");
    } finally {
      up.kill("SIGTERM");
      await up.exited;
    }
  });
});
