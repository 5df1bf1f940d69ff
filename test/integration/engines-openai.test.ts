import { describe, expect, it } from "vitest";
import { engineHarness } from "../helpers/engine-harness.ts";
import { createOpenAiCompatEngine } from "../../src/engines/openai-compat.ts";
import type { EnginePool } from "../../src/engines/pool.ts";
import { createWeightSync } from "../../src/engines/weight-sync.ts";
import { request, setFault } from "../fakes/fake-engine-control.ts";
import { waitFor } from "../helpers/processes.ts";

/**
 * The OpenAI-compatible adapter (vLLM) against the fake vLLM server as a separate process: the
 * faults a real server cannot show on cue (dying mid-stream, an error inside a stream, slow
 * tokens) and the pool's handling of them. What the real vLLM server answers, and that the fake
 * answers alike, is checked by test/integration/real-vllm.test.ts.
 */
const h = engineHarness("vllm");
const fake = (args: string[] = []) => h.fake(args);
/** The fake's requests in flight and the fewest tokens any of them has streamed (Infinity when none). */
async function vllmStats(url: string): Promise<{ live: number; liveMinTokens: number }> {
  const s = (await (await fetch(`${url}/stats`)).json()) as { live: number; liveMinTokens: number | null };
  return { live: s.live, liveMinTokens: s.liveMinTokens ?? Infinity };
}
function pool(urls: string[], logprobsMode: "raw_logprobs" | "processed_logprobs" = "raw_logprobs"): EnginePool {
  return h.pool(urls.map((url) => createOpenAiCompatEngine({ url, model: "fake/model", requestTimeoutMs: 10_000, logprobsMode })));
}

describe("OpenAI-compatible adapter (vLLM)", () => {
  it("generates from token ids with log-probs and token ids, mapping stop and length", async () => {
    const f = await fake(["--stop-prob", "0.2"]);
    const legacy = await fake(["--stop-prob", "0.2", "--legacy-token-strings"]);
    const e = createOpenAiCompatEngine({ url: `${f.url}/v1`, model: "fake/model", requestTimeoutMs: 10_000 });
    const old = createOpenAiCompatEngine({ url: legacy.url, model: "fake/model", requestTimeoutMs: 10_000 });
    const a = await e.generate(request("o-1", { maxNewTokens: 64, seed: 3 }));
    const b = await old.generate(request("o-2", { maxNewTokens: 64, seed: 3 }));
    expect(a.tokenIds).toEqual(b.tokenIds);
    expect(a.finishReason).toBe("stop");
    expect(a.tokenIds.at(-1)).toBe(257);
    expect(a.logProbs.length).toBe(a.tokenIds.length);
    const c = await e.generate(request("o-3", { maxNewTokens: 2, stopTokenIds: [], seed: 5 }));
    expect(c.tokenIds.length).toBeLessThanOrEqual(2);
    await expect(createOpenAiCompatEngine({ url: f.url, model: "other", requestTimeoutMs: 1000 }).checkServer()).rejects.toMatchObject({
      code: "engine_model_missing",
    });
  });

  it("--api-key: the key goes on every /v1 call; without it the server answers 401 and the error names engine.api_key", async () => {
    const f = await fake(["--api-key", "vk-1"]);
    const keyed = h.pool([createOpenAiCompatEngine({ url: f.url, model: "fake/model", requestTimeoutMs: 10_000, apiKey: "vk-1" })]);
    await keyed.awaitReady(10_000);
    expect((await keyed.generate(request("k-1"))).tokenIds.length).toBeGreaterThan(0);
    await expect(createOpenAiCompatEngine({ url: f.url, model: "fake/model", requestTimeoutMs: 10_000 }).generate(request("k-2"))).rejects.toThrow(
      /wants an API key .*engine\.api_key/,
    );
  });

  it("raw_logprobs are refused unless T = 1; processed_logprobs unless top-p/top-k are off", async () => {
    const raw = await fake();
    const p = pool([raw.url], "raw_logprobs");
    await p.awaitReady(10_000);
    await expect(p.generate(request("r-1", { temperature: 0.8 }))).rejects.toMatchObject({ code: "engine_logprobs_unscaled" });
    expect((await p.generate(request("r-2", { temperature: 1, topP: 0.9 }))).tokenIds.length).toBeGreaterThan(0);

    const processed = await fake(["--logprobs-mode", "processed_logprobs"]);
    const q = pool([processed.url], "processed_logprobs");
    await q.awaitReady(10_000);
    await expect(q.generate(request("p-1", { topP: 0.9 }))).rejects.toMatchObject({ code: "engine_logprobs_truncated" });
    expect((await q.generate(request("p-2", { temperature: 0.7 }))).tokenIds.length).toBeGreaterThan(0);
  });

  it("abort closes the connection and keeps the streamed tokens; a dead server's requests come back as partials", async () => {
    const f = await fake(["--token-delay-ms", "5", "--stop-prob", "0.000001"]);
    const g = await fake(["--token-delay-ms", "5", "--stop-prob", "0.000001"]);
    const p = pool([f.url, g.url]);
    await p.awaitReady(10_000);
    await p.checkHealth();
    const pending = p.generate(request("v-ab", { maxNewTokens: 1000 }));
    await waitFor("tokens streaming", async () => {
      const [a, b] = [await vllmStats(f.url), await vllmStats(g.url)];
      return a.live + b.live === 1 && Math.min(a.liveMinTokens, b.liveMinTokens) >= 10;
    });
    await p.abort(["v-ab"]);
    const r = await pending;
    expect(r.finishReason).toBe("abort");
    expect(r.tokenIds.length).toBeGreaterThan(0);
    expect(r.tokenIds.length).toBeLessThan(1000);

    const many = Array.from({ length: 6 }, (_, i) => p.generate(request(`v-k${i}`, { maxNewTokens: 300, seed: i })));
    await waitFor("all six streaming", async () => {
      const [a, b] = [await vllmStats(f.url), await vllmStats(g.url)];
      return a.live + b.live === 6 && Math.min(a.liveMinTokens, b.liveMinTokens) >= 5;
    });
    f.kill("SIGKILL");
    const done = await Promise.all(many);
    const partials = done.filter((x) => x.engineId === f.url);
    expect(partials.length).toBeGreaterThan(0);
    for (const x of partials) expect(x).toMatchObject({ finishReason: "abort" });
    for (const x of partials) expect(x.tokenIds.length).toBeGreaterThan(0);
    await waitFor("dead", () => p.engineStates()[f.url] === "dead");
  });

  it("an error event inside the stream (vLLM's finish_reason error, sent as a 500 in the HTTP 200 stream) is a retryable server error: tokens so far kept, else retried", async () => {
    // v1/engine/__init__.py FinishReason.ERROR: "retryable request-level internal error ... always
    // converted to 500" (generate/base/serving.py _raise_if_error); the request is not at fault.
    const f = await fake(["--stop-prob", "0.000001"]);
    await setFault(f.url, { mode: "stream_error", afterTokens: 3 });
    const e = createOpenAiCompatEngine({ url: f.url, model: "fake/model", requestTimeoutMs: 10_000 });
    await expect(e.generate(request("se-1", { maxNewTokens: 50 }))).rejects.toMatchObject({
      code: "engine_http_error",
      isRetriable: true,
      status: 500,
      message: expect.stringMatching(/status 500: Internal server error/),
    });
    // Through the pool: the 2 tokens streamed before the error come back as a resumable partial.
    const p = pool([f.url]);
    await p.awaitReady(10_000);
    const r = await p.generate(request("se-2", { maxNewTokens: 50, seed: 4 }));
    expect(r.finishReason).toBe("abort");
    expect(r.tokenIds.length).toBe(2);
    expect(p.snapshot().engines[0]).toMatchObject({ requestErrors: 0 });
  });

  it("versions are fenced by rlq: trainer_push records the reported version", async () => {
    const f = await fake();
    const p = pool([f.url]);
    await p.awaitReady(10_000);
    expect((await p.generate(request("f-0"))).weightVersion).toBe(0);
    await expect(p.loadWeights(1, "file:///x")).resolves.toBeUndefined(); // nothing loadable: the engine is left stale
    expect(p.engineStates()[f.url]).toBe("stale");
    const sync = createWeightSync(p, { mode: "trainer_push", pushTimeoutMs: 5_000 });
    const report = await sync.sync(1, null);
    expect(report.engines).toEqual([f.url]);
    expect((await p.generate(request("f-1"))).weightVersion).toBe(1);
  });
});
