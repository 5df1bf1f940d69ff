import { describe, expect, it } from "vitest";
import { engineHarness } from "../helpers/engine-harness.ts";
import { createSglangServer } from "../../src/engines/sglang.ts";
import { createEnginePool, type EnginePool } from "../../src/engines/pool.ts";
import { createWeightSync } from "../../src/engines/weight-sync.ts";
import type { GenerateResult } from "../../src/engines/engine.ts";
import { fakeStats, request, restartFake, setFault } from "../fakes/fake-engine-control.ts";
import { waitFor } from "../helpers/processes.ts";

/**
 * The engine pool over several fake SGLang processes: an engine killed
 * mid-generation, restarted, re-admitted on the current weights; the
 * concurrency cap; prefix affinity; trainer_push fencing.
 */
const h = engineHarness("sglang");
const fake = (args: string[] = []) => h.fake(args);
/** Another process (the controller, or a trainer's push) brings the engine at `url` to `version` from `path`. */
const load = (url: string, version = 1, path = "/step-0") =>
  fetch(`${url}/update_weights_from_disk`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model_path: path, weight_version: String(version) }),
  });
function pool(urls: string[], extra: Partial<Parameters<typeof createEnginePool>[0]> = {}): EnginePool {
  return h.pool(
    // Streaming: a killed engine still leaves the tokens it streamed.
    urls.map((url) => createSglangServer({ url, requestTimeoutMs: 20_000, isStreaming: true })),
    { noEngineWaitMs: 10_000, ...extra },
  );
}

describe("engine pool", () => {
  it("an engine killed mid-generation: its in-flight requests come back as aborted partials with their tokens; it is re-admitted on the current weights after a restart", async () => {
    const slow = ["--token-delay-ms", "4", "--stop-prob", "0.000001"];
    const a = await fake(slow);
    const b = await fake(slow);
    const p = pool([a.url, b.url]);
    await p.awaitReady(10_000);
    await p.loadWeights(1, "file:///tmp/rlq-ckpt/step-0");

    const n = 24;
    const results: Array<Promise<GenerateResult>> = [];
    for (let i = 0; i < n; i++) results.push(p.generate(request(`kill-${i}`, { maxNewTokens: 150, stopTokenIds: [], seed: 100 + i })));
    await waitFor("both engines generating", async () => (await fakeStats(a.url)).live > 0 && (await fakeStats(b.url)).live > 0);
    const before = (await fakeStats(a.url)).tokensGenerated;
    await waitFor("engine a decoding", async () => (await fakeStats(a.url)).tokensGenerated >= before + 20);
    a.kill("SIGKILL");
    const done = await Promise.all(results); // nothing rejects, nothing is lost

    const partials = done.filter((r) => r.engineId === a.url);
    expect(partials.length).toBeGreaterThan(0);
    for (const r of partials) {
      expect(r.finishReason).toBe("abort");
      expect(r.tokenIds.length).toBeGreaterThan(0);
      expect(r.tokenIds.length).toBeLessThan(150);
      expect(r.weightVersion).toBe(1);
    }
    for (const r of done.filter((x) => x.engineId === b.url)) expect(r.finishReason).toBe("length");
    // A partial is exactly the prefix the engine would have produced: regenerate it on the survivor (same weights, same seed).
    const i = done.findIndex((r) => r.engineId === a.url);
    const full = await p.generate(request(`kill-again-${i}`, { maxNewTokens: 150, stopTokenIds: [], seed: 100 + i }));
    const partial = done[i] as GenerateResult;
    expect(full.tokenIds.slice(0, partial.tokenIds.length)).toEqual(partial.tokenIds);
    expect(full.logProbs.slice(0, partial.logProbs.length)).toEqual(partial.logProbs);

    await waitFor("killed engine out of the rotation", () => p.engineStates()[a.url] === "dead");
    const snapDead = p.snapshot().engines.find((e) => e.engineId === a.url);
    expect(snapDead).toMatchObject({ deaths: 1, state: "dead" });
    expect(snapDead?.aborted).toBeGreaterThan(0);

    // Restarted from the initial checkpoint (version 0): the pool loads version 1 into it before routing to it.
    const a2 = await restartFake("sglang", a.port, slow);
    h.track(a2);
    await waitFor("restarted engine re-admitted", () => p.engineStates()[a.url] === "healthy", 20_000);
    expect(await fakeStats(a.url)).toMatchObject({ weightVersion: 1, loads: 1 });
    const after = await Promise.all(Array.from({ length: 8 }, (_, k) => p.generate(request(`after-${k}`, { maxNewTokens: 5, seed: k }))));
    expect(new Set(after.map((r) => r.engineId))).toEqual(new Set([a.url, b.url]));
    for (const r of after) expect(r.weightVersion).toBe(1);
  });

  it("caps in-flight requests per engine (sglang_server_concurrency) and queues the rest", async () => {
    const f = await fake(["--token-delay-ms", "2", "--stop-prob", "0.000001"]);
    const p = pool([f.url], { maxConcurrentPerEngine: 3 });
    await p.awaitReady(10_000);
    const rs = await Promise.all(Array.from({ length: 12 }, (_, i) => p.generate(request(`cap-${i}`, { maxNewTokens: 20 }))));
    expect(rs.every((r) => r.tokenIds.length === 20)).toBe(true);
    expect((await fakeStats(f.url)).maxLive).toBe(3);
    expect(p.snapshot().engines[0]).toMatchObject({ requests: 12, completed: 12, inFlight: 0 });
  });

  it("a freed slot goes to a queued request that may use that engine; an aborted queued request comes back without a slot", async () => {
    const slow = ["--token-delay-ms", "5", "--stop-prob", "0.000001"];
    const a = await fake(slow);
    const b = await fake(slow);
    const p = pool([a.url, b.url], { maxConcurrentPerEngine: 1 });
    await p.awaitReady(10_000);
    await p.checkHealth();
    // One session on each engine (a session stays where its first turn went).
    const home = new Map<string, string>();
    for (let i = 0; i < 10 && new Set(home.values()).size < 2; i++)
      home.set(`s${i}`, (await p.generate(request(`home-${i}`, { sessionKey: `s${i}`, maxNewTokens: 2 }))).engineId);
    const onA = [...home].find(([, e]) => e === a.url)?.[0] as string;
    const onB = [...home].find(([, e]) => e === b.url)?.[0] as string;
    expect([onA, onB].every((x) => x !== undefined)).toBe(true);
    const long = (id: string, session: string) => p.generate(request(id, { sessionKey: session, maxNewTokens: 4000, stopTokenIds: [] }));
    const longA = long("long-a", onA);
    const longB = long("long-b", onB);
    await waitFor("both engines busy", async () => (await fakeStats(a.url)).live === 1 && (await fakeStats(b.url)).live === 1);
    // Queued, in this order: one for b, one for a, one for either.
    const forB = p.generate(request("q-b", { sessionKey: onB, maxNewTokens: 4 }));
    const forA = p.generate(request("q-a", { sessionKey: onA, maxNewTokens: 4 }));
    const either = p.generate(request("q-any", { maxNewTokens: 4 }));
    await waitFor("three requests queued", () => p.snapshot().queued === 3);
    await p.abort(["q-any"]);
    expect(await either).toMatchObject({ finishReason: "abort", tokenIds: [] });
    // a's slot comes free: the request for a takes it although the request for b queued first.
    await p.abort(["long-a"]);
    expect((await longA).finishReason).toBe("abort");
    expect(await forA).toMatchObject({ engineId: a.url, finishReason: "length" });
    expect(p.snapshot().queued).toBe(1); // the request for b still waits for b
    await p.abort(["long-b"]);
    expect((await longB).finishReason).toBe("abort");
    expect(await forB).toMatchObject({ engineId: b.url, finishReason: "length" });
  });

  it("keeps a session on one engine (prefix affinity) while it is healthy", async () => {
    const a = await fake();
    const b = await fake();
    const c = await fake();
    const p = pool([a.url, b.url, c.url]);
    await p.awaitReady(10_000);
    await p.checkHealth();
    for (const session of ["s1", "s2", "s3", "s4"]) {
      const turns: string[] = [];
      for (let t = 0; t < 4; t++) turns.push((await p.generate(request(`${session}-t${t}`, { sessionKey: session, maxNewTokens: 4 }))).engineId);
      expect(new Set(turns).size).toBe(1);
    }
  });

  it("a weight load flushes the engines' prefix caches: a session is placed afresh by load, not kept waiting for its old engine", async () => {
    const slow = ["--token-delay-ms", "5", "--stop-prob", "0.000001"];
    const a = await fake(slow);
    const b = await fake(slow);
    const p = pool([a.url, b.url], { maxConcurrentPerEngine: 1 });
    await p.awaitReady(10_000);
    await p.loadWeights(1, "file:///tmp/rlq-ckpt/step-0");
    // A session whose home is engine a.
    let session = "";
    for (let i = 0; i < 10 && session === ""; i++) {
      if ((await p.generate(request(`home-${i}`, { sessionKey: `s${i}`, maxNewTokens: 2 }))).engineId === a.url) session = `s${i}`;
    }
    expect(session).not.toBe("");
    const long = (id: string, sessionKey?: string) => p.generate(request(id, { sessionKey, maxNewTokens: 4000, stopTokenIds: [] }));
    // On version 1 the session waits for its busy engine although b is free (prefix affinity).
    const busy = long("busy-v1", session);
    await waitFor("engine a busy", async () => (await fakeStats(a.url)).live === 1);
    const waiting = p.generate(request("turn-v1", { sessionKey: session, maxNewTokens: 4 }));
    await waitFor("the turn queued for engine a", () => p.snapshot().queued === 1);
    await p.abort(["turn-v1", "busy-v1"]);
    expect((await waiting).finishReason).toBe("abort");
    expect((await busy).finishReason).toBe("abort");
    await waitFor("engine a idle", async () => (await fakeStats(a.url)).live === 0);

    await p.loadWeights(2, "file:///tmp/rlq-ckpt/step-1");
    // Engine a busy again (a request without a session lands where routing puts it: retry until a).
    let hold: { id: string; result: Promise<GenerateResult> } | null = null;
    for (let i = 0; i < 10 && hold === null; i++) {
      const r = long(`busy-v2-${i}`);
      await waitFor("the long request running", async () => (await fakeStats(a.url)).live + (await fakeStats(b.url)).live === 1);
      if ((await fakeStats(a.url)).live === 1) hold = { id: `busy-v2-${i}`, result: r };
      else {
        await p.abort([`busy-v2-${i}`]);
        await r;
        await waitFor("engine b idle", async () => (await fakeStats(b.url)).live === 0);
      }
    }
    if (hold === null) throw new Error("no long request landed on engine a in 10 tries");
    // The same session on version 2: its prefix is gone from a, so it goes to the free engine.
    expect(await p.generate(request("turn-v2", { sessionKey: session, maxNewTokens: 4 }))).toMatchObject({
      engineId: b.url,
      weightVersion: 2,
      finishReason: "length",
    });
    await p.abort([hold.id]);
    expect((await hold.result).finishReason).toBe("abort");
  });

  it("a version synced by another process: refreshVersions routes to each engine once it reports the version, and not to one still behind", async () => {
    const a = await fake();
    const b = await fake();
    // A rollout worker's pool: no health round would run again within the test.
    const p = pool([a.url, b.url], { healthIntervalMs: 3_600_000 });
    await p.awaitReady(10_000);
    await p.checkHealth();
    // The controller (another process) loaded version 1 into a; b has not loaded it yet.
    expect((await load(a.url)).ok).toBe(true);
    p.setCurrentVersion(1); // a job at version 1 arrived
    expect(p.engineStates()).toEqual({ [a.url]: "stale", [b.url]: "stale" });
    await p.refreshVersions();
    expect(p.engineStates()).toEqual({ [a.url]: "healthy", [b.url]: "stale" });
    const first = await Promise.all(Array.from({ length: 4 }, (_, i) => p.generate(request(`v1-${i}`, { maxNewTokens: 3 }))));
    for (const r of first) expect(r).toMatchObject({ engineId: a.url, weightVersion: 1 });
    expect((await load(b.url)).ok).toBe(true);
    await p.refreshVersions();
    expect(p.engineStates()).toEqual({ [a.url]: "healthy", [b.url]: "healthy" });
    const both = await Promise.all(Array.from({ length: 8 }, (_, i) => p.generate(request(`v1-both-${i}`, { maxNewTokens: 3 }))));
    expect(new Set(both.map((r) => r.engineId))).toEqual(new Set([a.url, b.url]));
  });

  it("loads ending one engine at a time (rlq_loaded): refreshLoaded admits each engine that reports the version and leaves one still loading stale, unchecked", async () => {
    const a = await fake();
    const b = await fake(["--load-delay-ms", "3000"]);
    // A health check of b while it loads would wait for the load (its generate waits behind the writer lock).
    const p = pool([a.url, b.url], { healthIntervalMs: 3_600_000, healthTimeoutMs: 60_000 });
    await p.awaitReady(10_000);
    await p.checkHealth();
    const bLoaded = load(b.url);
    expect((await load(a.url)).ok).toBe(true);
    p.setCurrentVersion(1); // a job at version 1 arrived during the sync
    await p.refreshLoaded();
    // Returned while b still loads: b was read (version 0), not health-checked (that would have waited 3 s and admitted it).
    expect(p.engineStates()).toEqual({ [a.url]: "healthy", [b.url]: "stale" });
    const first = await Promise.all(Array.from({ length: 4 }, (_, i) => p.generate(request(`loaded-${i}`, { maxNewTokens: 3 }))));
    for (const r of first) expect(r).toMatchObject({ engineId: a.url, weightVersion: 1 });
    expect((await bLoaded).ok).toBe(true);
    await p.refreshLoaded();
    expect(p.engineStates()).toEqual({ [a.url]: "healthy", [b.url]: "healthy" });
  });

  it("trainer_push: the sync resolves once every live engine reports the pushed version, and only then routes to it", async () => {
    const a = await fake();
    const b = await fake();
    const p = pool([a.url, b.url]);
    await p.awaitReady(10_000);
    await p.checkHealth();
    const sync = createWeightSync(p, { mode: "trainer_push", pushTimeoutMs: 10_000 });
    sync.beginPush();
    const syncing = sync.sync(1, null);
    let isDone = false;
    void syncing.then(() => (isDone = true));
    // The "trainer" pushes to one engine, then the other (here through the disk endpoint; NCCL in production).
    const push = (url: string) => load(url, 1, "/pushed");
    await push(a.url);
    // The sync has seen engine a on version 1 (its poll read it) and still waits for b.
    await waitFor("the sync saw engine a on version 1", () => p.snapshot().engines.find((e) => e.engineId === a.url)?.weightVersion === 1);
    expect(isDone).toBe(false);
    await push(b.url);
    const report = await syncing;
    expect(report).toMatchObject({ mode: "trainer_push", version: 1, absent: [] });
    expect(report.engines.sort()).toEqual([a.url, b.url].sort());
    expect((await p.generate(request("push-after"))).weightVersion).toBe(1);
  });

  it("trainer_push: a version pushed after the pool loaded one itself (a controller's restore) is never loaded back over by a health check", async () => {
    const a = await fake();
    const b = await fake();
    const p = pool([a.url, b.url]);
    await p.awaitReady(10_000);
    // A starting controller loaded the run's version 0 from disk (controller/engine-admin.ts restoreVersion).
    await p.loadWeights(0, "file:///base-model");
    const sync = createWeightSync(p, { mode: "trainer_push", pushTimeoutMs: 10_000 });
    sync.beginPush();
    for (const url of [a.url, b.url]) await load(url, 1, "/pushed-1");
    // A health round between the push and the sync's read: both engines are ahead of the pool's version 0.
    await p.checkHealth();
    expect([(await fakeStats(a.url)).weightVersion, (await fakeStats(b.url)).weightVersion]).toEqual([1, 1]);
    expect((await sync.sync(1, null)).engines.sort()).toEqual([a.url, b.url].sort());
    expect((await fakeStats(a.url)).loadedPaths).toEqual(["/base-model", "/pushed-1"]);
  });

  it("trainer_push: an engine that came back behind (restarted at its launch weights) is not waited for; it joins once a push reaches it", async () => {
    const a = await fake();
    const b = await fake();
    const p = pool([a.url, b.url]);
    await p.awaitReady(10_000);
    await p.checkHealth();
    const sync = createWeightSync(p, { mode: "trainer_push", pushTimeoutMs: 15_000 });
    const push = (url: string, v: number) => load(url, v, `/pushed-${v}`);
    sync.beginPush();
    const first = sync.sync(1, null);
    await Promise.all([push(a.url, 1), push(b.url, 1)]);
    await first;
    // b dies and comes back on its port at version 0, without anything the trainer had set up on it.
    b.kill("SIGKILL");
    await waitFor("b out of the rotation", () => p.engineStates()[b.url] === "dead");
    h.track(await restartFake("sglang", b.port));
    await waitFor("b answering, behind", () => p.snapshot().engines.find((e) => e.engineId === b.url)?.state === "stale", 20_000);
    // The trainer's next push reaches a alone: the sync resolves on a, b absent, well inside the timeout.
    sync.beginPush();
    const second = sync.sync(2, null);
    await push(a.url, 2);
    const report = await second;
    expect(report).toMatchObject({ version: 2, engines: [a.url], absent: [b.url] });
    expect(report.durationMs).toBeLessThan(15_000);
    for (let k = 0; k < 4; k++) expect(await p.generate(request(`behind-${k}`, { seed: k }))).toMatchObject({ engineId: a.url, weightVersion: 2 });
    // A later push reaches b too: it reports the pool's version and takes requests again.
    await push(b.url, 2);
    await waitFor("b admitted at version 2", () => p.engineStates()[b.url] === "healthy", 20_000);
  });

  it("colocate: a release waits for an admission under way (its log-prob probe generates), and the pool sends nothing to the engine until it resumes", async () => {
    // Slow tokens: the probe's generations are in flight when the release is asked for.
    const f = await fake(["--token-delay-ms", "300"]);
    const p = pool([f.url]);
    const admitted = p.checkHealth();
    await waitFor("the admission's probe generating", async () => (await fakeStats(f.url)).live > 0, 10_000, 5);
    await p.releaseMemory(["weights", "kv_cache"]);
    await admitted;
    const released = await fakeStats(f.url);
    expect([released.releases, released.generateWhileReleased], released.generateWhileReleasedRids.join(", ")).toEqual([1, 0]);
    // Released: health rounds send nothing (a /health_generate is a generation too).
    await p.checkHealth();
    await p.checkHealth();
    expect((await fakeStats(f.url)).healthChecks).toBe(released.healthChecks);
    await p.resumeMemory(["weights", "kv_cache"]);
    await p.checkHealth();
    expect((await fakeStats(f.url)).healthChecks).toBeGreaterThan(released.healthChecks);
    expect((await p.generate(request("after-resume", { maxNewTokens: 2 }))).tokenIds.length).toBeGreaterThan(0);
    expect((await fakeStats(f.url)).generateWhileReleased).toBe(0);
  });

  it("colocate, a restarted controller's pool: memory the log says released holds its checks through the weights' resume and the load, until the KV cache resumes", async () => {
    const f = await fake();
    // The controller before this one released both tags, then died.
    const release = await fetch(`${f.url}/release_memory_occupation`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ tags: ["weights", "kv_cache"] }),
    });
    expect(release.ok).toBe(true);
    const p = pool([f.url]);
    p.markReleased(["weights", "kv_cache"]);
    // controller/engine-admin.ts `resumeMemory` after a restart: a release of the tag first, then its resume; then the step's load.
    await p.releaseMemory(["weights"]);
    await p.resumeMemory(["weights"]);
    await p.loadWeights(1, "file:///tmp/rlq-ckpt/step-0");
    await p.checkHealth();
    const loaded = await fakeStats(f.url);
    expect([loaded.healthChecks, loaded.healthWhileReleased, loaded.generateWhileReleased, loaded.memoryFaults]).toEqual([0, 0, 0, []]);
    await p.resumeMemory(["kv_cache"]);
    await p.checkHealth();
    expect((await fakeStats(f.url)).healthChecks).toBeGreaterThan(0);
    expect((await p.generate(request("after-resume", { maxNewTokens: 2 }))).weightVersion).toBe(1);
  });

  it("every engine dead: requests fail as retriable after the wait, and succeed again once one is back", async () => {
    const f = await fake();
    const p = pool([f.url], { noEngineWaitMs: 600 });
    await p.awaitReady(10_000);
    await setFault(f.url, { mode: "die" });
    await waitFor("dead", () => p.engineStates()[f.url] === "dead");
    await expect(p.generate(request("none-1"))).rejects.toMatchObject({ code: "engine_unavailable", isRetriable: true });
    const f2 = await restartFake("sglang", f.port);
    h.track(f2);
    await waitFor("back", () => p.engineStates()[f.url] === "healthy");
    expect((await p.generate(request("none-2"))).tokenIds.length).toBeGreaterThan(0);
  });
});
