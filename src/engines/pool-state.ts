/**
 * @file The engine pool's one mutable state: its members and each one's mode, the router's mode
 * (which version requests go to, whether they wait), the checkpoint last loaded, the queue of
 * requests waiting for a slot, and session affinity. The modes and their transitions are defined
 * in core/weight-sync.ts; this class is their one writer in a process: `setEngineMode` for an
 * engine, `moveRouter` for the router, `recordLoad` for the checkpoint. Health checks
 * (pool-health.ts), loads (pool-versions.ts) and requests (pool-requests.ts) read it and ask it
 * for transitions; none sets a mode itself.
 */
import { EngineMetrics } from "./metrics.ts";
import { AffinityMap } from "./pool-routing.ts";
import type { Member, PoolLog, Waiter } from "./pool-types.ts";
import type { RemoteEngine } from "./remote.ts";
import type { MemoryTag } from "../core/decisions.ts";
import { initialRouter, nextEngineMode, nextRouterMode, type EngineEvent, type RouterEvent, type RouterMode } from "../core/weight-sync.ts";
import { RlqError } from "../lib/errors.ts";

/** Requests waiting for a routable engine with a free slot, FIFO; each re-runs its routing when woken. */
export class WaitQueue {
  private readonly waiters: Waiter[] = [];
  constructor(private readonly now: () => number) {}

  get length(): number {
    return this.waiters.length;
  }

  /** Each waiter re-runs its own routing decision; the ones that still cannot go re-queue. */
  wakeAll(): void {
    for (const w of this.waiters.splice(0)) w.wake();
  }

  wakeFirst(isFor: (w: Waiter) => boolean): void {
    const i = this.waiters.findIndex(isFor);
    if (i >= 0) (this.waiters.splice(i, 1)[0] as Waiter).wake();
  }

  /** Resolves when woken, or after a second (every waiter re-checks), or at `deadlineMs`. */
  wait(sessionKey: string | undefined, exclude: ReadonlySet<string>, entry: object, deadlineMs: number): Promise<void> {
    return new Promise((resolve) => {
      const t = setTimeout(
        () => {
          const i = this.waiters.indexOf(w);
          if (i >= 0) this.waiters.splice(i, 1);
          resolve();
        },
        Math.max(0, Math.min(deadlineMs - this.now(), 1_000)),
      );
      t.unref?.();
      const w: Waiter = {
        sessionKey,
        exclude,
        entry,
        wake: () => {
          clearTimeout(t);
          resolve();
        },
      };
      this.waiters.push(w);
    });
  }
}

export class PoolState {
  readonly members: Member[] = [];
  readonly byId = new Map<string, Member>();
  readonly affinity = new AffinityMap();
  readonly queue: WaitQueue;
  private routerMode: RouterMode = initialRouter;
  private loaded: { version: number; uri: string } | null = null;
  /** When the health monitor started (null: not yet); warm-up grace counts from here. */
  startedAtMs: number | null = null;
  isClosed = false;
  /**
   * Colocated mode: the memory released on the engines (by this pool, or by a controller before it
   * as the log says: pool.ts `markReleased`) and not resumed by this pool. While any is
   * released the health monitor sends nothing (a /health_generate or a log-prob probe is a
   * generation, and the engine holds no weights or cache to run it with).
   */
  readonly releasedTags = new Set<MemoryTag>();

  constructor(
    readonly log: PoolLog,
    readonly now: () => number,
    /** Requests per engine at most (slime sglang_server_concurrency). */
    readonly limit: number,
  ) {
    this.queue = new WaitQueue(now);
  }

  add(engine: RemoteEngine): Member {
    if (this.byId.has(engine.id)) throw new RlqError("config_invalid", `engine pool: two engines have the same URL (${engine.id})`, { isRetriable: false });
    const m: Member = {
      engine,
      mode: "starting",
      version: null,
      probe: null,
      isChecking: false,
      consecutiveErrors: 0,
      reserved: 0,
      busySinceMs: null,
      inflight: new Map(),
      metrics: new EngineMetrics(),
      countedErrors: new WeakSet(),
    };
    this.members.push(m);
    this.byId.set(engine.id, m);
    return m;
  }

  get router(): RouterMode {
    return this.routerMode;
  }

  /** The version requests go to (null: the first one a healthy engine reports). */
  get current(): number | null {
    return this.routerMode.version;
  }

  /** The checkpoint this pool loaded last: an engine re-admitted on another version loads it. */
  get lastLoad(): { version: number; uri: string } | null {
    return this.loaded;
  }

  recordLoad(version: number, uri: string): void {
    this.loaded = { version, uri };
  }

  isRoutable(m: Member): boolean {
    const current = this.routerMode.version;
    return m.mode === "healthy" && (current === null || m.version === current);
  }

  /** The one writer of an engine's mode (core/weight-sync.ts `nextEngineMode`). */
  setEngineMode(m: Member, event: EngineEvent): void {
    m.mode = nextEngineMode(m.mode, event);
  }

  /**
   * The one writer of the router's mode (core/weight-sync.ts `nextRouterMode`). A new version
   * flushes every engine's prefix cache (SGLang scheduler_update_weights_mixin.py), so sessions are
   * placed afresh; healthy engines on another version stop taking requests. Waiters re-route.
   */
  moveRouter(event: RouterEvent): RouterMode {
    const before = this.routerMode;
    const after = nextRouterMode(before, event);
    this.routerMode = after;
    const isMoved = after.version !== before.version;
    if (isMoved && before.version !== null) {
      this.affinity.clear();
      if (event.kind === "reported") this.log.info({ from: before.version, to: after.version }, "engine pool: current weight version advanced");
    }
    if (isMoved || event.kind === "pinned") {
      for (const m of this.members) this.setEngineMode(m, { kind: "versionMoved", isOnVersion: m.version === after.version });
    }
    if (after !== before) this.queue.wakeAll();
    return after;
  }

  /** Out of the rotation: its requests are cancelled locally (partials with tokens come back as aborted). */
  markDead(m: Member, reason: string): void {
    if (m.mode === "dead") return;
    const was = m.mode;
    this.setEngineMode(m, { kind: "died" });
    m.probe = null;
    m.metrics.deaths++;
    m.metrics.lastError = reason;
    this.affinity.forgetEngine(m.engine.id);
    this.log.warn({ engine: m.engine.id, was, reason, inFlight: m.inflight.size }, "engine left the rotation");
    for (const f of m.inflight.values()) {
      if (f.cancelReason === null) f.cancelReason = "dead";
      f.controller.abort(new Error(`engine ${m.engine.id} is dead`));
    }
    this.queue.wakeAll();
  }

  /**
   * `slots` of `m` came free: wake that many waiters that may route to `m`, not all (that cost
   * waiters x engines per release: a whole core at 512 engines). A waiter that finds it taken
   * re-queues; all re-check each second.
   */
  wakeForSlot(m: Member, slots = 1): void {
    const id = m.engine.id;
    for (let k = 0; k < slots; k++)
      this.queue.wakeFirst((w) => {
        if (w.exclude.has(id)) return false;
        const preferred = w.sessionKey === undefined ? undefined : this.byId.get(this.affinity.get(w.sessionKey) ?? "");
        return preferred === undefined || preferred === m || !this.isRoutable(preferred);
      });
  }

  /** "a=healthy@v2, b=dead" for error messages. */
  describe(): string {
    return this.members.map((m) => `${m.engine.id}=${m.mode}${m.version === null ? "" : `@v${m.version}`}`).join(", ");
  }
}
