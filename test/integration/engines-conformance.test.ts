import { describe, expect, it } from "vitest";
import { engineHarness, expectKeptAcrossLoad } from "../helpers/engine-harness.ts";
import { createSglangServer } from "../../src/engines/sglang.ts";
import { createEnginePool, type EnginePool, type PoolLog } from "../../src/engines/pool.ts";
import { createEnginesFromConfig } from "../../src/engines/from-config.ts";
import { listRouterWorkers } from "../../src/engines/sglang-router.ts";
import { engineRuntimeDefaults, openAiEngineConfigSchema, sglangEngineConfigSchema } from "../../src/engines/config-schema.ts";
import { fakeStats, request, setFault, startFake } from "../fakes/fake-engine-control.ts";
import { waitFor } from "../helpers/processes.ts";

/**
 * rlq against a fake SGLang that is as unkind as the real server (issue 15):
 * one test per way a real deployment failed. Each would fail on the engine
 * layer as it was before (noted per test).
 */
const h = engineHarness("sglang");
const fake = (args: string[] = []) => h.fake(args);
type PoolOptions = Partial<Parameters<typeof createEnginePool>[0]>;
function pool(
  urls: string[],
  options: { isStreaming?: boolean; isBatchingGroups?: boolean; apiKey?: string; requestTimeoutMs?: number } & PoolOptions = {},
): EnginePool {
  const { isStreaming, isBatchingGroups, apiKey, requestTimeoutMs, ...extra } = options;
  return h.pool(
    urls.map((url) => createSglangServer({ url, requestTimeoutMs: requestTimeoutMs ?? 10_000, isStreaming, isBatchingGroups, apiKey })),
    { healthTimeoutMs: 2_000, ...extra },
  );
}
const longPrompt = Array.from({ length: 100 }, (_, i) => 65 + (i % 20));

describe("SGLang as it is", () => {
  it("1. the log-prob probe runs on the sampling path: a correct server is accepted at T = 0.7 (the greedy path hides the temperature)", async () => {
    const f = await fake();
    const p = pool([f.url]);
    await p.awaitReady(10_000);
    const r = await p.generate(request("t07", { temperature: 0.7 }));
    expect(r.finishReason).not.toBe("abort");
    // A server that really returns unscaled log-probs is still refused.
    const original = await fake(["--logprob-mode", "original"]);
    const q = pool([original.url]);
    await q.awaitReady(10_000);
    await expect(q.generate(request("t07-orig", { temperature: 0.7 }))).rejects.toMatchObject({ code: "engine_logprobs_unscaled" });
    // And one that truncates is refused with top-k on (the third probe).
    const truncated = await fake(["--logprob-mode", "truncated"]);
    const t = pool([truncated.url]);
    await t.awaitReady(10_000);
    await expect(t.generate(request("t-trunc", { topK: 20 }))).rejects.toMatchObject({ code: "engine_logprobs_truncated" });
  });

  for (const isStreaming of [true, false]) {
    it(`2. a prompt over the context length fails that request only, once, and never the engines (${isStreaming ? "streamed: an error event in a 200" : "not streamed: HTTP 400"})`, async () => {
      const a = await fake(["--context-length", "64"]);
      const b = await fake(["--context-length", "64"]);
      const p = pool([a.url, b.url], { isStreaming });
      await p.awaitReady(10_000);
      await p.checkHealth();
      await expect(p.generate(request("too-long", { inputIds: longPrompt }))).rejects.toMatchObject({
        code: "engine_request_rejected",
        isRetriable: false,
        message: expect.stringMatching(/longer than the model's context length/),
      });
      const refused = (await fakeStats(a.url)).refused + (await fakeStats(b.url)).refused;
      expect(refused).toBe(1);
      for (const e of p.snapshot().engines) expect(e).toMatchObject({ state: "healthy", errors: 0, deaths: 0 });
      expect(p.snapshot().engines.reduce((n, e) => n + e.requestErrors, 0)).toBe(1);
      // The engines still serve everyone else.
      expect((await p.generate(request("fine"))).finishReason).not.toBe("abort");
    });
  }

  it("3. --api-key: the key goes on every call; without it the error says what to configure; the key never reaches a log", async () => {
    const key = "sk-test-0123456789abcdef";
    const f = await fake(["--api-key", key]);
    const lines: string[] = [];
    const log: PoolLog = { info: (o, m) => lines.push(JSON.stringify(o) + m), warn: (o, m) => lines.push(JSON.stringify(o) + m) };
    const p = await createEnginesFromConfig(
      sglangEngineConfigSchema.parse({ kind: "sglang", urls: [f.url], api_key: { env: "RLQ_TEST_SGLANG_KEY" } }),
      engineRuntimeDefaults({ rollout_health_check_interval: 0.2, rollout_health_check_timeout: 2 }),
      { log, envSource: { RLQ_TEST_SGLANG_KEY: key } },
    );
    h.trackPool(p);
    await p.awaitReady(10_000);
    expect((await p.generate(request("keyed"))).finishReason).not.toBe("abort");
    expect((await fakeStats(f.url)).unauthorized).toBe(0);

    const noKey = pool([f.url], { log });
    await expect(noKey.awaitReady(1_500)).rejects.toThrow(/wants an API key .*engine\.api_key/);
    expect(lines.join("\n")).not.toContain(key);
    // A missing variable names itself, not a value.
    await expect(
      createEnginesFromConfig(
        sglangEngineConfigSchema.parse({ kind: "sglang", urls: [f.url], api_key: { env: "RLQ_TEST_UNSET_KEY" } }),
        engineRuntimeDefaults({}),
        { envSource: {} },
      ),
    ).rejects.toThrow(/engine\.api_key: environment variable RLQ_TEST_UNSET_KEY is not set/);
  });

  it("4. a weight load blocks /health_generate then answers 503: a pool in another process reads it as busy, not dead", async () => {
    const f = await fake(["--load-delay-ms", "2500", "--health-block-ms", "300"]);
    const loader = pool([f.url], { healthIntervalMs: 60_000 });
    const observer = pool([f.url], { healthIntervalMs: 100 });
    await loader.awaitReady(10_000);
    await observer.awaitReady(10_000);
    await loader.loadWeights(1, "file:///tmp/rlq-ckpt/step-0");
    await waitFor("the observer to see version 1", async () => {
      await observer.checkHealth();
      return observer.snapshot().engines[0]?.weightVersion === 1;
    });
    const seen = observer.snapshot().engines[0];
    expect(seen).toMatchObject({ state: "healthy", deaths: 0 });
    expect(seen?.busyChecks).toBeGreaterThan(0);
    expect((await fakeStats(f.url)).healthBusy).toBeGreaterThan(0);
    // A failed load is HTTP 400 {success: false}: reported as a failed load.
    await expect(loader.loadWeights(2, "file:///tmp/missing")).rejects.toMatchObject({ code: "engine_load_failed" });
  });

  it("5. the default is linear in the length: no cumulative stream; --incremental-streaming-output deltas are read as deltas", async () => {
    const n = 2000;
    const f = await fake(["--stop-prob", "0"]);
    const p = await createEnginesFromConfig(
      sglangEngineConfigSchema.parse({ kind: "sglang", urls: [f.url] }),
      engineRuntimeDefaults({ rollout_health_check_timeout: 2 }),
    );
    h.trackPool(p);
    await p.awaitReady(10_000);
    const before = (await fakeStats(f.url)).bytesSent;
    const r = await p.generate(request("long", { maxNewTokens: n, stopTokenIds: [] }));
    expect(r.tokenIds.length).toBe(n);
    const bytes = (await fakeStats(f.url)).bytesSent - before;
    // ~40 bytes a token once; a cumulative stream would send ~n/2 times that.
    expect(bytes).toBeLessThan(n * 100);

    const inc = await fake(["--stop-prob", "0", "--incremental-streaming-output"]);
    const streamed = createSglangServer({ url: inc.url, requestTimeoutMs: 10_000, isStreaming: true });
    const whole = createSglangServer({ url: inc.url, requestTimeoutMs: 10_000, isStreaming: false });
    const before2 = (await fakeStats(inc.url)).bytesSent;
    const s = await streamed.generate(request("inc-s", { maxNewTokens: n, stopTokenIds: [] }));
    expect((await fakeStats(inc.url)).bytesSent - before2).toBeLessThan(n * 250);
    expect(s).toEqual(await whole.generate(request("inc-w", { maxNewTokens: n, stopTokenIds: [] })));
  });

  it("6. a scheduler abort carrying status_code is an error, never a resumable partial: 400 fails the request, 500/503 are server failures", async () => {
    // tokenizer_manager.py _wait_one_response: status 400 is raised as a ValueError (HTTP 400 / an
    // SSE error event), 500 and 503 as an HTTPException (HTTP 500/503; a stream is cut without [DONE]).
    const f = await fake(["--stop-prob", "0"]);
    const p = pool([f.url], { isStreaming: false });
    const s = pool([f.url], { isStreaming: true });
    await p.awaitReady(10_000);
    await s.awaitReady(10_000);
    await setFault(f.url, { mode: "error_abort", afterTokens: 5, statusCode: 400 });
    for (const [q, id] of [
      [p, "ea-400"],
      [s, "ea-400-s"],
    ] as const) {
      await expect(q.generate(request(id, { maxNewTokens: 50 }))).rejects.toMatchObject({
        code: "engine_request_rejected",
        isRetriable: false,
        message: expect.stringMatching(/injected server-side error 400/),
      });
    }
    for (const q of [p, s]) expect(q.snapshot().engines[0]).toMatchObject({ errors: 0, requestErrors: 1, state: "healthy" });
    await setFault(f.url, { mode: "error_abort", afterTokens: 5, statusCode: 503 });
    await expect(p.generate(request("ea-503", { maxNewTokens: 50 }))).rejects.toMatchObject({ code: "engine_request_failed", isRetriable: true });
    // Streamed, the cut stream keeps the tokens it got as an aborted partial: the rollout resubmits
    // it, and a sample that never finishes fails after MAX_ROUNDS_PER_GROUP rounds (engines-rounds-cap.test.ts).
    const cut = await s.generate(request("ea-503-s", { maxNewTokens: 50 })).catch((e: unknown) => e);
    if (cut instanceof Error) expect(cut).toMatchObject({ isRetriable: true });
    else expect(cut).toMatchObject({ finishReason: "abort" });
    await setFault(f.url, { mode: "none" });
    expect((await p.generate(request("ea-ok", { maxNewTokens: 50 }))).finishReason).toBe("length");
  });

  it.each([
    ["whole", false],
    ["streamed", true],
  ])(
    "7. weight_versions spans: an answer (%s) that outlived a push (generation paused in place) keeps every token, each labelled with its version by the spans",
    async (_, isStreaming) => {
      const f = await fake(["--token-delay-ms", "4", "--stop-prob", "0", "--weight-versions-spans"]);
      const e = createSglangServer({ url: f.url, requestTimeoutMs: 10_000, isStreaming });
      const post = (path: string, body: unknown) =>
        fetch(`${f.url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
      const pending = e.generate(request("span", { maxNewTokens: 300, stopTokenIds: [], seed: 9 }));
      await waitFor("tokens flowing", async () => (await fakeStats(f.url)).live === 1 && (await fakeStats(f.url)).tokensGenerated >= 10);
      // Unpaused, a push waits for in-flight requests (tokenizer_communicator_mixin.py: the writer
      // lock), so no answer spans it; paused in place, it applies at once.
      expect((await post("/pause_generation", { mode: "in_place" })).status).toBe(200);
      expect((await post("/flush_cache", {})).status).toBe(400); // a request is still running
      await post("/init_weights_update_group", { master_address: "127.0.0.1", master_port: 1, rank_offset: 1, world_size: 2, group_name: "g" });
      const pushed = await post("/update_weights_from_distributed", { names: [], dtypes: [], shapes: [], group_name: "g", weight_version: "5" });
      expect(pushed.status).toBe(200);
      await post("/continue_generation", {});
      // The tokens before the cut are the old version's: the same as a server that never loaded.
      await expectKeptAcrossLoad(await pending, { length: 300, pushed: 5, seed: 9, minCut: 10, reference: await fake(["--stop-prob", "0"]) });
    },
  );

  it("8. the version is read from /model_info where /get_weight_version is gone", async () => {
    const f = await fake(["--weight-version", "3"]);
    const p = pool([f.url]);
    await p.awaitReady(10_000);
    expect(await p.weightVersion()).toBe(3);
    expect((await p.generate(request("mi"))).weightVersion).toBe(3);
  });

  it("9. a batch with one invalid item is resent item by item: only that item fails", async () => {
    const f = await fake(["--context-length", "64"]);
    const p = pool([f.url], { isStreaming: false, isBatchingGroups: true });
    await p.awaitReady(10_000);
    const refusedBefore = (await fakeStats(f.url)).refused;
    const results = await Promise.allSettled([0, 1, 2, 3].map((i) => p.generate(request(`bi-${i}`, i === 2 ? { inputIds: longPrompt } : {}))));
    expect(results.map((x) => x.status)).toEqual(["fulfilled", "fulfilled", "rejected", "fulfilled"]);
    expect((results[2] as PromiseRejectedResult).reason).toMatchObject({ code: "engine_request_rejected" });
    expect(p.snapshot().engines[0]).toMatchObject({ state: "healthy", errors: 0 });
    // The batch went out and was refused whole, then the bad item alone: two refusals.
    expect((await fakeStats(f.url)).refused - refusedBefore).toBe(2);
  });

  it("9b. by default (as slime) each sample is its own /generate: a bad one fails alone, no batch is sent", async () => {
    const f = await fake(["--context-length", "64"]);
    const p = pool([f.url], { isStreaming: false });
    await p.awaitReady(10_000);
    const before = await fakeStats(f.url);
    const results = await Promise.allSettled([0, 1, 2, 3].map((i) => p.generate(request(`bs-${i}`, i === 2 ? { inputIds: longPrompt } : {}))));
    expect(results.map((x) => x.status)).toEqual(["fulfilled", "fulfilled", "rejected", "fulfilled"]);
    const after = await fakeStats(f.url);
    expect(after.batches - before.batches).toBe(0);
    expect(after.refused - before.refused).toBe(1);
  });

  it("10. seeds: masked to 31 bits; whether the server honours them is read from /server_info and shown", async () => {
    const off = await fake(["--nondeterministic"]);
    const on = await fake();
    const p = pool([off.url]);
    const q = pool([on.url]);
    await p.awaitReady(10_000);
    await q.awaitReady(10_000);
    expect(p.snapshot().engines[0]?.seedHonoured).toBe(false);
    expect(q.snapshot().engines[0]?.seedHonoured).toBe(true);
    const big = 0xfffffff0;
    const a = await q.generate(request("seed-a", { seed: big }));
    const b = await q.generate(request("seed-b", { seed: big }));
    expect(a.tokenIds).toEqual(b.tokenIds);
    const seen = (await fakeStats(on.url)).seedsSeen;
    expect(seen.at(-1)).toBe(big % 2 ** 31);
    expect(Math.max(...seen)).toBeLessThan(2 ** 31);
  });

  it("11. the router's worker list: @rank stripped and deduplicated, regular workers only, refreshed", async () => {
    const a = await fake();
    const b = await fake();
    const c = await fake();
    const key = "router-key-42";
    const router = h.track(
      await startFake("sglang-router", [
        "--workers",
        a.url,
        "--dp-workers",
        `127.0.0.1:${b.port}`,
        "--prefill-workers",
        "http://127.0.0.1:9",
        "--api-key",
        key,
      ]),
    );
    expect(await listRouterWorkers(router.url, { apiKey: key })).toEqual([a.url, b.url]);
    await expect(listRouterWorkers(router.url)).rejects.toMatchObject({ code: "engine_unauthorized" });
    const p = await createEnginesFromConfig(
      sglangEngineConfigSchema.parse({ kind: "sglang", router_url: router.url, router_api_key: { env: "K" }, router_refresh_s: 0.2 }),
      engineRuntimeDefaults({ rollout_health_check_interval: 0.2, rollout_health_check_timeout: 2 }),
      { envSource: { K: key } },
    );
    h.trackPool(p);
    await p.awaitReady(10_000);
    expect(p.snapshot().engines.map((e) => e.engineId)).toEqual([a.url, b.url]);
    await fetch(`${router.url}/workers`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      body: JSON.stringify({ url: c.url }),
    });
    await waitFor("the new worker in the pool", () => p.engineStates()[c.url] === "healthy", 10_000);
  });

  it("12. a retry on the same engine uses a new rid (the first is still in flight there: SGLang aborts a disconnected request ~2 s late)", async () => {
    const f = await fake(["--token-delay-ms", "2", "--stop-prob", "0"]);
    const p = pool([f.url], { isStreaming: false });
    await p.awaitReady(10_000);
    await setFault(f.url, { mode: "reset", count: 1 });
    const r = await p.generate(request("rid-retry", { maxNewTokens: 20, stopTokenIds: [] }));
    expect(r.tokenIds.length).toBe(20);
    expect((await fakeStats(f.url)).duplicates).toBe(0);
  });

  it("13. vLLM with trainer_push is built: the trainer pushes through vLLM's weight transfer and the adapter reads /weight_info (real-vllm.test.ts)", async () => {
    const p = await createEnginesFromConfig(
      openAiEngineConfigSchema.parse({ kind: "openai", urls: ["http://127.0.0.1:9"], model: "m" }),
      engineRuntimeDefaults({ weight_sync: "trainer_push" }),
    );
    expect(p.snapshot().engines.map((e) => e.engineId)).toEqual(["http://127.0.0.1:9"]);
    await p.close();
  });

  it("a request id already pending (a retried job whose first attempt is still generating): the older request is aborted, the new one runs", async () => {
    const f = await fake(["--token-delay-ms", "3", "--stop-prob", "0"]);
    const p = pool([f.url]);
    await p.awaitReady(10_000);
    const first = p.generate(request("again", { maxNewTokens: 3000, stopTokenIds: [] }));
    await waitFor("the first generating", async () => (await fakeStats(f.url)).live === 1);
    const second = await p.generate(request("again", { maxNewTokens: 10, stopTokenIds: [] }));
    expect(second.tokenIds.length).toBe(10);
    const old = await first;
    expect(old.finishReason).toBe("abort");
    expect(old.tokenIds.length).toBeLessThan(3000);
  });
});
