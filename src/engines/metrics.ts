/**
 * Per-engine request metrics, kept by the pool and read as a plain snapshot
 * (the lead stores snapshots and `rlq run status` shows them). Latencies are
 * kept in a bounded window of the most recent requests, so percentiles follow
 * the engine's current behaviour and memory stays constant.
 */
export interface EngineMetricsSnapshot {
  engineId: string;
  state: string;
  weightVersion: number | null;
  /** Requests started (including ones retried elsewhere after failing here). */
  requests: number;
  inFlight: number;
  completed: number;
  /** Requests that came back aborted (asked for, or the engine died mid-request). */
  aborted: number;
  /** Requests that failed here (HTTP error, unreachable, bad answer). */
  errors: number;
  /** Answers whose weight version differed from the pool's current version. */
  versionMismatches: number;
  tokensGenerated: number;
  /** Tokens per second over the last `windowMs` (all requests on this engine together). */
  tokensPerSecond: number;
  /** End-to-end request latency over the last `windowSize` requests, in ms; null before any. */
  latencyMs: { p50: number | null; p95: number | null; p99: number | null };
  /** Times this engine left the rotation (declared dead). */
  deaths: number;
  lastError: string | null;
  /** Requests the server refused for themselves (a prompt over the context length): never the engine's fault. */
  requestErrors: number;
  /** Health checks answered "busy" (503 while loading weights or paused), which never kill an engine. */
  busyChecks: number;
  /** Whether the server honours sampling seeds (SGLang --enable-deterministic-inference); null: unknown. */
  seedHonoured?: boolean | null;
}

export function percentile(sorted: readonly number[], q: number): number | null {
  if (sorted.length === 0) return null;
  // Nearest-rank: the smallest value with at least q of the data at or below it.
  const rank = Math.max(1, Math.ceil(q * sorted.length));
  return sorted[Math.min(sorted.length, rank) - 1] as number;
}

export class EngineMetrics {
  requests = 0;
  inFlight = 0;
  completed = 0;
  aborted = 0;
  errors = 0;
  versionMismatches = 0;
  tokensGenerated = 0;
  deaths = 0;
  requestErrors = 0;
  busyChecks = 0;
  lastError: string | null = null;
  private readonly latencies: number[] = [];
  private next = 0;
  /** [timeMs, tokens] of recent completions, for tokens/s. */
  private readonly recentTokens: Array<[number, number]> = [];

  constructor(
    private readonly windowSize = 1024,
    private readonly windowMs = 30_000,
  ) {}

  started(): void {
    this.requests++;
    this.inFlight++;
  }

  finished(outcome: "completed" | "aborted" | "error" | "rejected", latencyMs: number, tokens: number, nowMs: number): void {
    this.inFlight = Math.max(0, this.inFlight - 1);
    if (outcome === "completed") this.completed++;
    else if (outcome === "aborted") this.aborted++;
    else if (outcome === "rejected") this.requestErrors++;
    else this.errors++;
    this.tokensGenerated += tokens;
    if (this.latencies.length < this.windowSize) this.latencies.push(latencyMs);
    else this.latencies[this.next] = latencyMs;
    this.next = (this.next + 1) % this.windowSize;
    if (tokens > 0) this.recentTokens.push([nowMs, tokens]);
    this.trim(nowMs);
  }

  private trim(nowMs: number): void {
    while (this.recentTokens.length > 0 && (this.recentTokens[0] as [number, number])[0] < nowMs - this.windowMs) this.recentTokens.shift();
  }

  snapshot(engineId: string, state: string, weightVersion: number | null, nowMs: number): EngineMetricsSnapshot {
    this.trim(nowMs);
    const sorted = [...this.latencies].sort((a, b) => a - b);
    const tokens = this.recentTokens.reduce((s, [, n]) => s + n, 0);
    const first = this.recentTokens[0]?.[0];
    // Rate over the span actually observed (at least 1 s), so a fresh engine is not under-reported.
    const spanMs = first === undefined ? this.windowMs : Math.max(1000, Math.min(this.windowMs, nowMs - first));
    return {
      engineId,
      state,
      weightVersion,
      requests: this.requests,
      inFlight: this.inFlight,
      completed: this.completed,
      aborted: this.aborted,
      errors: this.errors,
      versionMismatches: this.versionMismatches,
      tokensGenerated: this.tokensGenerated,
      tokensPerSecond: (tokens * 1000) / spanMs,
      latencyMs: { p50: percentile(sorted, 0.5), p95: percentile(sorted, 0.95), p99: percentile(sorted, 0.99) },
      deaths: this.deaths,
      lastError: this.lastError,
      requestErrors: this.requestErrors,
      busyChecks: this.busyChecks,
    };
  }
}
