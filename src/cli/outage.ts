/**
 * How `rlq up` rides out a Postgres or Redis outage (docs/deploy.md, "Outages").
 *
 * A controller that stops with an outage error (`isOutageError`: its lease connection died with a
 * Postgres restart, an enqueue failed while Redis was down) is started again with backoff (1 s
 * doubling to 10 s); any other error stops that run's controller in this process, as before;
 * it takes the run's lease anew, so the log stays fenced. The same clock covers the process's
 * own reads (the run list). While the failures last less than `RLQ_OUTAGE_TIMEOUT_S` nothing
 * else happens; past it `rlq up` exits with code 75 (EX_TEMPFAIL) and a line naming the run,
 * the length of the outage and the last error, so that a supervisor restarts it (and notices
 * a failure that is not an outage). A controller that ran for 30 s before failing starts a
 * new outage clock: only failures back to back count.
 */
export const OUTAGE_EXIT_CODE = 75;

const netCodes = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EHOSTDOWN",
  "ENOTFOUND",
  "EAI_AGAIN",
  "lease_lost",
]);
const outageText =
  /connection terminated|connection is closed|not yet accepting connections|the database system is (starting up|shutting down|in recovery)|terminating connection|server closed the connection|Client has encountered a connection error|timeout exceeded when trying to connect|Connection is closed|MaxRetriesPerRequest|max retries per request|ECONNREFUSED|ECONNRESET|ETIMEDOUT|EHOSTUNREACH/i;

/**
 * An error that says Postgres or Redis (or the way to them) is gone for now, rather than a
 * mistake: a network error code, a Postgres connection class (08xxx) or shutdown (57P0x) code,
 * a lost lease, or the drivers' messages for a dropped connection.
 */
export function isOutageError(e: unknown): boolean {
  for (let c: unknown = e, depth = 0; c instanceof Error && depth < 6; c = (c as { cause?: unknown }).cause, depth++) {
    const code = (c as { code?: unknown }).code;
    if (typeof code === "string" && (netCodes.has(code) || code.startsWith("08") || code.startsWith("57P"))) return true;
    if (outageText.test(c.message)) return true;
    if (c instanceof AggregateError && c.errors.some((x) => isOutageError(x))) return true;
  }
  return false;
}
const HEALTHY_RUN_MS = 30_000;

export interface OutageClock {
  /** A failure now of something that had been running since `startedAt`. Returns the retry delay. */
  failed(key: string, startedAt: number, error: string): number;
  /** A success: that key's outage is over. */
  ok(key: string): void;
  /** The failure that has lasted longer than the bound, if any. */
  expired(): { key: string; forMs: number; error: string } | null;
}

export function createOutageClock(timeoutMs: number, now: () => number = Date.now): OutageClock {
  const since = new Map<string, { at: number; tries: number; error: string }>();
  return {
    failed(key, startedAt, error) {
      const t = now();
      let s = since.get(key);
      if (!s || t - startedAt >= HEALTHY_RUN_MS) s = { at: t, tries: 0, error };
      s.tries += 1;
      s.error = error;
      since.set(key, s);
      return Math.min(1000 * 2 ** (s.tries - 1), 10_000);
    },
    ok(key) {
      since.delete(key);
    },
    expired() {
      const t = now();
      for (const [key, s] of since) if (t - s.at > timeoutMs) return { key, forMs: t - s.at, error: s.error };
      return null;
    },
  };
}

/** A store that has not answered a probe for this long counts as failing (a Redis client queues commands while it reconnects, so they hang rather than fail). */
export const PROBE_TIMEOUT_MS = 5_000;
const PROBE_EVERY_MS = 2_000;

export interface ServiceProbe {
  /**
   * Start a probe when none is in flight and the last began PROBE_EVERY_MS ago. Returns "ok" once
   * a probe answered, the error of one that failed or has gone unanswered for PROBE_TIMEOUT_MS,
   * and null while there is nothing new to say.
   */
  poll(): "ok" | { error: string } | null;
}

/**
 * Probes a service that rlq up otherwise meets only inside calls that wait for it forever: the
 * queue store (Redis, whose client holds commands until it reconnects; or BullMQ's Postgres
 * backend). A controller blocked on it neither fails nor progresses, so without the probe an
 * outage of the queue store never reaches the outage clock and rlq up never exits 75.
 */
export function createServiceProbe(call: () => Promise<unknown>, now: () => number = Date.now): ServiceProbe {
  let inFlightSince: number | null = null;
  let lastStartAt = -Infinity;
  let settled: "ok" | { error: string } | null = null;
  return {
    poll() {
      const t = now();
      if (settled !== null) {
        const s = settled;
        settled = null;
        return s;
      }
      if (inFlightSince !== null) return t - inFlightSince >= PROBE_TIMEOUT_MS ? { error: `no answer for ${Math.round((t - inFlightSince) / 1000)} s` } : null;
      if (t - lastStartAt < PROBE_EVERY_MS) return null;
      inFlightSince = t;
      lastStartAt = t;
      call().then(
        () => {
          settled = "ok";
          inFlightSince = null;
        },
        (e: unknown) => {
          settled = { error: (e as Error).message };
          inFlightSince = null;
        },
      );
      return null;
    },
  };
}
