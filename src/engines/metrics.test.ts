import { describe, expect, it } from "vitest";
import { EngineMetrics, percentile } from "./metrics.ts";

describe("engine metrics", () => {
  it("uses nearest-rank percentiles", () => {
    const xs = Array.from({ length: 100 }, (_, i) => i + 1);
    expect(percentile(xs, 0.5)).toBe(50);
    expect(percentile(xs, 0.95)).toBe(95);
    expect(percentile(xs, 0.99)).toBe(99);
    expect(percentile([], 0.5)).toBeNull();
    expect(percentile([7], 0.99)).toBe(7);
  });

  it("counts outcomes, tokens/s over the window and keeps a bounded latency window", () => {
    const m = new EngineMetrics(4, 10_000);
    for (let i = 0; i < 6; i++) m.started();
    m.finished("completed", 100, 50, 1_000);
    m.finished("completed", 200, 50, 2_000);
    m.finished("aborted", 300, 10, 3_000);
    m.finished("error", 400, 0, 4_000);
    m.finished("completed", 500, 90, 5_000);
    const s = m.snapshot("e", "healthy", 2, 5_000);
    expect(s).toMatchObject({ requests: 6, inFlight: 1, completed: 3, aborted: 1, errors: 1, tokensGenerated: 200 });
    // 200 tokens between t=1 s and t=5 s.
    expect(s.tokensPerSecond).toBeCloseTo(50, 5);
    // The window holds the last 4 latencies: 200, 300, 400, 500.
    expect(s.latencyMs).toEqual({ p50: 300, p95: 500, p99: 500 });
    expect(m.snapshot("e", "healthy", 2, 30_000).tokensPerSecond).toBe(0);
  });
});
