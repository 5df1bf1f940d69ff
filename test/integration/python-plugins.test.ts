import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { repoRoot, waitFor } from "../helpers/processes.ts";
import { expectPythonVerdicts, pythonRewards, SLIME_PLUGINS, type PluginRow } from "../helpers/slime-plugins.ts";
import { runUntilDone } from "../../src/index.ts";
import { resolvePluginFunction } from "../../src/plugins/http.ts";
import { closePythonHosts, pythonHostPid } from "../../src/plugins/python.ts";

/**
 * slime users' Python plugins (test/fixtures/slime/plugins, slime's
 * signatures and imports), run unmodified by rlq's Python plugin host in rlq
 * runs driven by runUntilDone: the rewards recorded are what the Python
 * function returns, the Python filter's verdicts are the run's, and a plugin
 * that raises or returns the wrong type pauses the run with a message naming
 * the plugin, the sample and what to return, as a JS plugin does.
 */
const PLUGINS = SLIME_PLUGINS;
const rewards = `py:${PLUGINS}/my_rewards.py`;
const filters = `py:${PLUGINS}/my_filters.py`;
let w: World;

beforeAll(async () => {
  w = await createWorld("pyplugins");
});
afterAll(async () => {
  closePythonHosts();
  await w?.close();
});

describe("Python plugins in slime's signatures", () => {
  it("a slime reward function and dynamic filter run unmodified in a run: recorded rewards and verdicts are Python's", async () => {
    const engineUrl = await w.freshEngine();
    const { runId, outcome, status } = await runUntilDone(
      w.baseConfig({
        custom_rm_path: `${rewards}:reward_func`,
        dynamic_sampling_filter_path: `${filters}:keep_mixed_rewards`,
        engine: { kind: "sglang", urls: [engineUrl] },
        num_rollout: 2,
      }),
      { env: w.env, baseDir: repoRoot },
    );
    expect(outcome, status.lastError ?? "").toBe("completed");
    expect(status.trainSteps).toBe(2);

    const rows = (
      await w.db.pool.query<PluginRow>(
        "SELECT group_id, prompt, response, status, reward, outcome, outcome_reason FROM rollout_history WHERE run_id = $1 AND outcome <> 'discarded' ORDER BY group_id, sample_index",
        [runId],
      )
    ).rows;
    expect(rows.length).toBeGreaterThan(0);
    // Python's rewards, and the Python filter's verdict: a group is kept iff its rewards vary; dropped groups carry its reason.
    const { groups, filtered } = expectPythonVerdicts(rows);
    expect(groups - filtered).toBeGreaterThan(0);
  });

  it("a slime multi-turn generate function (post to /generate, tool tokens) trains with tool tokens masked, through a SIGKILL of the host", async () => {
    const engineUrl = await w.freshEngine();
    let killedPid: number | undefined;
    const { runId, outcome, status } = await runUntilDone(
      w.baseConfig({
        custom_generate_function_path: `py:${PLUGINS}/my_agent.py:generate`,
        custom_rm_path: `${rewards}:reward_func`,
        dynamic_sampling_filter_path: null,
        engine: { kind: "sglang", urls: [engineUrl] },
        num_rollout: 2,
      }),
      {
        env: w.env,
        baseDir: repoRoot,
        progressEveryMs: 0,
        onProgress: () => {
          // SIGKILL the plugin host as soon as it runs (calls in flight fail; the rollout job is retried on a new host).
          const pid = pythonHostPid(repoRoot);
          if (killedPid === undefined && pid !== undefined) {
            killedPid = pid;
            process.kill(pid, "SIGKILL");
          }
        },
      },
    );
    expect(killedPid).toBeDefined();
    expect(pythonHostPid(repoRoot)).not.toBe(killedPid);
    expect(outcome, status.lastError ?? "").toBe("completed");
    expect(status.trainSteps).toBe(2);
    const rows = (
      await w.db.pool.query<{ tokens: number[]; prompt_length: number; loss_mask: number[]; status: string; outcome: string }>(
        "SELECT tokens, prompt_length, loss_mask, status, outcome FROM rollout_history WHERE run_id = $1 AND outcome = 'kept' AND trained_step IS NOT NULL",
        [runId],
      )
    ).rows;
    expect(rows.length).toBeGreaterThan(0);
    const tool = [...Buffer.from(" ok")];
    for (const r of rows) {
      const response = r.tokens.slice(r.prompt_length);
      expect(r.loss_mask).toHaveLength(response.length);
      // Two model turns, each followed by the tool's " ok": exactly those bytes are masked out.
      const masked = response.filter((_, i) => r.loss_mask[i] === 0);
      expect(masked).toEqual([...tool, ...tool]);
      const modelTokens = r.loss_mask.filter((m) => m === 1).length;
      expect(modelTokens).toBeGreaterThan(0);
      expect(modelTokens).toBeLessThanOrEqual(8);
      expect(response.slice(-3)).toEqual(tool);
    }
  });

  it("a generate function that posts a new image with no observation tokens before it pauses the run, naming what to append", async () => {
    const engineUrl = await w.freshEngine();
    const { outcome, status } = await runUntilDone(
      w.baseConfig({
        custom_generate_function_path: `py:${PLUGINS}/my_agent.py:generate_image_observation`,
        custom_rm_path: `${rewards}:reward_func`,
        dynamic_sampling_filter_path: null,
        engine: { kind: "sglang", urls: [engineUrl] },
      }),
      { env: w.env, baseDir: repoRoot },
    );
    expect(outcome).toBe("paused");
    expect(status.lastError).toMatch(
      /my_agent\.py:generate_image_observation \(sample \d+ of group \d+\) posted 1 new image\(s\) \(beyond the 0 the sample holds\) with no tokens appended since the last request to hold their placeholders: append the observation's tokens/,
    );
  });

  for (const [fn, message] of [
    ["reward_raises", /custom_rm_path py:.*my_rewards\.py:reward_raises threw on sample \d+: ValueError: judge unavailable for 'Q\d+: /],
    [
      "reward_wrong_type",
      /custom_rm_path py:.*my_rewards\.py:reward_wrong_type returned a value rlq cannot use on sample \d+: .* is a Sample .*; expected a number, a bool or a dict/,
    ],
  ] as const) {
    it(`a Python reward that ${fn === "reward_raises" ? "raises" : "returns a Sample"} pauses the run with the reason, facts intact`, async () => {
      const engineUrl = await w.freshEngine();
      const { runId, outcome, status } = await runUntilDone(
        w.baseConfig({ custom_rm_path: `${rewards}:${fn}`, engine: { kind: "sglang", urls: [engineUrl] } }),
        { env: w.env, baseDir: repoRoot },
      );
      expect(outcome).toBe("paused");
      expect(status.lastError).toMatch(message);
      const segs = (await w.db.pool.query("SELECT count(*)::int AS n FROM sample_segments WHERE run_id = $1", [runId])).rows[0].n;
      expect(segs).toBeGreaterThan(0);
    });
  }

  it("group rewards, a bool filter and a buffer filter in slime's signatures; a killed host is started again", async () => {
    const dir = join(repoRoot, PLUGINS);
    const sample = (i: number, response: string) => ({ sampleIndex: i, prompt: "Q", response, label: "b", metadata: {}, status: "completed" });
    const group = await resolvePluginFunction<(a: unknown, s: unknown[]) => Promise<unknown>>(
      "py:my_rewards.batched_reward_func",
      dir,
      "reward_group",
      "custom_rm_path",
    );
    const samples = [sample(0, "abcd"), sample(1, "abc")];
    expect(await group({}, samples)).toEqual(pythonRewards(samples.map((s) => ({ response: s.response, label: s.label, status: s.status }))));

    const keepAll = await resolvePluginFunction<(a: unknown, g: unknown) => Promise<unknown>>(
      "py:my_filters.keep_all_bool",
      dir,
      "dynamic_filter",
      "dynamic_sampling_filter_path",
    );
    expect(await keepAll({}, { groupId: 1, rewards: [0, 0], samples: [sample(0, "a"), sample(1, "b")] })).toBe(true);

    const popLast = await resolvePluginFunction<(a: unknown, r: null, b: unknown[], n: number) => Promise<unknown>>(
      "py:my_filters.pop_last",
      dir,
      "buffer_filter",
      "buffer_filter_path",
    );
    expect(await popLast({}, null, [{ groupId: "3" }, { groupId: "7" }, { groupId: "9" }], 2)).toEqual(["7", "9"]);

    const pid = pythonHostPid(dir);
    expect(pid).toBeDefined();
    process.kill(pid as number, "SIGKILL");
    expect(await popLast({}, null, [{ groupId: "4" }], 1)).toEqual(["4"]);
    expect(pythonHostPid(dir)).not.toBe(pid);

    // A host killed while a reward call is in flight: the call is tried again on a new host.
    const started = join(w.home, "slow-reward-started");
    const slow = await resolvePluginFunction<(a: unknown, s: unknown) => Promise<unknown>>(
      "py:slow_rewards.reward_after_a_moment",
      dir,
      "reward",
      "custom_rm_path",
    );
    const inFlight = slow({}, { ...sample(0, "abcde"), metadata: { started_file: started } });
    await waitFor("the reward call to start in Python", () => existsSync(started));
    const before = pythonHostPid(dir);
    process.kill(before as number, "SIGKILL");
    expect(await inFlight).toBe(5);
    expect(readFileSync(started, "utf8")).toBe("2"); // the call ran twice: once on each host
    expect(pythonHostPid(dir)).not.toBe(before);

    await expect(resolvePluginFunction("py:my_rewards.no_such_fn", dir, "reward", "custom_rm_path")).rejects.toThrow(
      /custom_rm_path py:my_rewards\.no_such_fn: cannot import my_rewards\.no_such_fn .*has no function 'no_such_fn'/,
    );
  });
});
