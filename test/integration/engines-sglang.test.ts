import { describe, expect, it } from "vitest";
import { engineHarness } from "../helpers/engine-harness.ts";
import { createSglangServer } from "../../src/engines/sglang.ts";
import { createEnginePool, type EnginePool } from "../../src/engines/pool.ts";
import { createEnginesFromConfig } from "../../src/engines/from-config.ts";
import { sglangEngineConfigSchema, engineRuntimeDefaults } from "../../src/engines/config-schema.ts";
import { RlqError } from "../../src/lib/errors.ts";
import { CONTROL_SOCKETS_PER_SERVER } from "../../src/lib/http-client.ts";
import { fakeStats, pushInPlace, request, setFault, startFake } from "../fakes/fake-engine-control.ts";
import { waitFor } from "../helpers/processes.ts";

/**
 * The SGLang adapter and the pool against the fake SGLang server as a
 * separate process, one injected failure at a time.
 */
const h = engineHarness("sglang");
const fake = (args: string[] = []) => h.fake(args);
/** Streaming adapters: most tests here are about what a stream keeps when a server misbehaves. */
function pool(urls: string[], extra: Partial<Parameters<typeof createEnginePool>[0]> = {}, requestTimeoutMs = 10_000): EnginePool {
  return h.pool(
    urls.map((url) => createSglangServer({ url, requestTimeoutMs, isStreaming: true })),
    { healthTimeoutMs: 2_500, ...extra },
  );
}

describe("SGLang adapter", () => {
  it("sends the sampling params and parses tokens, log-probs, finish reason and version, streamed or not", async () => {
    const f = await fake(["--stop-prob", "0.2", "--weight-version", "4"]);
    const streamed = createSglangServer({ url: f.url, requestTimeoutMs: 10_000 });
    const whole = createSglangServer({ url: f.url, requestTimeoutMs: 10_000, isStreaming: false });
    const a = await streamed.generate(request("s-1", { maxNewTokens: 64, seed: 11 }));
    const b = await whole.generate(request("s-2", { maxNewTokens: 64, seed: 11 }));
    expect(a).toEqual({ ...b, engineId: a.engineId });
    expect(a.finishReason).toBe("stop");
    expect(a.tokenIds.at(-1)).toBe(257);
    expect(a.weightVersion).toBe(4);
    expect(a.logProbs.every((x) => x <= 0)).toBe(true);

    const short = await streamed.generate(request("s-3", { maxNewTokens: 3, stopTokenIds: [], seed: 11 }));
    // max_new_tokens is the remaining budget: exactly 3 tokens unless EOS came first.
    expect(short.tokenIds.length).toBeLessThanOrEqual(3);
    if (short.tokenIds.length === 3 && short.tokenIds[2] !== 257) expect(short.finishReason).toBe("length");
  });

  it("aborts by request id and waits until the aborted request has returned with its tokens", async () => {
    const f = await fake(["--token-delay-ms", "5", "--stop-prob", "0.000001"]);
    const p = pool([f.url]);
    await p.awaitReady(10_000);
    let isSettled = false;
    const pending = p.generate(request("ab-1", { maxNewTokens: 2000 })).finally(() => (isSettled = true));
    const other = p.generate(request("ab-2", { maxNewTokens: 40 }));
    await waitFor("tokens flowing", async () => (await fakeStats(f.url)).live === 2 && (await fakeStats(f.url)).tokensGenerated >= 10);
    await p.abort(["ab-1", "unknown-id"]);
    expect(isSettled).toBe(true);
    const r = await pending;
    expect(r.finishReason).toBe("abort");
    expect(r.tokenIds.length).toBeGreaterThan(0);
    expect(r.tokenIds.length).toBeLessThan(2000);
    expect(r.logProbs.length).toBe(r.tokenIds.length);
    // Only the named request was aborted (never abort_all: the fake refuses it with a 400).
    expect((await other).finishReason).not.toBe("abort");
    expect((await fakeStats(f.url)).abortRequests).toBeGreaterThanOrEqual(1);
  });

  it("a burst of aborts shares a few connections to the server instead of opening one each", async () => {
    const f = await fake(["--token-delay-ms", "5", "--stop-prob", "0.000001"]);
    const p = pool([f.url]);
    await p.awaitReady(10_000);
    const ids = Array.from({ length: 40 }, (_, i) => `burst-${i}`);
    const pending = ids.map((id) => p.generate(request(id, { maxNewTokens: 2000 })));
    await waitFor("every request generating", async () => (await fakeStats(f.url)).live === ids.length);
    const before = (await fakeStats(f.url)).connections;
    await p.abort(ids);
    for (const r of await Promise.all(pending)) expect(r.finishReason).toBe("abort");
    const s = await fakeStats(f.url);
    expect(s.abortRequests).toBeGreaterThanOrEqual(ids.length);
    // Each request in flight holds its own connection; the 40 aborts went over at most
    // CONTROL_SOCKETS_PER_SERVER more (one connection each, before: 40 more).
    expect(s.connections - before).toBeLessThanOrEqual(CONTROL_SOCKETS_PER_SERVER + 1); // + 1: this /stats call
  });

  it("an abort that arrives before the server has the request still takes effect", async () => {
    const f = await fake(["--token-delay-ms", "5", "--stop-prob", "0.000001"]);
    const p = pool([f.url]);
    await p.awaitReady(10_000);
    const pending = p.generate(request("early-1", { maxNewTokens: 2000 }));
    await p.abort(["early-1"]);
    const r = await pending;
    expect(r.finishReason).toBe("abort");
    expect(r.tokenIds.length).toBeLessThan(2000);
  });

  it("5xx: the request is retried, on another engine when there is one", async () => {
    const bad = await fake();
    const good = await fake();
    const p = pool([bad.url, good.url]);
    await p.awaitReady(10_000);
    await setFault(bad.url, { mode: "5xx" });
    const results = await Promise.all(Array.from({ length: 6 }, (_, i) => p.generate(request(`x5-${i}`))));
    for (const r of results) expect(r.engineId).toBe(good.url);
    const snap = p.snapshot().engines.find((e) => e.engineId === bad.url);
    expect(snap?.errors).toBeGreaterThan(0);
    expect(snap?.lastError).toMatch(/HTTP 503/);

    // A lone engine failing twice: the third attempt succeeds.
    const lone = await fake();
    const q = pool([lone.url]);
    await q.awaitReady(10_000);
    await setFault(lone.url, { mode: "5xx", count: 2 });
    const r = await q.generate(request("x5-lone"));
    expect(r.finishReason).not.toBe("abort");
    expect((await fakeStats(lone.url)).failed5xx).toBe(2);
  });

  it("a server that hangs past the timeout: tokens so far come back as an aborted partial, and the engine leaves the rotation", async () => {
    const f = await fake(["--token-delay-ms", "2", "--stop-prob", "0.000001"]);
    const p = pool([f.url], {}, 1_500);
    await p.awaitReady(10_000);
    await setFault(f.url, { mode: "hang", afterTokens: 5 });
    const r = await p.generate(request("hang-1", { maxNewTokens: 100 }));
    expect(r.finishReason).toBe("abort");
    expect(r.tokenIds.length).toBe(5);
    await waitFor("engine declared dead", () => p.engineStates()[f.url] === "dead");
    await setFault(f.url, { mode: "none" });
    await waitFor("engine re-admitted", () => p.engineStates()[f.url] === "healthy");
  });

  it("a request past its timeout with the health monitor silent: the tokens so far come back as an aborted partial", async () => {
    const f = await fake(["--token-delay-ms", "2", "--stop-prob", "0.000001"]);
    const p = pool([f.url], { healthIntervalMs: 60_000 }, 1_000);
    await p.awaitReady(10_000);
    await setFault(f.url, { mode: "hang", afterTokens: 4 });
    const r = await p.generate(request("timeout-1", { maxNewTokens: 100 }));
    expect(r).toMatchObject({ finishReason: "abort" });
    expect(r.tokenIds.length).toBe(4);
    expect(p.snapshot().engines[0]?.lastError).toMatch(/no answer in time/);
  });

  it("a server-side abort mid-generation comes back as an aborted partial", async () => {
    const f = await fake(["--stop-prob", "0.000001"]);
    const p = pool([f.url]);
    await p.awaitReady(10_000);
    await setFault(f.url, { mode: "abort_mid", afterTokens: 7 });
    const r = await p.generate(request("mid-1", { maxNewTokens: 50 }));
    expect(r).toMatchObject({ finishReason: "abort", weightVersion: 0 });
    expect(r.tokenIds.length).toBe(7);
  });

  it("a stale engine is not routed to until it reports the current version", async () => {
    const a = await fake(["--weight-version", "2"]);
    const stale = await fake(["--weight-version", "2", "--fault", "stale_version", "--fault-version", "1"]);
    const p = pool([a.url, stale.url]);
    await p.awaitReady(10_000);
    await p.checkHealth();
    expect(p.engineStates()).toEqual({ [a.url]: "healthy", [stale.url]: "stale" });
    const rs = await Promise.all(Array.from({ length: 8 }, (_, i) => p.generate(request(`st-${i}`))));
    for (const r of rs) expect(r).toMatchObject({ engineId: a.url, weightVersion: 2 });

    // disk sync to version 3: the stale engine "loads" but keeps reporting 1, so it leaves the rotation.
    await p.loadWeights(3, "file:///tmp/rlq-ckpt/step-2");
    expect(p.currentVersion()).toBe(3);
    expect(p.engineStates()[stale.url]).toBe("dead");
    expect((await p.generate(request("st-after"))).weightVersion).toBe(3);
    // Fixed: it reports 3 (the load did land) and is re-admitted.
    await setFault(stale.url, { mode: "none" });
    await waitFor("stale engine re-admitted", () => p.engineStates()[stale.url] === "healthy");
    expect(p.snapshot().engines.map((e) => e.weightVersion)).toEqual([3, 3]);
  });

  it("refuses a server whose log-probs are not temperature-scaled, or are truncated, when the sampling needs it", async () => {
    const original = await fake(["--logprob-mode", "original"]);
    const p = pool([original.url]);
    await p.awaitReady(10_000);
    await expect(p.generate(request("lp-1", { temperature: 0.7 }))).rejects.toMatchObject({ code: "engine_logprobs_unscaled", isRetriable: false });
    // At T = 1 unscaled and scaled are the same distribution.
    expect((await p.generate(request("lp-2", { temperature: 1, topP: 0.9 }))).finishReason).not.toBe("abort");

    const truncated = await fake(["--logprob-mode", "truncated"]);
    const q = pool([truncated.url]);
    await q.awaitReady(10_000);
    await expect(q.generate(request("lp-3", { topP: 0.9 }))).rejects.toBeInstanceOf(RlqError);
    await expect(q.generate(request("lp-4", { topK: 20 }))).rejects.toMatchObject({ code: "engine_logprobs_truncated" });
    expect((await q.generate(request("lp-5", { temperature: 0.6 }))).tokenIds.length).toBeGreaterThan(0);
  });

  it("finds the workers behind an SGLang router and routes to them directly", async () => {
    const a = await fake();
    const b = await fake();
    const router = await startFake("sglang-router", ["--workers", `${a.url},127.0.0.1:${b.port}`]);
    h.track(router);
    const p = await createEnginesFromConfig(
      sglangEngineConfigSchema.parse({ kind: "sglang", router_url: router.url }),
      engineRuntimeDefaults({ rollout_health_check_interval: 0.2, rollout_health_check_timeout: 2.5 }),
    );
    h.trackPool(p);
    await p.awaitReady(10_000);
    await p.checkHealth();
    const rs = await Promise.all(Array.from({ length: 10 }, (_, i) => p.generate(request(`rt-${i}`, { seed: i }))));
    expect(new Set(rs.map((r) => r.engineId))).toEqual(new Set([a.url, b.url]));
    expect(
      p
        .snapshot()
        .engines.map((e) => e.engineId)
        .sort(),
    ).toEqual([a.url, b.url].sort());
  });

  it("weights pushed under a streaming request: the segment ends at the last token of the old version", async () => {
    const f = await fake(["--token-delay-ms", "4", "--stop-prob", "0.000001"]);
    const e = createSglangServer({ url: f.url, requestTimeoutMs: 10_000, isStreaming: true });
    const pending = e.generate(request("push-mid", { maxNewTokens: 500, stopTokenIds: [], seed: 9 }));
    await waitFor("tokens flowing", async () => (await fakeStats(f.url)).live === 1 && (await fakeStats(f.url)).tokensGenerated >= 10);
    await pushInPlace(f.url, 5);
    const r = await pending;
    expect(r).toMatchObject({ finishReason: "abort", weightVersion: 0 });
    expect(r.tokenIds.length).toBeGreaterThan(0);
    // Every kept token is version 0's: compare with a fresh version-0 server.
    const g = await fake(["--stop-prob", "0.000001"]);
    const full = await createSglangServer({ url: g.url, requestTimeoutMs: 10_000 }).generate(
      request("push-ref", { maxNewTokens: r.tokenIds.length, stopTokenIds: [], seed: 9 }),
    );
    expect(full.tokenIds).toEqual(r.tokenIds);
  });

  it("disk weight sync: every engine loads the checkpoint with its version and reports it", async () => {
    const a = await fake();
    const b = await fake();
    const p = pool([a.url, b.url]);
    await p.awaitReady(10_000);
    await p.loadWeights(1, "file:///tmp/rlq-ckpt/step-0");
    expect((await fakeStats(a.url)).weightVersion).toBe(1);
    expect((await fakeStats(b.url)).weightVersion).toBe(1);
    const r = await p.generate(request("ws-1"));
    expect(r.weightVersion).toBe(1);
    await expect(p.loadWeights(2, "file:///tmp/missing")).rejects.toMatchObject({ code: "engine_load_failed" });
  });
});

describe("SGLang adapter without streaming, engine.batch_group: one batch /generate per group and event-loop turn", () => {
  function batchedPool(url: string): EnginePool {
    const p = createEnginePool({
      members: [createSglangServer({ url, requestTimeoutMs: 10_000, isStreaming: false, isBatchingGroups: true })],
      healthIntervalMs: 200,
      warmupGraceMs: 0,
    });
    h.trackPool(p);
    return p;
  }

  it("sends a group's requests as one batch, each answered exactly as if it had been sent alone", async () => {
    const f = await fake(["--stop-prob", "0.2", "--weight-version", "3"]);
    const p = batchedPool(f.url);
    await p.awaitReady(10_000);
    const before = (await fakeStats(f.url)).generate; // the log-prob probe's requests
    const asked = Array.from({ length: 8 }, (_, i) => request(`b-${i}`, { maxNewTokens: 16 + i, seed: 100 + i }));
    const batched = await Promise.all(asked.map((r) => p.generate(r)));
    const stats = await fakeStats(f.url);
    expect(stats.batches).toBe(1);
    expect(stats.generate - before).toBe(8);
    const alone = createSglangServer({ url: f.url, requestTimeoutMs: 10_000 });
    for (const [i, r] of asked.entries()) {
      expect(batched[i]).toEqual(await alone.generate({ ...r, requestId: `alone-${i}` }));
      expect(batched[i]?.weightVersion).toBe(3);
    }
    // A lone request keeps the single form.
    await p.generate(request("b-lone"));
    expect((await fakeStats(f.url)).batches).toBe(1);
  });

  it("aborts one request of a batch by its id: it returns with its tokens, the others finish", async () => {
    const f = await fake(["--token-delay-ms", "5", "--stop-prob", "0.000001"]);
    const p = batchedPool(f.url);
    await p.awaitReady(10_000);
    const long = p.generate(request("ba-0", { maxNewTokens: 2000 }));
    const short = [1, 2].map((i) => p.generate(request(`ba-${i}`, { maxNewTokens: 30 })));
    await waitFor("tokens flowing", async () => (await fakeStats(f.url)).live === 3);
    await waitFor("short ones done", async () => (await fakeStats(f.url)).live === 1, 10_000);
    await p.abort(["ba-0"]);
    const r = await long;
    expect(r.finishReason).toBe("abort");
    expect(r.tokenIds.length).toBeGreaterThan(0);
    expect(r.tokenIds.length).toBeLessThan(2000);
    for (const s of await Promise.all(short)) expect(s).toMatchObject({ finishReason: "length" });
    expect((await fakeStats(f.url)).batches).toBe(1);
  });

  it("a failed batch: every request of it is retried", async () => {
    const f = await fake();
    const p = batchedPool(f.url);
    await p.awaitReady(10_000);
    const before = (await fakeStats(f.url)).generate;
    await setFault(f.url, { mode: "5xx", count: 1 });
    const results = await Promise.all(Array.from({ length: 4 }, (_, i) => p.generate(request(`bf-${i}`))));
    for (const r of results) expect(r.finishReason).not.toBe("abort");
    const stats = await fakeStats(f.url);
    expect(stats.failed5xx).toBe(1);
    expect(stats.generate - before).toBe(4);
    // One failed batch is one failure of the engine, not one per request: it stays in the rotation.
    expect(p.engineStates()[f.url]).toBe("healthy");
    expect(p.snapshot().engines[0]?.deaths).toBe(0);
  });
});
