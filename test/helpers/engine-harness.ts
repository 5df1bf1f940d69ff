import { afterAll, afterEach } from "vitest";
import { createEnginePool, type EnginePool } from "../../src/engines/pool.ts";
import { startFake, type FakeServer } from "../fakes/fake-engine-control.ts";

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
