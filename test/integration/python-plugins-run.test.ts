import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { repoRoot, spawnRlq } from "../helpers/processes.ts";
import { checkRunInvariants } from "../helpers/invariants.ts";
import { expectPythonVerdicts, fixtureLabels, SLIME_PLUGINS, type PluginRow } from "../helpers/slime-plugins.ts";
import { runUntilDone } from "../../src/index.ts";
import { closePythonHosts, pythonHostPid } from "../../src/plugins/python.ts";

/**
 * One run whose four plugins are all slime-signature Python functions
 * (test/fixtures/slime/plugins): the reward `reward_func(args, sample)`, the
 * dynamic filter returning DynamicFilterOutput, the buffer filter
 * `(args, rollout_id, buffer, num_samples)` (slime/rollout/data_source.py
 * RolloutDataSourceWithBuffer._get_samples_from_buffer calls it with
 * rollout_id None, as rlq does) and a two-turn tool agent posting to
 * /generate through slime's `post`. Partial rollouts with over-sampling keep
 * more groups in the buffer than a draw takes, so the buffer filter chooses;
 * its choice is read back from the decision log. The plugin host is
 * SIGKILLed after the first step commits; rlq starts it again and the run
 * ends exactly as a run without the kill would.
 */
const PLUGINS = `py:${SLIME_PLUGINS}`;
const NUM_ROLLOUT = 4;
const RBS = 2;
let w: World;

beforeAll(async () => {
  w = await createWorld("pyplugrun");
});
afterAll(async () => {
  closePythonHosts();
  await w?.close();
});

/** The buffer at each draw, folded from the decision log: groups buffered in, groups the draw took out. */
async function bufferAtDraws(runId: string): Promise<Array<{ buffer: number[]; fromBuffer: number[] }>> {
  const rows = (
    await w.db.pool.query<{ kind: string; payload: { outcome?: string; groupId?: number; fromBuffer?: number[] } }>(
      "SELECT kind, payload FROM decisions WHERE run_id = $1 AND kind IN ('group.outcome', 'prompts.drawn') ORDER BY seq",
      [runId],
    )
  ).rows;
  let buffer: number[] = [];
  const draws: Array<{ buffer: number[]; fromBuffer: number[] }> = [];
  for (const d of rows) {
    if (d.kind === "group.outcome" && d.payload.outcome === "buffered") buffer.push(Number(d.payload.groupId));
    if (d.kind === "prompts.drawn") {
      const fromBuffer = (d.payload.fromBuffer ?? []).map(Number);
      draws.push({ buffer: [...buffer], fromBuffer });
      buffer = buffer.filter((g) => !fromBuffer.includes(g));
    }
  }
  return draws;
}

describe("a run of four slime-signature Python plugins", () => {
  it("rewards, filters, buffer choices and tool-turn loss masks are Python's, through a SIGKILL of the plugin host", async () => {
    // Turns that often stop early: response lengths, and so the rewards within a group, vary, and most groups pass the filter.
    const engineUrl = await w.freshEngine(["--stop-prob", "0.2"]);
    let killedPid: number | undefined;
    let killedAfterSteps = 0;
    let restartedPid: number | undefined;
    const { runId, outcome, status } = await runUntilDone(
      w.baseConfig({
        custom_rm_path: `${PLUGINS}/my_rewards.py:reward_func`,
        dynamic_sampling_filter_path: `${PLUGINS}/my_filters.py:keep_mixed_rewards`,
        buffer_filter_path: `${PLUGINS}/my_filters.py:take_newest`,
        custom_generate_function_path: `${PLUGINS}/my_agent.py:generate_newline_tool`,
        engine: { kind: "sglang", urls: [engineUrl] },
        partial_rollout: true,
        rollout_batch_size: RBS,
        n_samples_per_prompt: 2,
        // Twice and more what a step keeps: the groups left at the seal (surplus or aborted) fill the buffer faster than a draw takes them.
        over_sampling_batch_size: 8,
        rollout_max_response_len: 48,
        num_rollout: NUM_ROLLOUT,
      }),
      {
        env: w.env,
        baseDir: repoRoot,
        progressEveryMs: 0,
        onProgress: (s) => {
          // Mid-run: once a step has committed, the host dies with calls in flight or between them.
          const pid = pythonHostPid(repoRoot);
          if (killedPid === undefined && s.trainSteps >= 1 && pid !== undefined) {
            killedPid = pid;
            killedAfterSteps = s.trainSteps;
            process.kill(pid, "SIGKILL");
          } else if (killedPid !== undefined && pid !== undefined && pid !== killedPid) restartedPid = pid;
        },
      },
    );
    expect(outcome, status.lastError ?? "").toBe("completed");
    expect(killedPid).toBeDefined();
    expect(killedAfterSteps).toBeLessThan(NUM_ROLLOUT);
    // rlq started a new host, which ran the plugins for the steps after the kill.
    expect(restartedPid).toBeDefined();
    expect(status.trainSteps).toBe(NUM_ROLLOUT);

    // Exact: steps once each, draw ordinals gapless in dataset order, no group or sample trained twice.
    await checkRunInvariants(w.db, runId, { numRollout: NUM_ROLLOUT, datasetSize: fixtureLabels().size, shuffle: false, seed: 42, rbs: RBS });
    const replay = spawnRlq(["replay", runId, "--check"], w.env);
    expect(await replay.exited, replay.output()).toBe(0);

    // The buffer filter chose: each draw with a non-empty buffer took exactly its newest group, and
    // some draws left older groups waiting (pop_first, slime's default, would have taken them all).
    const draws = await bufferAtDraws(runId);
    const withBuffer = draws.filter((d) => d.buffer.length > 0);
    expect(withBuffer.length).toBeGreaterThan(0);
    for (const d of withBuffer) expect(d.fromBuffer).toEqual([Math.max(...d.buffer)]);
    for (const d of draws.filter((x) => x.buffer.length === 0)) expect(d.fromBuffer).toEqual([]);
    expect(withBuffer.some((d) => d.buffer.length >= 2)).toBe(true);

    // Rewards recorded are Python's; the dynamic filter's verdicts and reasons are Python's.
    const rows = (
      await w.db.pool.query<PluginRow & { tokens: number[]; prompt_length: number; loss_mask: number[]; trained_step: number | null }>(
        "SELECT group_id, prompt, response, status, reward, outcome, outcome_reason, tokens, prompt_length, loss_mask, trained_step FROM rollout_history WHERE run_id = $1 AND outcome IN ('kept', 'filtered') ORDER BY group_id, sample_index",
        [runId],
      )
    ).rows;
    expectPythonVerdicts(rows);

    // Loss masks: 0 exactly on the tool's tokens (control bytes the fake model never samples), 1 on the model's.
    const trained = rows.filter((r) => r.trained_step !== null);
    expect(trained.length).toBe(NUM_ROLLOUT * RBS * 2);
    let fullTwoTurn = 0;
    for (const r of trained) {
      const response = r.tokens.slice(r.prompt_length);
      expect(r.loss_mask).toEqual(response.map((t) => (t < 32 ? 0 : 1)));
      expect(r.loss_mask.filter((m) => m === 1).length).toBeGreaterThan(0);
      expect(response.filter((t) => t < 32).length % 2).toBe(0); // whole tool answers ("\n\n") only
      if (response.filter((t) => t < 32).length === 4) fullTwoTurn++;
    }
    expect(fullTwoTurn).toBeGreaterThan(0);
  });
});
