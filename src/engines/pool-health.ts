import type { EnginePoolOptions, Member, PoolLog } from "./pool-types.ts";
import { RlqError, errorMessage } from "../lib/errors.ts";

/**
 * The pool's view that health checks read and change: the pool owns the
 * state (pool.ts); these accessors keep one copy of it.
 */
export interface PoolHealthContext {
  options: EnginePoolOptions;
  log: PoolLog;
  now: () => number;
  healthTimeoutMs: number;
  busyLimitMs: number;
  probeInput: readonly number[];
  current(): number | null;
  /** The checkpoint the pool last loaded (re-admitted engines load it), if any. */
  reload(): { version: number; uri: string } | null;
  isPaused(): boolean;
  isClosed(): boolean;
  startedAtMs(): number | null;
  learnVersion(v: number): void;
  markDead(m: Member, reason: string): void;
  wakeWaiters(): void;
}

/**
 * One member's health check and admission: /health_generate, then its
 * version, its log-prob probe (once per incarnation) and, when it is behind
 * a checkpoint the pool loaded, that checkpoint.
 */
export function createMemberChecker(ctx: PoolHealthContext): (m: Member) => Promise<void> {
  const { options, log, now } = ctx;

  async function admit(m: Member): Promise<void> {
    // The server answers: read its version, check it once per incarnation, load current weights if behind.
    const v = await m.engine.weightVersion();
    m.version = v;
    if (m.probe === null && options.logprobCheck !== "off") {
      try {
        await m.engine.checkServer();
        m.probe = await m.engine.probeLogProbs(ctx.probeInput);
        if (m.probe.isTemperatureScaled === null || m.probe.isBeforeTruncation === null) {
          log.warn({ engine: m.engine.id, probe: m.probe }, "engine log-prob probe was inconclusive; accepting the engine");
        }
      } catch (e) {
        if (e instanceof RlqError && !e.isRetriable) {
          m.state = "refused";
          m.metrics.lastError = e.message;
          log.warn({ engine: m.engine.id, err: e.message }, "engine refused");
          return;
        }
        throw e;
      }
    }
    const before = ctx.current();
    if (before === null || v > before) ctx.learnVersion(v);
    const current = ctx.current();
    if (v === current) {
      if (m.state !== "healthy") log.info({ engine: m.engine.id, version: v }, "engine admitted");
      m.state = "healthy";
      m.consecutiveErrors = 0;
      ctx.wakeWaiters();
      return;
    }
    m.state = "stale";
    const reload = ctx.reload();
    if (reload !== null && reload.version === current && m.engine.canLoadWeights) {
      m.state = "loading";
      log.info({ engine: m.engine.id, from: v, to: reload.version }, "loading current weights into a re-admitted engine");
      try {
        await m.engine.loadWeights(reload.version, reload.uri);
        m.version = reload.version;
        m.state = "healthy";
        m.consecutiveErrors = 0;
        log.info({ engine: m.engine.id, version: m.version }, "engine admitted");
        ctx.wakeWaiters();
      } catch (e) {
        m.state = "stale";
        m.metrics.lastError = errorMessage(e);
        log.warn({ engine: m.engine.id, err: errorMessage(e) }, "loading current weights failed; will retry");
      }
    }
  }

  const isInGrace = () => {
    const started = ctx.startedAtMs();
    return started !== null && now() - started < (options.warmupGraceMs ?? 300_000);
  };

  return async function checkMember(m: Member): Promise<void> {
    if (m.isChecking || m.state === "refused" || m.state === "loading" || ctx.isClosed()) return;
    m.isChecking = true;
    try {
      const ok = await m.engine.health(ctx.healthTimeoutMs);
      if (ctx.isClosed()) return;
      if (!ok) {
        if (m.state === "starting" && isInGrace()) return;
        // SGLang's /health_generate blocks, then answers 503, while weights load or generation is
        // paused (http_server.py health_generate; slime pauses its health monitor around updates).
        // A server that answers 503 but still reports its version is busy, not dead; so is any
        // engine while this pool holds admission for a trainer push.
        const isBusy = m.engine.lastHealthFailure?.() === "busy";
        if (isBusy || ctx.isPaused()) {
          m.busySinceMs ??= now();
          m.metrics.busyChecks++;
          if (now() - m.busySinceMs < ctx.busyLimitMs) return;
          ctx.markDead(m, `busy (health_generate 503) for more than ${ctx.busyLimitMs} ms`);
          return;
        }
        ctx.markDead(m, "health_generate failed or timed out");
        return;
      }
      m.busySinceMs = null;
      const current = ctx.current();
      if (m.state === "healthy" && m.version === current) {
        // Cheap path: still fine. The version is re-read so an engine restarted between checks is caught.
        const v = await m.engine.weightVersion();
        if (v === m.version) return;
        m.version = v;
        const latest = ctx.current();
        if (latest !== null && v < latest) m.state = "stale";
      }
      await admit(m);
    } catch (e) {
      if (!(m.state === "starting" && isInGrace())) ctx.markDead(m, errorMessage(e));
    } finally {
      m.isChecking = false;
    }
  };
}

/**
 * After a weight sync done by another process (the controller loaded every engine, then dispatched
 * jobs at the new version): one GET of each stale engine's version, and the engine takes requests
 * the moment it reports the current one. A full health round (/health_generate, then the version
 * twice) took 40-470 ms across 64 simulated engines while the jobs it held started
 * (bench/cluster-sim.ts, sync with partial rollouts). An engine whose version cannot be read, or
 * that is not stale, gets the full check (`checkMember`).
 *
 * `loadedOnly`: the controller says some engines finished loading while others may still be loading
 * (store/notify.ts `rlq_loaded`). Only stale engines are read, and one still on the old version is
 * left as it is: SGLang's /health_generate would wait behind its load (http_server.py
 * health_generate), so a full check of it tells nothing and costs a request. SGLang answers the
 * version without the model update lock, so the read does not wait for a load.
 */
export function createVersionRefresher(
  ctx: Pick<PoolHealthContext, "current" | "isClosed"> & {
    ensureStarted(): void;
    /** Wake as many queued requests as the engine has free slots, of those that may go to it. */
    wakeFor(m: Member): void;
  },
  checkMember: (m: Member) => Promise<void>,
): (members: readonly Member[], loadedOnly?: boolean) => Promise<void> {
  async function refresh(m: Member, loadedOnly: boolean): Promise<void> {
    if (m.state === "healthy" && m.version === ctx.current()) return;
    if (m.state !== "stale" || ctx.isClosed()) return loadedOnly ? undefined : checkMember(m);
    // Read even while a health check of this engine runs: one started during the load waits behind
    // it (/health_generate) and would admit the engine only when it answers, up to a second later.
    const v = await m.engine.weightVersion().catch(() => null);
    if (v !== null && v === ctx.current() && m.state === "stale") {
      m.version = v;
      m.state = "healthy";
      ctx.wakeFor(m);
      return;
    }
    if (!loadedOnly) return checkMember(m);
  }
  return async (members, loadedOnly = false) => {
    ctx.ensureStarted();
    await Promise.all(members.map((m) => refresh(m, loadedOnly)));
  };
}
