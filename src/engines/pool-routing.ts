/**
 * Routing decisions of the engine pool, kept pure so they are unit-tested
 * apart from HTTP. Least-outstanding-requests with a per-engine cap
 * (slime: sglang_server_concurrency, default 512) and prefix affinity: a
 * session (a multi-turn sample) stays on the engine that holds its prefix
 * cache while that engine is routable, even if it waits for a slot there,
 * until the pool moves to a new weight version: loading weights flushes the
 * engines' caches (SGLang scheduler_update_weights_mixin.py
 * update_weights_from_disk, flush_cache), so every session is placed afresh.
 */
import type { Member } from "./pool-types.ts";

export interface RoutingCandidate {
  id: string;
  outstanding: number;
  limit: number;
  /** False: not a candidate now (dead, stale, or already failed this request). Default true. */
  isRoutable?: boolean;
}

export type RoutingDecision = { kind: "engine"; id: string } | { kind: "wait" } | { kind: "none" };

/**
 * @param candidates the engines, in a stable order; only routable ones (healthy, on the current version) count
 * @param preferredId the session's engine, if it has one
 * @param rotation a counter that breaks ties round-robin, so equal engines share load
 */
export function pickEngine(candidates: readonly RoutingCandidate[], preferredId: string | undefined, rotation: number): RoutingDecision {
  if (preferredId !== undefined) {
    const preferred = candidates.find((c) => c.id === preferredId && c.isRoutable !== false);
    if (preferred) return preferred.outstanding < preferred.limit ? { kind: "engine", id: preferred.id } : { kind: "wait" };
  }
  let best: RoutingCandidate | null = null;
  let isAny = false;
  const n = candidates.length;
  const start = n === 0 ? 0 : ((rotation % n) + n) % n;
  for (let k = 0; k < n; k++) {
    const c = candidates[(start + k) % n] as RoutingCandidate;
    if (c.isRoutable === false) continue;
    isAny = true;
    if (c.outstanding >= c.limit) continue;
    if (best === null || c.outstanding < best.outstanding) best = c;
  }
  if (!isAny) return { kind: "none" };
  return best ? { kind: "engine", id: best.id } : { kind: "wait" };
}

/**
 * The pool's candidates, one per member, updated in place. Routing runs for every request and again
 * on every wake-up of a queued one; building a fresh candidate list each time (members.filter().map())
 * was the rollout worker's largest cost after a weight sync at 64 simulated engines (1536 requests
 * routed in the first second; bench/cluster-sim.ts --prof).
 */
export class RoutingView {
  private readonly candidates: RoutingCandidate[] = [];

  update(members: readonly Member[], limit: number, isRoutable: (m: Member) => boolean, exclude: ReadonlySet<string>): readonly RoutingCandidate[] {
    const cs = this.candidates;
    if (cs.length > members.length) cs.length = members.length;
    for (let i = 0; i < members.length; i++) {
      const m = members[i] as Member;
      const c = cs[i] ?? (cs[i] = { id: m.engine.id, outstanding: 0, limit, isRoutable: false });
      c.id = m.engine.id;
      c.limit = limit;
      c.outstanding = m.inflight.size + m.reserved;
      c.isRoutable = isRoutable(m) && !exclude.has(m.engine.id);
    }
    return cs;
  }
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

  /** Every engine loaded new weights (their prefix caches are gone): every session is re-placed. */
  clear(): void {
    this.map.clear();
  }

  /** An engine left the rotation: its sessions are re-placed on their next request. */
  forgetEngine(engineId: string): void {
    for (const [k, v] of this.map) if (v === engineId) this.map.delete(k);
  }

  get size(): number {
    return this.map.size;
  }
}
