import { afterAll, afterEach, expect } from "vitest";
import type { GenerateResult } from "../../src/engines/engine.ts";
import { createEnginePool, type EnginePool } from "../../src/engines/pool.ts";
import { createSglangServer } from "../../src/engines/sglang.ts";
import { request, startFake, type FakeServer } from "../fakes/fake-engine-control.ts";

type PoolOptions = Parameters<typeof createEnginePool>[0];

/**
 * The engine tests' scaffolding: fake engine processes and pools made by a
 * test file are tracked and torn down by vitest hooks (pools after each test,
 * processes after the file). Call it at the top level of a test file.
 */
export function engineHarness(kind: "sglang" | "vllm") {
  const started: FakeServer[] = [];
  const pools: EnginePool[] = [];
  afterEach(async () => {
    await Promise.all(pools.splice(0).map((p) => p.close()));
  });
  afterAll(() => {
    for (const f of started) f.kill("SIGKILL");
  });
  return {
    /** A fake engine process of this kind, killed after the file. */
    async fake(args: string[] = []): Promise<FakeServer> {
      return this.track(await startFake(kind, args));
    },
    /** Kill this process after the file too (a restarted fake, a router). */
    track<T extends FakeServer>(f: T): T {
      started.push(f);
      return f;
    },
    /** Close this pool after the test. */
    trackPool(p: EnginePool): EnginePool {
      pools.push(p);
      return p;
    },
    /**
     * A pool with frequent health checks (overridable), closed after the test. The timeout is over
     * the second SGLang's /health_generate always takes (http_server.py polls once a second).
     */
    pool(members: PoolOptions["members"], options: Partial<PoolOptions> = {}): EnginePool {
      return this.trackPool(createEnginePool({ members, healthIntervalMs: 200, healthTimeoutMs: 2_500, warmupGraceMs: 0, noEngineWaitMs: 5_000, ...options }));
    },
  };
}

/**
 * An answer of `length` tokens (seed `seed`, no stop) that ran across an in-place load of `pushed`
 * on a fake SGLang from version 0: it ran to its length, in two spans cut after at least `minCut`
 * tokens, and its version-0 tokens are what `reference` (a fake that never loaded) gives the same seed.
 */
export async function expectKeptAcrossLoad(
  r: GenerateResult,
  o: { length: number; pushed: number; seed: number; minCut: number; reference: FakeServer },
): Promise<void> {
  expect(r).toMatchObject({ finishReason: "length", weightVersion: 0 });
  expect(r.tokenIds.length).toBe(o.length);
  const cut = r.versionSpans?.[0]?.end as number;
  expect(r.versionSpans).toEqual([
    { version: 0, start: 0, end: cut },
    { version: o.pushed, start: cut, end: o.length },
  ]);
  expect(cut).toBeGreaterThanOrEqual(o.minCut);
  const ref = await createSglangServer({ url: o.reference.url, requestTimeoutMs: 10_000 }).generate(
    request("kept-across-load-ref", { maxNewTokens: cut, stopTokenIds: [], seed: o.seed }),
  );
  expect(ref.tokenIds).toEqual(r.tokenIds.slice(0, cut));
}
