import { generateRequestSchema, type Engine, type GenerateRequest, type GenerateResult } from "./engine.ts";
import { EngineMetrics, type EngineMetricsSnapshot } from "./metrics.ts";
import { AffinityMap, pickEngine } from "./pool-routing.ts";
import { checkLogprobCompatibility, type LogprobProbe } from "./logprob-check.ts";
import { abortedResult, emptyPartial, isRequestError, type PartialOutput, type RemoteEngine } from "./remote.ts";
import { RlqError, errorMessage } from "../lib/errors.ts";

/**
 * The engine pool: several remote engines behind one Engine.
 *
 * Routing: least outstanding requests among routable engines, a per-engine
 * cap (`maxConcurrentPerEngine`, slime's sglang_server_concurrency = 512),
 * prefix affinity by `sessionKey`; requests beyond every cap wait in FIFO order.
 *
 * Health: a monitor calls /health_generate every `healthIntervalMs`. An engine
 * is "starting" until its first good check and is not declared dead during
 * `warmupGraceMs` after the pool starts. A dead engine leaves the rotation and
 * its in-flight requests are cancelled locally: those with tokens resolve as
 * aborted partials (finishReason "abort", tokens so far) which the rollout
 * resumes as new segments; those without tokens are retried on another
 * engine. A dead engine that answers again is re-admitted once it reports
 * the current weight version — after the pool has loaded the current
 * checkpoint into it when it knows one (`loadWeights` was called here).
 *
 * Versions: the pool routes only to engines on its current version: the
 * version of the last `loadWeights`/`setCurrentVersion`, or else the highest
 * version its healthy engines report. An engine behind it is "stale".
 */
export type MemberState = "starting" | "healthy" | "stale" | "loading" | "dead" | "refused";

export interface PoolLog {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
}

export interface EnginePoolOptions {
  members: readonly RemoteEngine[];
  /** slime sglang_server_concurrency. Default 512. */
  maxConcurrentPerEngine?: number;
  /** Default 5 s. */
  healthIntervalMs?: number;
  /** A /health_generate slower than this counts as failed. Default 10 s. */
  healthTimeoutMs?: number;
  /** After the pool starts, failing checks do not declare an engine dead for this long. Default 300 s. */
  warmupGraceMs?: number;
  /** How long `abort` waits for the server to answer aborted requests before cancelling them locally. Default 10 s. */
  abortWaitMs?: number;
  /** Attempts per request across engines when a request fails before any token. Default 3. */
  maxAttempts?: number;
  /** How long a request waits for any routable engine before failing (retriable). Default 120 s. */
  noEngineWaitMs?: number;
  /** How long an engine may answer health checks with "busy" (loading weights) before it is declared dead. Default 15 min. */
  busyLimitMs?: number;
  /** "probe" (default): check each engine's log-prob semantics on admission (logprob-check.ts). */
  logprobCheck?: "probe" | "off";
  /** Input for the probe; any valid token ids of the model. Default [1..8]. */
  probeInputIds?: readonly number[];
  log?: PoolLog;
  now?: () => number;
}

export interface PoolSnapshot {
  currentVersion: number | null;
  isAdmissionPaused: boolean;
  queued: number;
  engines: EngineMetricsSnapshot[];
}

export interface EnginePool extends Engine {
  /** Route only to engines on `version` from now on (trainer_push: after the trainer reports it). */
  setCurrentVersion(version: number): void;
  currentVersion(): number | null;
  /** Resolves when every live engine reports `version`; engines that die meanwhile are left out. */
  awaitVersion(version: number, timeoutMs: number): Promise<{ engines: string[] }>;
  /** New requests wait (in-flight ones continue) until resumeAdmission. */
  pauseAdmission(): void;
  resumeAdmission(): void;
  /** Resolves once at least one engine is routable (or rejects after `timeoutMs`). */
  awaitReady(timeoutMs: number): Promise<void>;
  /** Run one health round now (tests and the controller use it; the monitor runs them on its own). */
  checkHealth(): Promise<void>;
  /** Engines found later (an SGLang router's refreshed worker list); ones already here are ignored. */
  addMembers(engines: readonly RemoteEngine[]): void;
  snapshot(): PoolSnapshot;
  engineStates(): Record<string, MemberState>;
}

interface Inflight {
  rid: string;
  controller: AbortController;
  partial: PartialOutput;
  /** Why it was cancelled locally: the caller aborted, or the engine died. */
  cancelReason: "abort" | "dead" | null;
  settled: Promise<void>;
}

interface Member {
  engine: RemoteEngine;
  state: MemberState;
  version: number | null;
  probe: LogprobProbe | null;
  inflight: Map<string, Inflight>;
  metrics: EngineMetrics;
  isChecking: boolean;
  consecutiveErrors: number;
  /** Errors already counted in consecutiveErrors. */
  countedErrors: WeakSet<object>;
  /** Slots taken by requests routed here that have not started yet. */
  reserved: number;
  /** Since when its health checks answer "busy" (503 while loading weights or paused); null: not busy. */
  busySinceMs: number | null;
}

interface PendingEntry {
  abortRequested: boolean;
  isSettled: boolean;
  inflight: Inflight | null;
  member: Member | null;
  done: Promise<void>;
}

interface Waiter {
  sessionKey: string | undefined;
  wake: () => void;
}

/** The rid one attempt of a request has on the server: unique per attempt, never a prefix of another. */
export function serverRid(requestId: string, attempt: number): string {
  return `${requestId}.a${attempt}.`;
}

const silentLog: PoolLog = { info: () => undefined, warn: () => undefined };

export function createEnginePool(options: EnginePoolOptions): EnginePool {
  const now = options.now ?? (() => Date.now());
  const log = options.log ?? silentLog;
  const limit = options.maxConcurrentPerEngine ?? 512;
  const healthIntervalMs = options.healthIntervalMs ?? 5_000;
  const healthTimeoutMs = options.healthTimeoutMs ?? 10_000;
  const abortWaitMs = options.abortWaitMs ?? 10_000;
  const maxAttempts = options.maxAttempts ?? 3;
  const noEngineWaitMs = options.noEngineWaitMs ?? 120_000;
  const probeInput = options.probeInputIds ?? [1, 2, 3, 4, 5, 6, 7, 8];
  const busyLimitMs = options.busyLimitMs ?? 900_000;
  const newMember = (engine: RemoteEngine): Member => ({
    engine,
    state: "starting",
    version: null,
    probe: null,
    inflight: new Map(),
    metrics: new EngineMetrics(),
    isChecking: false,
    consecutiveErrors: 0,
    countedErrors: new WeakSet(),
    reserved: 0,
    busySinceMs: null,
  });
  const members: Member[] = options.members.map(newMember);
  const byId = new Map(members.map((m) => [m.engine.id, m]));
  if (byId.size !== members.length) throw new RlqError("config_invalid", "engine pool: two engines have the same URL", { isRetriable: false });
  const affinity = new AffinityMap();
  const waiters: Waiter[] = [];
  /** Requests this pool has not settled yet, by id: abort finds them here. */
  const pending = new Map<string, PendingEntry>();
  let current: number | null = null;
  let isPinned = false;
  let reload: { version: number; uri: string } | null = null;
  let isPaused = false;
  let rotation = 0;
  let startedAtMs: number | null = null;
  let timer: NodeJS.Timeout | null = null;
  let isClosed = false;
  let healthRound: Promise<void> | null = null;

  const isRoutable = (m: Member) => m.state === "healthy" && (current === null || m.version === current);

  function ensureStarted(): void {
    if (startedAtMs !== null || isClosed) return;
    startedAtMs = now();
    void runHealthRound();
    timer = setInterval(() => void runHealthRound(), healthIntervalMs);
    timer.unref();
  }

  function wakeWaiters(): void {
    // Each waiter re-runs its own routing decision; the ones that still cannot go re-queue.
    const all = waiters.splice(0);
    for (const w of all) w.wake();
  }

  function learnVersion(v: number): void {
    if (isPinned) return;
    if (current === null || v > current) {
      if (current !== null) log.info({ from: current, to: v }, "engine pool: current weight version advanced");
      current = v;
      for (const m of members) if (m.state === "healthy" && m.version !== v) m.state = "stale";
    }
  }

  function markDead(m: Member, reason: string): void {
    if (m.state === "dead") return;
    const wasState = m.state;
    m.state = "dead";
    m.probe = null;
    m.metrics.deaths++;
    m.metrics.lastError = reason;
    affinity.forgetEngine(m.engine.id);
    log.warn({ engine: m.engine.id, was: wasState, reason, inFlight: m.inflight.size }, "engine left the rotation");
    for (const f of m.inflight.values()) {
      if (f.cancelReason === null) f.cancelReason = "dead";
      f.controller.abort(new Error(`engine ${m.engine.id} is dead`));
    }
    wakeWaiters();
  }

  async function admit(m: Member): Promise<void> {
    // The server answers: read its version, check it once per incarnation, load current weights if behind.
    const v = await m.engine.weightVersion();
    m.version = v;
    if (m.probe === null && options.logprobCheck !== "off") {
      try {
        await m.engine.checkServer();
        m.probe = await m.engine.probeLogProbs(probeInput);
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
    if (current === null || v > current) learnVersion(v);
    if (v === current) {
      if (m.state !== "healthy") log.info({ engine: m.engine.id, version: v }, "engine admitted");
      m.state = "healthy";
      m.consecutiveErrors = 0;
      wakeWaiters();
      return;
    }
    m.state = "stale";
    if (reload !== null && reload.version === current && m.engine.canLoadWeights) {
      m.state = "loading";
      log.info({ engine: m.engine.id, from: v, to: reload.version }, "loading current weights into a re-admitted engine");
      try {
        await m.engine.loadWeights(reload.version, reload.uri);
        m.version = reload.version;
        m.state = "healthy";
        m.consecutiveErrors = 0;
        log.info({ engine: m.engine.id, version: m.version }, "engine admitted");
        wakeWaiters();
      } catch (e) {
        m.state = "stale";
        m.metrics.lastError = errorMessage(e);
        log.warn({ engine: m.engine.id, err: errorMessage(e) }, "loading current weights failed; will retry");
      }
    }
  }

  async function checkMember(m: Member): Promise<void> {
    if (m.isChecking || m.state === "refused" || m.state === "loading" || isClosed) return;
    m.isChecking = true;
    try {
      const ok = await m.engine.health(healthTimeoutMs);
      if (isClosed) return;
      if (!ok) {
        const isInGrace = startedAtMs !== null && now() - startedAtMs < (options.warmupGraceMs ?? 300_000);
        if (m.state === "starting" && isInGrace) return;
        // SGLang's /health_generate blocks, then answers 503, while weights load or generation is
        // paused (http_server.py health_generate; slime pauses its health monitor around updates).
        // A server that answers 503 but still reports its version is busy, not dead; so is any
        // engine while this pool holds admission for a trainer push.
        const isBusy = m.engine.lastHealthFailure?.() === "busy";
        if (isBusy || isPaused) {
          m.busySinceMs ??= now();
          m.metrics.busyChecks++;
          if (now() - m.busySinceMs < busyLimitMs) return;
          markDead(m, `busy (health_generate 503) for more than ${busyLimitMs} ms`);
          return;
        }
        markDead(m, "health_generate failed or timed out");
        return;
      }
      m.busySinceMs = null;
      if (m.state === "healthy" && m.version === current) {
        // Cheap path: still fine. The version is re-read so an engine restarted between checks is caught.
        const v = await m.engine.weightVersion();
        if (v === m.version) return;
        m.version = v;
        if (current !== null && v < current) m.state = "stale";
      }
      await admit(m);
    } catch (e) {
      const isInGrace = startedAtMs !== null && now() - startedAtMs < (options.warmupGraceMs ?? 300_000);
      if (!(m.state === "starting" && isInGrace)) markDead(m, errorMessage(e));
    } finally {
      m.isChecking = false;
    }
  }

  function runHealthRound(): Promise<void> {
    if (healthRound) return healthRound;
    healthRound = Promise.all(members.map((m) => checkMember(m))).then(() => {
      healthRound = null;
    });
    return healthRound;
  }

  /** Wait until routing may succeed (or time out). */
  function waitForChange(sessionKey: string | undefined, deadlineMs: number): Promise<void> {
    return new Promise((resolve) => {
      const t = setTimeout(
        () => {
          const i = waiters.indexOf(w);
          if (i >= 0) waiters.splice(i, 1);
          resolve();
        },
        Math.max(0, Math.min(deadlineMs - now(), 1_000)),
      );
      t.unref?.();
      const w: Waiter = {
        sessionKey,
        wake: () => {
          clearTimeout(t);
          resolve();
        },
      };
      waiters.push(w);
    });
  }

  async function acquire(req: GenerateRequest, exclude: ReadonlySet<string>, entry: { abortRequested: boolean }): Promise<Member | null> {
    const deadline = now() + noEngineWaitMs;
    for (;;) {
      if (entry.abortRequested || isClosed) return null;
      if (!isPaused) {
        const candidates = members
          .filter((m) => isRoutable(m) && !exclude.has(m.engine.id))
          .map((m) => ({ id: m.engine.id, outstanding: m.inflight.size + m.reserved, limit }));
        const preferred = req.sessionKey === undefined ? undefined : affinity.get(req.sessionKey);
        const d = pickEngine(candidates, preferred, rotation++);
        if (d.kind === "engine") {
          const m = byId.get(d.id) as Member;
          // Hold the slot now: runOn registers the request only after this function returns.
          m.reserved++;
          if (req.sessionKey !== undefined) affinity.set(req.sessionKey, m.engine.id);
          return m;
        }
        if (d.kind === "none" && exclude.size > 0 && members.some((m) => isRoutable(m))) {
          // Only engines this request already failed on are left: let it try them again.
          return acquire(req, new Set(), entry);
        }
      }
      if (now() > deadline) {
        const states = members.map((m) => `${m.engine.id}=${m.state}${m.version === null ? "" : `@v${m.version}`}`).join(", ");
        throw new RlqError(
          "engine_unavailable",
          `no engine could take request ${req.requestId} within ${noEngineWaitMs} ms (current version ${current ?? "unknown"}; ${states})`,
          { isRetriable: true },
        );
      }
      await waitForChange(req.sessionKey, deadline);
    }
  }

  async function runOn(
    m: Member,
    req: GenerateRequest,
    entry: PendingEntry,
    attempt: number,
  ): Promise<{ result: GenerateResult; cancel: Inflight["cancelReason"] } | { error: unknown; partial: PartialOutput; cancel: Inflight["cancelReason"] }> {
    m.reserved = Math.max(0, m.reserved - 1);
    const controller = new AbortController();
    let settle!: () => void;
    // A new server-side rid per attempt: SGLang rejects a rid still in flight ("Duplicate request
    // ID", tokenizer_manager.py), and a request whose client went away is aborted only ~2 s later.
    // rids are matched by prefix on abort (abort_request), so each ends with a terminator.
    const rid = serverRid(req.requestId, attempt);
    const f: Inflight = { rid, controller, partial: emptyPartial(), cancelReason: null, settled: new Promise<void>((r) => (settle = r)) };
    m.inflight.set(req.requestId, f);
    entry.inflight = f;
    entry.member = m;
    m.metrics.started();
    const t0 = now();
    try {
      if (m.probe) checkLogprobCompatibility(m.probe, req.sampling, m.engine.id);
      const result = await m.engine.generateWith({ ...req, requestId: rid }, { partial: f.partial, signal: controller.signal });
      const outcome = result.finishReason === "abort" ? "aborted" : "completed";
      m.metrics.finished(outcome, now() - t0, result.tokenIds.length, now());
      m.consecutiveErrors = 0;
      if (current !== null && result.weightVersion !== current) m.metrics.versionMismatches++;
      // Answers carry the server's live version: a process whose pool did not run the sync (a
      // rollout worker) learns the new version here instead of at its next health round.
      if (result.tokenIds.length > 0 && (m.version === null || result.weightVersion > m.version)) {
        m.version = result.weightVersion;
        learnVersion(result.weightVersion);
      }
      return { result, cancel: f.cancelReason };
    } catch (error) {
      if (isRequestError(error)) {
        // The request's fault (a prompt over the context length): not the engine's.
        m.metrics.finished("rejected", now() - t0, 0, now());
        return { error, partial: f.partial, cancel: f.cancelReason };
      }
      m.metrics.finished("error", now() - t0, f.partial.tokenIds.length, now());
      m.metrics.lastError = errorMessage(error);
      return { error, partial: f.partial, cancel: f.cancelReason };
    } finally {
      m.inflight.delete(req.requestId);
      entry.inflight = null;
      settle();
      wakeWaiters();
    }
  }

  async function generate(request: GenerateRequest): Promise<GenerateResult> {
    const req = generateRequestSchema.parse(request);
    ensureStarted();
    // The same id again while the first is still here: a retried rollout job whose first attempt's
    // requests are still pending. The newer caller wins: the old request is aborted (its caller gets
    // an aborted partial, which that dead attempt will not write) and this one starts once it is gone.
    for (let superseded = pending.get(req.requestId); superseded !== undefined && !superseded.isSettled; superseded = pending.get(req.requestId)) {
      log.warn({ requestId: req.requestId }, "request id already in flight in this pool (a retried job?): aborting the older request");
      await abortOne(req.requestId);
      await superseded.done;
    }
    const entry: PendingEntry = { abortRequested: false, isSettled: false, inflight: null, member: null, done: Promise.resolve() };
    const run = async (): Promise<GenerateResult> => {
      const failed = new Set<string>();
      let lastError: unknown = null;
      for (let attempt = 1; attempt <= maxAttempts; attempt++) {
        const m = await acquire(req, failed, entry);
        if (m === null) return abortedResult(emptyPartial(), "none", current ?? 0);
        const out = await runOn(m, req, entry, attempt);
        if ("result" in out) {
          if (out.cancel === "dead" && out.result.tokenIds.length === 0 && !entry.abortRequested) {
            failed.add(m.engine.id);
            continue; // died before any token: nothing to keep, start over elsewhere
          }
          return out.result;
        }
        const e = out.error;
        if (e instanceof RlqError && !e.isRetriable && e.code !== "engine_unreachable") throw e;
        lastError = e;
        // An error abort (finish_reason with a 5xx status_code) is no resumable partial: start over.
        const isErrorAbort = e instanceof RlqError && e.code === "engine_server_abort";
        if (!isErrorAbort && (out.partial.tokenIds.length > 0 || entry.abortRequested)) {
          // Tokens already came back (or the caller aborted): keep them as an aborted partial; the rollout resumes from them.
          m.metrics.aborted++;
          return abortedResult(out.partial, m.engine.id, current ?? m.version ?? 0);
        }
        failed.add(m.engine.id);
        // One failed HTTP call is one failure, however many requests it carried (the
        // SGLang adapter's non-streaming batches reject every request of one with the same error).
        if (typeof e !== "object" || e === null || !m.countedErrors.has(e)) {
          if (typeof e === "object" && e !== null) m.countedErrors.add(e);
          m.consecutiveErrors++;
        }
        if (e instanceof RlqError && (e.code === "engine_unreachable" || e.code === "engine_timeout")) void checkMember(m);
        else if (m.consecutiveErrors >= 3) markDead(m, `3 consecutive failed requests: ${errorMessage(e)}`);
      }
      throw new RlqError("engine_request_failed", `request ${req.requestId} failed on ${maxAttempts} attempt(s): ${errorMessage(lastError)}`, {
        cause: lastError,
        isRetriable: true,
      });
    };
    pending.set(req.requestId, entry);
    const promise = run();
    entry.done = promise.then(
      () => void (entry.isSettled = true),
      () => void (entry.isSettled = true),
    );
    try {
      return await promise;
    } finally {
      if (pending.get(req.requestId) === entry) pending.delete(req.requestId);
    }
  }

  async function abortOne(rid: string): Promise<void> {
    const entry = pending.get(rid);
    if (!entry) return;
    entry.abortRequested = true;
    wakeWaiters();
    const deadline = now() + abortWaitMs;
    // Re-send until the request has come back: an abort that reaches the server
    // before the request does is a no-op there.
    while (!entry.isSettled) {
      const f = entry.inflight;
      const m = entry.member;
      if (f !== null && m !== null) {
        if (f.cancelReason === null) f.cancelReason = "abort";
        if (!m.engine.canAbortById || now() >= deadline || m.state === "dead") {
          f.controller.abort(new Error("aborted by caller"));
        } else {
          await m.engine.abort([f.rid]).catch(() => undefined);
        }
      }
      const waitMs = Math.max(0, Math.min(500, deadline - now()));
      await Promise.race([entry.done, new Promise((r) => setTimeout(r, waitMs).unref?.())]);
    }
  }

  return {
    id: `pool(${members.map((m) => m.engine.id).join(",")})`,
    generate,
    async abort(requestIds) {
      await Promise.all(requestIds.map((rid) => abortOne(rid)));
    },
    async health() {
      ensureStarted();
      return members.some((m) => isRoutable(m));
    },
    async loadWeights(version, uri) {
      ensureStarted();
      reload = { version, uri };
      const live = members.filter((m) => m.state !== "dead" && m.state !== "refused" && m.engine.canLoadWeights);
      const results = await Promise.allSettled(
        live.map(async (m) => {
          const was = m.state;
          m.state = "loading";
          try {
            await m.engine.loadWeights(version, uri);
            m.version = version;
            m.state = "healthy";
          } catch (e) {
            m.state = was === "loading" ? "stale" : was;
            throw e;
          }
        }),
      );
      const failures = results.flatMap((r, i) => (r.status === "rejected" ? [{ m: live[i] as Member, e: r.reason as unknown }] : []));
      for (const { m, e } of failures) markDead(m, `loading version ${version} failed: ${errorMessage(e)}`);
      current = version;
      isPinned = true;
      for (const m of members) if (m.state === "healthy" && m.version !== version) m.state = "stale";
      wakeWaiters();
      if (failures.length === live.length && live.length > 0) {
        const first = failures[0]?.e;
        throw new RlqError("engine_load_failed", `no engine loaded version ${version} (${uri}): ${errorMessage(first)}`, {
          cause: first,
          isRetriable: !(first instanceof RlqError) || first.isRetriable,
        });
      }
    },
    async weightVersion() {
      ensureStarted();
      if (current !== null) return current;
      await runHealthRound();
      if (current === null) throw new RlqError("engine_unavailable", "no engine in the pool reported a weight version", { isRetriable: true });
      return current;
    },
    setCurrentVersion(version) {
      current = version;
      isPinned = true;
      for (const m of members) if (m.state === "healthy" && m.version !== version) m.state = "stale";
      wakeWaiters();
    },
    currentVersion: () => current,
    async awaitVersion(version, timeoutMs) {
      ensureStarted();
      const deadline = now() + timeoutMs;
      // Fenced engines cannot report versions; the trainer's report is the evidence.
      for (const m of members) m.engine.setVersion?.(version);
      for (;;) {
        await Promise.all(
          members.map(async (m) => {
            if (m.state === "dead" || m.state === "refused") return;
            try {
              m.version = await m.engine.weightVersion();
            } catch (e) {
              markDead(m, errorMessage(e));
            }
          }),
        );
        const live = members.filter((m) => m.state !== "dead" && m.state !== "refused");
        if (live.length > 0 && live.every((m) => m.version === version)) {
          current = version;
          isPinned = true;
          for (const m of live) if (m.state === "stale" || m.state === "starting") m.state = "healthy";
          wakeWaiters();
          return { engines: live.map((m) => m.engine.id) };
        }
        if (now() > deadline) {
          const states = members.map((m) => `${m.engine.id}=${m.state}@v${m.version ?? "?"}`).join(", ");
          throw new RlqError("engine_version_timeout", `engines did not all report version ${version} within ${timeoutMs} ms: ${states}`, {
            isRetriable: true,
          });
        }
        await new Promise((r) => setTimeout(r, Math.min(500, healthIntervalMs)).unref?.());
      }
    },
    pauseAdmission() {
      isPaused = true;
    },
    resumeAdmission() {
      isPaused = false;
      wakeWaiters();
    },
    async awaitReady(timeoutMs) {
      ensureStarted();
      const deadline = now() + timeoutMs;
      while (!members.some((m) => isRoutable(m))) {
        if (now() > deadline) {
          const states = members.map((m) => `${m.engine.id}=${m.state}: ${m.metrics.lastError ?? ""}`).join("; ");
          throw new RlqError("engine_unavailable", `no engine became ready within ${timeoutMs} ms (${states})`, { isRetriable: true });
        }
        await runHealthRound();
        if (!members.some((m) => isRoutable(m))) await new Promise((r) => setTimeout(r, 100).unref?.());
      }
    },
    checkHealth: () => {
      ensureStarted();
      return runHealthRound();
    },
    addMembers(engines) {
      for (const engine of engines) {
        if (byId.has(engine.id) || isClosed) continue;
        const m = newMember(engine);
        members.push(m);
        byId.set(engine.id, m);
        log.info({ engine: engine.id }, "engine added to the pool");
        if (startedAtMs !== null) void checkMember(m);
      }
    },
    snapshot() {
      const t = now();
      return {
        currentVersion: current,
        isAdmissionPaused: isPaused,
        queued: waiters.length,
        engines: members.map((m) => ({ ...m.metrics.snapshot(m.engine.id, m.state, m.version, t), seedHonoured: m.engine.seedHonoured ?? null })),
      };
    },
    engineStates: () => Object.fromEntries(members.map((m) => [m.engine.id, m.state])),
    async close() {
      isClosed = true;
      if (timer) clearInterval(timer);
      for (const m of members) for (const f of m.inflight.values()) f.controller.abort(new Error("pool closed"));
      wakeWaiters();
      await Promise.all([...pending.values()].map((e) => e.done));
      await Promise.all(members.map((m) => m.engine.close()));
    },
  };
}
