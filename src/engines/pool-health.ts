/**
 * @file The pool's health monitor: /health_generate on every engine each `healthIntervalMs`, then
 * admission (its version, its log-prob probe once per incarnation, and, when it is behind a
 * checkpoint the pool loaded, that checkpoint). An engine is `starting` until its first good check
 * and is not declared dead during `warmupGraceMs` after the pool starts. Every mode change goes
 * through PoolState (pool-state.ts), whose transitions core/weight-sync.ts defines.
 */
import type { PoolState } from "./pool-state.ts";
import type { EnginePoolOptions, Member } from "./pool-types.ts";
import { isSyncBusy } from "../core/weight-sync.ts";
import { RlqError, errorMessage } from "../lib/errors.ts";

export interface HealthSettings {
  healthIntervalMs: number;
  healthTimeoutMs: number;
  busyLimitMs: number;
  probeInput: readonly number[];
}

export class HealthMonitor {
  private timer: NodeJS.Timeout | null = null;
  private round: Promise<void> | null = null;
  /** Checks under way (a round's, a refresh's, a new member's): a release waits for them (settled). */
  private readonly checks = new Set<Promise<void>>();

  constructor(
    private readonly pool: PoolState,
    private readonly options: EnginePoolOptions,
    private readonly settings: HealthSettings,
  ) {}

  /** Starts the monitor on first use (a pool nobody asks for anything checks nothing). */
  ensureStarted(): void {
    const pool = this.pool;
    if (pool.startedAtMs !== null || pool.isClosed) return;
    pool.startedAtMs = pool.now();
    void this.runRound();
    this.timer = setInterval(() => void this.runRound(), this.settings.healthIntervalMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /** One health round over every member; a round already running is joined, not doubled. */
  runRound(): Promise<void> {
    this.round ??= this.inEnginesTurn(() => Promise.all(this.pool.members.map((m) => this.checkInTurn(m)))).then(() => {
      this.round = null;
    });
    return this.round;
  }

  /**
   * Colocated mode, in a process that does not release the engines (`turnGate`, a rollout
   * worker's pool): `checks` run inside one hold on the engines' turn, so the controller's release
   * waits for them, and not at all when the log says the engines are released or about to be
   * (store/colocate-turn.ts says why the hold is a lock). Without a gate they run at once, as in
   * the controller's pool, which holds its own checks around its release (`releasedTags`).
   */
  private inEnginesTurn(checks: () => Promise<unknown>): Promise<void> {
    const gate = this.options.turnGate;
    if (gate === undefined) return checks().then(() => undefined);
    return (async () => {
      let hold: { leave(): Promise<void> } | null;
      try {
        hold = await gate.enter();
      } catch (e) {
        // Nothing sent: whose turn it is could not be read, so this check is skipped; the next round asks again.
        this.pool.log.warn({ err: errorMessage(e) }, "engine pool: could not read whose turn it is on the shared GPUs; health check skipped");
        return;
      }
      if (hold === null) return;
      try {
        await checks();
      } finally {
        await hold.leave();
      }
    })();
  }

  private isInGrace(): boolean {
    const started = this.pool.startedAtMs;
    return started !== null && this.pool.now() - started < (this.options.warmupGraceMs ?? 300_000);
  }

  /** Every check under way has ended (a new one starts only if the pool holds no released memory). */
  async settled(): Promise<void> {
    while (this.checks.size > 0) await Promise.all([...this.checks]);
  }

  /** One member's check, in its own hold on the engines' turn (see `inEnginesTurn`). */
  check(m: Member): Promise<void> {
    return this.inEnginesTurn(() => this.checkInTurn(m));
  }

  private checkInTurn(m: Member): Promise<void> {
    const pool = this.pool;
    if (m.isChecking || m.mode === "refused" || m.mode === "loading" || pool.isClosed || pool.releasedTags.size > 0) return Promise.resolve();
    m.isChecking = true;
    const done = this.checkOnce(m).finally(() => this.checks.delete(done));
    this.checks.add(done);
    return done;
  }

  private async checkOnce(m: Member): Promise<void> {
    const pool = this.pool;
    try {
      const ok = await m.engine.health(this.settings.healthTimeoutMs);
      if (pool.isClosed) return;
      if (!ok) return this.failed(m);
      m.busySinceMs = null;
      if (m.mode === "healthy" && m.version === pool.current) {
        // Cheap path: still fine. The version is re-read so an engine restarted between checks is caught.
        const v = await m.engine.weightVersion();
        if (v === m.version) return;
        m.version = v;
        const latest = pool.current;
        if (latest !== null && v < latest) pool.setEngineMode(m, { kind: "behind" });
      }
      await this.admit(m);
    } catch (e) {
      if (!(m.mode === "starting" && this.isInGrace())) pool.markDead(m, errorMessage(e));
    } finally {
      m.isChecking = false;
    }
  }

  /**
   * A failed /health_generate. SGLang's blocks, then answers 503, while weights load or generation
   * is paused (http_server.py health_generate; slime pauses its health monitor around updates). A
   * server that answers 503 but still reports its version is busy, not dead; so is any engine while
   * this pool's router is in a sync (held, or awaiting the loads).
   */
  private failed(m: Member): void {
    const pool = this.pool;
    if (m.mode === "starting" && this.isInGrace()) return;
    const isBusy = m.engine.lastHealthFailure?.() === "busy";
    if (isBusy || isSyncBusy(pool.router)) {
      m.busySinceMs ??= pool.now();
      m.metrics.busyChecks++;
      if (pool.now() - m.busySinceMs < this.settings.busyLimitMs) return;
      pool.markDead(m, `busy (health_generate 503) for more than ${this.settings.busyLimitMs} ms`);
      return;
    }
    pool.markDead(m, "health_generate failed or timed out");
  }

  /** The server answers: read its version, check it once per incarnation, load current weights if behind. */
  private async admit(m: Member): Promise<void> {
    const pool = this.pool;
    const v = await m.engine.weightVersion();
    m.version = v;
    if (m.probe === null && this.options.logprobCheck !== "off" && !(await this.probe(m))) return;
    pool.moveRouter({ kind: "reported", version: v });
    const current = pool.current;
    if (v === current) {
      if (m.mode !== "healthy") pool.log.info({ engine: m.engine.id, version: v }, "engine admitted");
      pool.setEngineMode(m, { kind: "admitted" });
      m.consecutiveErrors = 0;
      pool.queue.wakeAll();
      return;
    }
    pool.setEngineMode(m, { kind: "behind" });
    // Only an engine behind the pool's version gets it loaded (a restarted server, at its launch
    // weights). One ahead holds a version this pool has not moved to yet: a trainer's push (or
    // another process's load) that the sync under way is about to read, never to be loaded over.
    const reload = pool.lastLoad;
    if (reload !== null && reload.version === current && v < current && m.engine.canLoadWeights) await this.reload(m, reload);
  }

  /** The log-prob probe; false: the engine is refused (its semantics do not match the run's). */
  private async probe(m: Member): Promise<boolean> {
    try {
      await m.engine.checkServer();
      m.probe = await m.engine.probeLogProbs(this.settings.probeInput);
      if (m.probe.isTemperatureScaled === null || m.probe.isBeforeTruncation === null) {
        this.pool.log.warn({ engine: m.engine.id, probe: m.probe }, "engine log-prob probe was inconclusive; accepting the engine");
      }
      return true;
    } catch (e) {
      if (!(e instanceof RlqError) || e.isRetriable) throw e;
      this.pool.setEngineMode(m, { kind: "refused" });
      m.metrics.lastError = e.message;
      this.pool.log.warn({ engine: m.engine.id, err: e.message }, "engine refused");
      return false;
    }
  }

  /** A re-admitted engine behind the checkpoint this pool loaded last: load it, then take requests. */
  private async reload(m: Member, reload: { version: number; uri: string }): Promise<void> {
    const pool = this.pool;
    pool.setEngineMode(m, { kind: "loadStarted" });
    pool.log.info({ engine: m.engine.id, from: m.version, to: reload.version }, "loading current weights into a re-admitted engine");
    try {
      await m.engine.loadWeights(reload.version, reload.uri);
      m.version = reload.version;
      pool.setEngineMode(m, { kind: "loadEnded" });
      m.consecutiveErrors = 0;
      pool.log.info({ engine: m.engine.id, version: m.version }, "engine admitted");
      pool.queue.wakeAll();
    } catch (e) {
      pool.setEngineMode(m, { kind: "loadFailed" });
      m.metrics.lastError = errorMessage(e);
      pool.log.warn({ engine: m.engine.id, err: errorMessage(e) }, "loading current weights failed; will retry");
    }
  }

  /**
   * After a weight sync done by another process (the controller loaded every engine, then
   * dispatched jobs at the new version): one GET of each stale engine's version, and the engine
   * takes requests the moment it reports the current one. A full health round (/health_generate,
   * then the version twice) took 40-470 ms across 64 simulated engines while the jobs it held
   * started (bench/cluster-sim.ts, sync with partial rollouts). An engine whose version cannot be
   * read, or that is not stale, gets the full check.
   *
   * `loadedOnly`: the log says a sync is loading (some engines may have finished, others not).
   * Only stale engines are read, and one still on the old version is left as it is: SGLang's
   * /health_generate would wait behind its load (http_server.py health_generate), so a full check
   * of it tells nothing and costs a request. SGLang answers the version without the model update
   * lock, so the read does not wait for a load.
   */
  async refresh(loadedOnly = false): Promise<void> {
    this.ensureStarted();
    await Promise.all(this.pool.members.map((m) => this.refreshOne(m, loadedOnly)));
  }

  private async refreshOne(m: Member, loadedOnly: boolean): Promise<void> {
    const pool = this.pool;
    if (m.mode === "healthy" && m.version === pool.current) return;
    if (m.mode !== "stale" || pool.isClosed) return loadedOnly ? undefined : this.check(m);
    // Read even while a health check of this engine runs: one started during the load waits behind
    // it (/health_generate) and would admit the engine only when it answers, up to a second later.
    let v: number | null = null;
    try {
      v = await m.engine.weightVersion();
    } catch (e) {
      // Nothing lost: an engine whose version cannot be read stays stale and gets the full check below.
      pool.log.info({ engine: m.engine.id, err: errorMessage(e) }, "engine version read failed during a refresh");
    }
    if (v !== null && v === pool.current && m.mode === "stale") {
      m.version = v;
      pool.setEngineMode(m, { kind: "admitted" });
      pool.wakeForSlot(m, pool.limit - m.inflight.size - m.reserved);
      return;
    }
    if (!loadedOnly) return this.check(m);
  }
}
