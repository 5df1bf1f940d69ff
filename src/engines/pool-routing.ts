/**
 * Routing decisions of the engine pool, kept pure so they are unit-tested
 * apart from HTTP. Least-outstanding-requests with a per-engine cap
 * (slime: sglang_server_concurrency, default 512) and prefix affinity: a
 * session (a multi-turn sample) stays on the engine that holds its prefix
 * cache while that engine is routable, even if it waits for a slot there.
 */
export interface RoutingCandidate {
  id: string;
  outstanding: number;
  limit: number;
}

export type RoutingDecision = { kind: "engine"; id: string } | { kind: "wait" } | { kind: "none" };

/**
 * @param candidates routable engines (healthy, on the current version), in a stable order
 * @param preferredId the session's engine, if it has one
 * @param rotation a counter that breaks ties round-robin, so equal engines share load
 */
export function pickEngine(candidates: readonly RoutingCandidate[], preferredId: string | undefined, rotation: number): RoutingDecision {
  if (candidates.length === 0) return { kind: "none" };
  if (preferredId !== undefined) {
    const preferred = candidates.find((c) => c.id === preferredId);
    if (preferred) return preferred.outstanding < preferred.limit ? { kind: "engine", id: preferred.id } : { kind: "wait" };
  }
  let best: RoutingCandidate | null = null;
  const n = candidates.length;
  const start = ((rotation % n) + n) % n;
  for (let k = 0; k < n; k++) {
    const c = candidates[(start + k) % n] as RoutingCandidate;
    if (c.outstanding >= c.limit) continue;
    if (best === null || c.outstanding < best.outstanding) best = c;
  }
  return best ? { kind: "engine", id: best.id } : { kind: "wait" };
}

/** Session key → engine id, bounded: the oldest sessions are forgotten first. */
export class AffinityMap {
  private readonly map = new Map<string, string>();
  constructor(private readonly maxSessions = 100_000) {}

  get(key: string): string | undefined {
    return this.map.get(key);
  }

  set(key: string, engineId: string): void {
    this.map.delete(key);
    this.map.set(key, engineId);
    if (this.map.size > this.maxSessions) {
      const oldest = this.map.keys().next().value;
      if (oldest !== undefined) this.map.delete(oldest);
    }
  }

  /** An engine left the rotation: its sessions are re-placed on their next request. */
  forgetEngine(engineId: string): void {
    for (const [k, v] of this.map) if (v === engineId) this.map.delete(k);
  }

  get size(): number {
    return this.map.size;
  }
}
