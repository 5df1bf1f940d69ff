/**
 * @file The pool's requests: routing each to an engine (least outstanding requests among routable
 * engines, a per-engine cap, prefix affinity by `sessionKey`; requests beyond every cap wait in
 * FIFO order), running it, retrying one that failed before any token on another engine, and
 * aborting by id. Which engines are routable is the router's and the engines' modes (PoolState,
 * pool-state.ts); this file changes neither except through PoolState.
 */
import { generateRequestSchema, type GenerateRequest, type GenerateResult } from "./engine.ts";
import type { HealthMonitor } from "./pool-health.ts";
import { pickEngine, RoutingView } from "./pool-routing.ts";
import type { PoolState } from "./pool-state.ts";
import type { EnginePoolOptions, Inflight, Member, PendingEntry } from "./pool-types.ts";
import { checkLogprobCompatibility } from "./logprob-check.ts";
import { abortedResult, emptyPartial, isRequestError, type PartialOutput } from "./remote.ts";
import { isAdmitting } from "../core/weight-sync.ts";
import { RlqError, errorMessage } from "../lib/errors.ts";

/** The rid one attempt of a request has on the server: unique per attempt, never a prefix of another. */
export function serverRid(requestId: string, attempt: number): string {
  return `${requestId}.a${attempt}.`;
}

type Attempt = { result: GenerateResult; cancel: Inflight["cancelReason"] } | { error: unknown; partial: PartialOutput; cancel: Inflight["cancelReason"] };

export class RequestRunner {
  /** Requests this pool has not settled yet, by id: abort finds them here. */
  readonly pending = new Map<string, PendingEntry>();
  private readonly routing = new RoutingView();
  private rotation = 0;
  private readonly maxAttempts: number;
  private readonly noEngineWaitMs: number;
  private readonly abortWaitMs: number;

  constructor(
    private readonly pool: PoolState,
    private readonly health: HealthMonitor,
    private readonly options: EnginePoolOptions,
  ) {
    this.maxAttempts = options.maxAttempts ?? 3;
    this.noEngineWaitMs = options.noEngineWaitMs ?? 120_000;
    this.abortWaitMs = options.abortWaitMs ?? 10_000;
  }

  async generate(request: GenerateRequest): Promise<GenerateResult> {
    const req = generateRequestSchema.parse(request);
    this.health.ensureStarted();
    // The same id again while the first is still here: a retried rollout job whose first attempt's
    // requests are still pending. The newer caller wins: the old request is aborted (its caller gets
    // an aborted partial, which that dead attempt will not write) and this one starts once it is gone.
    for (let superseded = this.pending.get(req.requestId); superseded !== undefined && !superseded.isSettled; superseded = this.pending.get(req.requestId)) {
      this.pool.log.warn({ requestId: req.requestId }, "request id already in flight in this pool (a retried job?): aborting the older request");
      await this.abort(req.requestId);
      await superseded.done;
    }
    const entry: PendingEntry = { abortRequested: false, isSettled: false, inflight: null, member: null, done: Promise.resolve() };
    this.pending.set(req.requestId, entry);
    const promise = this.attempts(req, entry);
    const settle = () => void (entry.isSettled = true);
    entry.done = promise.then(settle, settle);
    try {
      return await promise;
    } finally {
      if (this.pending.get(req.requestId) === entry) this.pending.delete(req.requestId);
    }
  }

  /** Up to `maxAttempts` engines for one request; tokens already generated come back as an aborted partial. */
  private async attempts(req: GenerateRequest, entry: PendingEntry): Promise<GenerateResult> {
    const failed = new Set<string>();
    let lastError: unknown = null;
    for (let attempt = 1; attempt <= this.maxAttempts; attempt++) {
      const m = await this.acquire(req, failed, entry);
      if (m === null) return abortedResult(emptyPartial(), "none", this.pool.current ?? 0);
      const out = await this.runOn(m, req, entry, attempt);
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
        return abortedResult(out.partial, m.engine.id, this.pool.current ?? m.version ?? 0);
      }
      failed.add(m.engine.id);
      this.countFailure(m, e);
    }
    throw new RlqError("engine_request_failed", `request ${req.requestId} failed on ${this.maxAttempts} attempt(s): ${errorMessage(lastError)}`, {
      cause: lastError,
      isRetriable: true,
    });
  }

  /**
   * One failed HTTP call is one failure, however many requests it carried (the SGLang adapter's
   * non-streaming batches reject every request of one with the same error). Unreachable or slow:
   * a health check decides; three failures in a row: the engine leaves the rotation.
   */
  private countFailure(m: Member, e: unknown): void {
    if (typeof e !== "object" || e === null || !m.countedErrors.has(e)) {
      if (typeof e === "object" && e !== null) m.countedErrors.add(e);
      m.consecutiveErrors++;
    }
    if (e instanceof RlqError && (e.code === "engine_unreachable" || e.code === "engine_timeout")) void this.health.check(m);
    else if (m.consecutiveErrors >= 3) this.pool.markDead(m, `3 consecutive failed requests: ${errorMessage(e)}`);
  }

  /** An engine with a free slot for `req`, waiting while none has one (or the router holds requests). */
  private async acquire(req: GenerateRequest, exclude: ReadonlySet<string>, entry: { abortRequested: boolean }): Promise<Member | null> {
    const pool = this.pool;
    let deadline = pool.now() + this.noEngineWaitMs;
    for (;;) {
      // Engines loading the version this pool routes to: the wait is the load's, not a failure's.
      if (pool.router.kind === "awaitingLoad") deadline = pool.now() + this.noEngineWaitMs;
      if (entry.abortRequested || pool.isClosed) return null;
      if (isAdmitting(pool.router)) {
        const preferred = req.sessionKey === undefined ? undefined : pool.affinity.get(req.sessionKey);
        const d = pickEngine(
          this.routing.update(pool.members, pool.limit, (m) => pool.isRoutable(m), exclude),
          preferred,
          this.rotation++,
        );
        if (d.kind === "engine") {
          const m = pool.byId.get(d.id) as Member;
          // Hold the slot now: runOn registers the request only after this function returns.
          m.reserved++;
          if (req.sessionKey !== undefined) pool.affinity.set(req.sessionKey, m.engine.id);
          return m;
        }
        // Only engines this request already failed on are left: let it try them again.
        if (d.kind === "none" && exclude.size > 0 && pool.members.some((m) => pool.isRoutable(m))) return this.acquire(req, new Set(), entry);
      }
      if (pool.now() > deadline) {
        throw new RlqError(
          "engine_unavailable",
          `no engine could take request ${req.requestId} within ${this.noEngineWaitMs} ms (current version ${pool.current ?? "unknown"}; ${pool.describe()})`,
          { isRetriable: true },
        );
      }
      await pool.queue.wait(req.sessionKey, exclude, entry, deadline);
    }
  }

  private async runOn(m: Member, req: GenerateRequest, entry: PendingEntry, attempt: number): Promise<Attempt> {
    const pool = this.pool;
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
    const t0 = pool.now();
    try {
      if (m.probe) checkLogprobCompatibility(m.probe, req.sampling, m.engine.id);
      const result = await m.engine.generateWith({ ...req, requestId: rid }, { partial: f.partial, signal: controller.signal });
      const outcome = result.finishReason === "abort" ? "aborted" : "completed";
      m.metrics.finished(outcome, pool.now() - t0, result.tokenIds.length, pool.now());
      m.consecutiveErrors = 0;
      if (pool.current !== null && result.weightVersion !== pool.current) m.metrics.versionMismatches++;
      // Answers carry the server's live version: a process whose pool did not run the sync (a
      // rollout worker) learns the new version here instead of at its next health round.
      if (result.tokenIds.length > 0 && (m.version === null || result.weightVersion > m.version)) {
        m.version = result.weightVersion;
        pool.moveRouter({ kind: "reported", version: result.weightVersion });
      }
      return { result, cancel: f.cancelReason };
    } catch (error) {
      // A request's own fault (a prompt over the context length) is not the engine's.
      const isRejected = isRequestError(error);
      m.metrics.finished(isRejected ? "rejected" : "error", pool.now() - t0, isRejected ? 0 : f.partial.tokenIds.length, pool.now());
      if (!isRejected) m.metrics.lastError = errorMessage(error);
      return { error, partial: f.partial, cancel: f.cancelReason };
    } finally {
      m.inflight.delete(req.requestId);
      entry.inflight = null;
      settle();
      pool.wakeForSlot(m);
    }
  }

  /** Abort one request: by id on its server (re-sent until it comes back), or locally after `abortWaitMs`. */
  async abort(requestId: string): Promise<void> {
    const pool = this.pool;
    const entry = this.pending.get(requestId);
    if (!entry) return;
    entry.abortRequested = true;
    pool.queue.wakeFirst((w) => w.entry === entry);
    const deadline = pool.now() + this.abortWaitMs;
    // A weight sync on exclusive servers: the controller's abort_all is ending this request too.
    let isServerAborting = this.options.isExclusive === true && pool.router.kind === "held";
    let isRefusalLogged = false;
    // Re-send until the request has come back: an abort that reaches the server
    // before the request does is a no-op there.
    while (!entry.isSettled) {
      const f = entry.inflight;
      const m = entry.member;
      if (f !== null && m !== null) {
        if (f.cancelReason === null) f.cancelReason = "abort";
        if (!m.engine.canAbortById || pool.now() >= deadline || m.mode === "dead") {
          f.controller.abort(new Error("aborted by caller"));
        } else if (!isServerAborting) {
          await m.engine.abort([f.rid]).catch((e: unknown) => {
            // A transient failure is re-sent on the next turn of this loop. One that will not pass
            // (an admin key the server refuses: engine_admin_unauthorized) is logged once and the
            // request is cancelled here instead: closing its connection ends it on the server too.
            if ((e instanceof RlqError && e.isRetriable) || isRefusalLogged) return;
            isRefusalLogged = true;
            pool.log.warn(
              { engine: m.engine.id, rid: f.rid, code: e instanceof RlqError ? e.code : null, err: errorMessage(e) },
              "abort refused; cancelling locally",
            );
            f.controller.abort(new Error("abort refused by the server"));
          });
        }
      }
      isServerAborting = false;
      const waitMs = Math.max(0, Math.min(500, deadline - pool.now()));
      await Promise.race([entry.done, new Promise((r) => setTimeout(r, waitMs).unref?.())]);
    }
  }
}
