import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterEach, describe, expect, it } from "vitest";
import { resolvePluginFunction } from "../../src/plugins/http.ts";
import { validatePluginGroupReward, validatePluginReward } from "../../src/reward/plugin-contract.ts";
import { createRemoteReward, RemoteRewardError, type AttemptFailure } from "../../src/reward/remote.ts";
import { selectReward } from "../../src/runtime/reward-scorer.ts";
import { toDynamicFilterOutput } from "../../src/filters/dynamic-filter.ts";

/**
 * The example Python reward server (examples/python-reward-server, standard
 * library only) in its own process: rlq scores through its HTTP plugin
 * contract and through slime's remote_rm body, and the remote path survives
 * the server failing, answering garbage, being slow, and dying.
 */
const SERVER = join(import.meta.dirname, "..", "..", "examples", "python-reward-server", "server.py");
const children: ChildProcess[] = [];

async function startServer(args: string[] = [], port = 0): Promise<{ url: string; child: ChildProcess }> {
  const child = spawn("python3", [SERVER, "--port", String(port), ...args], { stdio: ["ignore", "pipe", "inherit"] });
  children.push(child);
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
  const [line] = (await Promise.race([once(lines, "line"), once(child, "exit").then(() => [null])])) as [string | null];
  if (!line?.startsWith("listening on ")) throw new Error(`reward server did not start: ${line}`);
  return { url: line.slice("listening on ".length).trim(), child };
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = once(child, "exit");
  child.kill("SIGTERM");
  await exited;
}

afterEach(async () => {
  await Promise.all(children.splice(0).map(stop));
});

const group = [
  { sampleIndex: 0, prompt: "1+2=", response: "\\boxed{3}", label: "3", metadata: {}, status: "completed" },
  { sampleIndex: 1, prompt: "1+2=", response: "\\boxed{4}", label: "3", metadata: {}, status: "completed" },
  { sampleIndex: 2, prompt: "1+2=", response: "3", label: "3", metadata: {}, status: "truncated" },
  { sampleIndex: 3, prompt: "1+2=", response: "so \\boxed{ 3 }", label: "3", metadata: {}, status: "completed" },
];
const expected = [1, 0, 0, 1];
const noWait = (failures: AttemptFailure[] = []) => ({
  sleep: async () => undefined,
  random: () => 0,
  onAttemptFailed: (f: AttemptFailure) => void failures.push(f),
});

describe("HTTP plugins served by the Python example server", () => {
  it("custom_rm_path: http://... scores per sample and per group through the plugin contract", async () => {
    const { url } = await startServer();
    const args = { custom_rm_path: url, reward_key: "score" };
    const reward = await resolvePluginFunction<(a: unknown, s: unknown) => Promise<unknown>>(url, process.cwd(), "reward", "custom_rm_path");
    const perSample = await Promise.all(group.map(async (s, i) => validatePluginReward(await reward(args, s), { path: url, sampleIndex: i })));
    expect(perSample.map((r) => selectReward(r, "score", url).value)).toEqual(expected);
    expect(perSample[0]).toEqual({ score: 1, pred: "3" });

    const rewardGroup = await resolvePluginFunction<(a: unknown, s: readonly unknown[]) => Promise<unknown>>(
      url,
      process.cwd(),
      "reward_group",
      "custom_rm_path",
    );
    expect(validatePluginGroupReward(await rewardGroup(args, group), group.length, { path: url })).toEqual(expected);

    const filter = await resolvePluginFunction<(a: unknown, g: unknown) => Promise<unknown>>(
      url,
      process.cwd(),
      "dynamic_filter",
      "dynamic_sampling_filter_path",
    );
    expect(toDynamicFilterOutput(await filter(args, { groupId: 1, rewards: [1, 1, 1], samples: [] }))).toEqual({
      keep: false,
      reason: "zero_std",
      keep_when_insufficient: false,
    });
    expect(toDynamicFilterOutput(await filter(args, { groupId: 1, rewards: expected, samples: [] })).keep).toBe(true);
  });

  it("rm_type: remote_rm scores with slime's {prompt, response, label} body", async () => {
    const { url } = await startServer();
    const out = await createRemoteReward({ url }).scoreGroup(group);
    expect(out.map((r) => selectReward(r, "score", url).value)).toEqual(expected);
  });

  it("500s and garbage: retried, every sample scored", async () => {
    const { url } = await startServer(["--fail-first", "3", "--garbage-first", "2"]);
    const failures: AttemptFailure[] = [];
    const out = await createRemoteReward({ url, ...noWait(failures) }).scoreGroup(group);
    expect(out.map((r) => selectReward(r, "score", url).value)).toEqual(expected);
    expect(failures.filter((f) => f.status === 500)).toHaveLength(3);
    expect(failures.filter((f) => f.error === "the body is not JSON")).toHaveLength(2);
    expect(failures.every((f) => f.url === url && f.isRetriable)).toBe(true);
  });

  it("slow: each try times out with a record, a longer timeout gets the answer", async () => {
    const { url } = await startServer(["--delay-ms", "400"]);
    const err = (await createRemoteReward({ url, requestTimeoutMs: 100, maxAttempts: 2, ...noWait() })
      .scoreSample(group[0] as (typeof group)[0], 0)
      .catch((e: unknown) => e)) as RemoteRewardError;
    expect(err).toBeInstanceOf(RemoteRewardError);
    expect(err.record).toMatchObject({ url, attempts: 2, status: null, error: "timed out after 100 ms", sampleIndex: 0 });
    expect(err.isRetriable).toBe(true);
    expect(await createRemoteReward({ url, requestTimeoutMs: 5000 }).scoreSample(group[0] as (typeof group)[0])).toEqual({ score: 1, pred: "3" });
  });

  it("dies: a clear failure naming the URL; back up during the retries, nothing is lost", async () => {
    const first = await startServer();
    const port = new URL(first.url).port;
    await stop(first.child);
    const err = (await createRemoteReward({ url: first.url, maxAttempts: 3, ...noWait() })
      .scoreSample(group[0] as (typeof group)[0], 0)
      .catch((e: unknown) => e)) as RemoteRewardError;
    expect(err.message).toContain(`remote_rm POST ${first.url} for sample 0 gave up after 3 tries`);
    expect(err.message).toContain("ECONNREFUSED");
    expect(err.isRetriable).toBe(true); // the reward job is retried later: the sample is not lost

    // The server comes back while the client is backing off: the same call succeeds.
    let restart: Promise<unknown> | null = null;
    const rm = createRemoteReward({
      url: first.url,
      random: () => 0,
      sleep: async () => {
        restart ??= startServer([], Number(port)); // every sample's backoff waits for the same restart
        await restart;
      },
    });
    const out = await rm.scoreGroup(group);
    expect(restart).not.toBeNull();
    expect(out.map((r) => selectReward(r, "score", first.url).value)).toEqual(expected);
  });
});
