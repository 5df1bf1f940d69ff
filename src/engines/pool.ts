import { generateRequestSchema, type GenerateRequest, type GenerateResult } from "./engine.ts";
import { EngineMetrics } from "./metrics.ts";
import { createMemberChecker, createVersionRefresher } from "./pool-health.ts";
import { AffinityMap, pickEngine, RoutingView } from "./pool-routing.ts";
import type { EnginePool, EnginePoolOptions, Inflight, Member, PendingEntry, PoolLog, Waiter } from "./pool-types.ts";
import { createVersionOps } from "./pool-versions.ts";
import { checkLogprobCompatibility } from "./logprob-check.ts";
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
 *
 * Health checks and admission live in pool-health.ts, version syncs in
 * pool-versions.ts, the types in pool-types.ts; this file routes and runs requests.
 */
export type { EnginePool, EnginePoolOptions, MemberState, PoolLog, PoolSnapshot } from "./pool-types.ts";

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
  const newMember = (engine: RemoteEngine): Member => {
    const fresh = { state: "starting", version: null, probe: null, isChecking: false, consecutiveErrors: 0, reserved: 0, busySinceMs: null } as const;
    return { engine, ...fresh, inflight: new Map(), metrics: new EngineMetrics(), countedErrors: new WeakSet() };
  };
  const members: Member[] = options.members.map(newMember);
  const byId = new Map(members.map((m) => [m.engine.id, m]));
  if (byId.size !== members.length) throw new RlqError("config_invalid", "engine pool: two engines have the same URL", { isRetriable: false });
  const affinity = new AffinityMap();
  const routing = new RoutingView();
  const waiters: Waiter[] = [];
  /** Requests this pool has not settled yet, by id: abort finds them here. */
  const pending = new Map<string, PendingEntry>();
  let current: number | null = null;
  let isPinned = false;
  let reload: { version: number; uri: string } | null = null;
  let isPaused = false;
  /** The engines are loading the current version (set by the caller that knows: runtime/engines.ts). */
  let isAwaitingLoad = false;
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

  // `slots` of `m` came free: wake that many waiters that may route to `m`, not all (that cost waiters x
  // engines per release: a whole core at 512 engines). A waiter that finds it taken re-queues; all re-check each second.
  function wakeForSlot(m: Member, slots = 1): void {
    const id = m.engine.id;
    for (let k = 0; k < slots; k++)
      wakeFirst((w) => {
        if (w.exclude.has(id)) return false;
        const preferred = w.sessionKey === undefined ? undefined : byId.get(affinity.get(w.sessionKey) ?? "");
        return preferred === undefined || preferred === m || !isRoutable(preferred);
      });
  }

  function wakeFirst(isFor: (w: Waiter) => boolean): void {
    const i = waiters.findIndex(isFor);
    if (i >= 0) (waiters.splice(i, 1)[0] as Waiter).wake();
  }

  function learnVersion(v: number): void {
    if (isPinned) return;
    if (current === null || v > current) {
      if (current !== null) log.info({ from: current, to: v }, "engine pool: current weight version advanced");
      moveCurrent(v);
      for (const m of members) if (m.state === "healthy" && m.version !== v) m.state = "stale";
    }
  }

  /** Loading a version flushes an engine's prefix cache (SGLang scheduler_update_weights_mixin.py): sessions are placed afresh. */
  function moveCurrent(v: number): void {
    if (current !== null && v !== current) affinity.clear();
    current = v;
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

  const checkMember = createMemberChecker({
    options,
    log,
    now,
    healthTimeoutMs,
    busyLimitMs,
    probeInput,
    current: () => current,
    reload: () => reload,
    isPaused: () => isPaused || isAwaitingLoad,
    isClosed: () => isClosed,
    startedAtMs: () => startedAtMs,
    learnVersion,
    markDead,
    wakeWaiters,
  });
  const refreshVersions = createVersionRefresher(
    { current: () => current, isClosed: () => isClosed, ensureStarted, wakeFor: (m) => wakeForSlot(m, limit - m.inflight.size - m.reserved) },
    checkMember,
  );
  const versionOps = createVersionOps({
    members,
    now,
    healthIntervalMs,
    ensureStarted,
    markDead,
    wakeWaiters,
    setReload: (r) => (reload = r),
    pin: (version) => {
      moveCurrent(version);
      isPinned = true;
    },
  });

  function runHealthRound(): Promise<void> {
    if (healthRound) return healthRound;
    healthRound = Promise.all(members.map((m) => checkMember(m))).then(() => {
      healthRound = null;
    });
    return healthRound;
  }

  /** Wait until routing may succeed (or time out). */
  function waitForChange(sessionKey: string | undefined, exclude: ReadonlySet<string>, entry: object, deadlineMs: number): Promise<void> {
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
        exclude,
        entry,
        wake: () => {
          clearTimeout(t);
          resolve();
        },
      };
      waiters.push(w);
    });
  }

  async function acquire(req: GenerateRequest, exclude: ReadonlySet<string>, entry: { abortRequested: boolean }): Promise<Member | null> {
    let deadline = now() + noEngineWaitMs;
    for (;;) {
      // Engines loading the version this pool routes to: the wait is the load's, not a failure's.
      if (isAwaitingLoad) deadline = now() + noEngineWaitMs;
      if (entry.abortRequested || isClosed) return null;
      if (!isPaused) {
        const preferred = req.sessionKey === undefined ? undefined : affinity.get(req.sessionKey);
        const d = pickEngine(routing.update(members, limit, isRoutable, exclude), preferred, rotation++);
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
      await waitForChange(req.sessionKey, exclude, entry, deadline);
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
      wakeForSlot(m);
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
    wakeFirst((w) => w.entry === entry);
    const deadline = now() + abortWaitMs;
    // A weight sync on exclusive servers: the controller's abort_all is ending this request too.
    let isServerAborting = options.isExclusive === true && isPaused;
    let isRefusalLogged = false;
    // Re-send until the request has come back: an abort that reaches the server
    // before the request does is a no-op there.
    while (!entry.isSettled) {
      const f = entry.inflight;
      const m = entry.member;
      if (f !== null && m !== null) {
        if (f.cancelReason === null) f.cancelReason = "abort";
        if (!m.engine.canAbortById || now() >= deadline || m.state === "dead") {
          f.controller.abort(new Error("aborted by caller"));
        } else if (!isServerAborting) {
          await m.engine.abort([f.rid]).catch((e: unknown) => {
            // A transient failure is re-sent on the next turn of this loop. One that will not pass
            // (an admin key the server refuses: engine_admin_unauthorized) is logged once and the
            // request is cancelled here instead: closing its connection ends it on the server too.
            if ((e instanceof RlqError && e.isRetriable) || isRefusalLogged) return;
            isRefusalLogged = true;
            log.warn(
              { engine: m.engine.id, rid: f.rid, code: e instanceof RlqError ? e.code : null, err: errorMessage(e) },
              "abort refused; cancelling locally",
            );
            f.controller.abort(new Error("abort refused by the server"));
          });
        }
      }
      isServerAborting = false;
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
    ...versionOps,
    async weightVersion() {
      ensureStarted();
      if (current !== null) return current;
      await runHealthRound();
      if (current === null) throw new RlqError("engine_unavailable", "no engine in the pool reported a weight version", { isRetriable: true });
      return current;
    },
    currentVersion: () => current,
    async abortAll() {
      await Promise.all(
        members.map(async (m) => {
          if (m.state === "dead" || m.state === "refused" || !m.engine.abortAll) return;
          await m.engine
            .abortAll()
            .catch((e: unknown) => log.warn({ engine: m.engine.id, err: errorMessage(e) }, "abort_all failed; the requests are aborted by id"));
        }),
      );
    },
    pauseAdmission() {
      isPaused = true;
    },
    resumeAdmission() {
      isPaused = false;
      wakeWaiters();
    },
    setAwaitingLoad(isAwaiting) {
      isAwaitingLoad = isAwaiting;
    },
    isAwaitingLoad: () => isAwaitingLoad,
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
    refreshVersions: () => refreshVersions(members),
    refreshLoaded: () => refreshVersions(members, true),
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
