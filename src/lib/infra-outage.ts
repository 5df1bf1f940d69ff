/**
 * @file Postgres or Redis out of reach for now (an outage), told apart from failures of the work,
 * and the wait that rides one out. queue/worker-host.ts runs every job through
 * `retryThroughOutages`, so an outage never spends a job's attempts (docs/deploy.md, "Outages").
 *
 * What counts as an outage, walking an error's `cause` chain (drizzle wraps pg's error as the
 * cause of its "Failed query"):
 * - a Postgres SQLSTATE of connection exception (08000, 08001, 08003, 08004, 08006) or of an
 *   operator intervention that ends connections (57P01 admin shutdown, 57P02 crash shutdown,
 *   57P03 cannot connect now: starting up, shutting down, in recovery);
 * - pg's own messages for a dropped connection ("Connection terminated unexpectedly",
 *   "Connection terminated", "... due to connection timeout", "Client has encountered a
 *   connection error and is not queryable") and pg-pool's "timeout exceeded when trying to
 *   connect";
 * - ioredis giving up on a command (MaxRetriesPerRequestError) or "Connection is closed.";
 * - a socket error (ECONNREFUSED, ECONNRESET, EPIPE, ETIMEDOUT, EHOSTUNREACH, ENETUNREACH,
 *   EAI_AGAIN), alone or inside an AggregateError (Node's happy-eyeballs connect).
 * The walk stops at an RlqError: rlq's HTTP clients wrap an engine's or a trainer's socket errors
 * in one (engine_unreachable, trainer_unreachable, http_unreachable), and those have their own
 * waits and retries; an outage past the wait is `infra_unreachable`, not an outage again. It
 * stops at undici's "fetch failed" for the same reason. Anything else (a constraint violation,
 * a missing relation, a bug) is the work's failure and spends an attempt as before.
 */

import { RlqError } from "./errors.ts";

const PG_OUTAGE_CODES = new Set(["08000", "08001", "08003", "08004", "08006", "57P01", "57P02", "57P03"]);
const SOCKET_CODES = new Set(["ECONNREFUSED", "ECONNRESET", "EPIPE", "ETIMEDOUT", "EHOSTUNREACH", "ENETUNREACH", "EAI_AGAIN"]);
const DRIVER_MESSAGES =
  /^(Connection terminated( unexpectedly| due to connection timeout)?|Client has encountered a connection error and is not queryable|timeout exceeded when trying to connect|Connection is closed\.?)$/;

export function isInfrastructureOutage(e: unknown): boolean {
  for (let c: unknown = e, depth = 0; c instanceof Error && depth < 8; c = c.cause, depth++) {
    if (c instanceof RlqError) return false;
    if (c instanceof TypeError && c.message === "fetch failed") return false;
    const code = (c as { code?: unknown }).code;
    if (typeof code === "string" && (PG_OUTAGE_CODES.has(code) || SOCKET_CODES.has(code))) return true;
    if (c.name === "MaxRetriesPerRequestError" || DRIVER_MESSAGES.test(c.message)) return true;
    if (c instanceof AggregateError && c.errors.length > 0 && c.errors.every((x) => isInfrastructureOutage(x))) return true;
  }
  return false;
}

/** A call that ran this long before it met an outage starts a new outage clock: only failures back to back count. */
export const HEALTHY_RUN_MS = 30_000;

export interface OutageWaitOptions {
  /** How long failures back to back may last before the error goes through (RLQ_OUTAGE_TIMEOUT_S). */
  timeoutMs: number;
  /** Aborted: stop waiting and throw `worker_shutdown` (the job goes back without an attempt). */
  signal: AbortSignal;
  /** Each wait, before it sleeps: how long the outage has lasted, the error, the sleep ahead. */
  onWait(waitedMs: number, error: unknown, delayMs: number): void;
  now?: () => number;
}

/**
 * `run()` until it settles with anything but an outage. Between tries it sleeps 1 s doubling to
 * 10 s (a managed Postgres fails over in 30-120 s; a short first sleep rides out a restart).
 * Once failures back to back have lasted `timeoutMs`, the last one goes through as
 * `infra_unreachable` (retriable), so the job spends an attempt and its failure names the wait.
 * `run()` is called again from the start: callers pass work that is idempotent (every job is).
 */
export async function retryThroughOutages<T>(run: () => Promise<T>, opts: OutageWaitOptions): Promise<T> {
  const now = opts.now ?? Date.now;
  let since: number | null = null;
  let tries = 0;
  for (;;) {
    const startedAt = now();
    try {
      return await run();
    } catch (e) {
      if (!isInfrastructureOutage(e)) throw e;
      if (opts.signal.aborted) throw shutdownError(e);
      const t = now();
      if (since === null || t - startedAt >= HEALTHY_RUN_MS) {
        since = t;
        tries = 0;
      }
      const waitedMs = t - since;
      if (waitedMs >= opts.timeoutMs) {
        throw new RlqError(
          "infra_unreachable",
          `Postgres or Redis unreachable for ${Math.round(waitedMs / 1000)} s (RLQ_OUTAGE_TIMEOUT_S ${opts.timeoutMs / 1000}): ${(e as Error).message}`,
          { cause: e },
        );
      }
      const delayMs = Math.min(1000 * 2 ** tries, 10_000, opts.timeoutMs - waitedMs);
      tries += 1;
      opts.onWait(waitedMs, e, delayMs);
      await sleep(delayMs, opts.signal);
      if (opts.signal.aborted) throw shutdownError(e);
    }
  }
}

function shutdownError(e: unknown): RlqError {
  return new RlqError("worker_shutdown", `the worker is shutting down during a Postgres or Redis outage: ${(e as Error).message}`, { cause: e });
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}
