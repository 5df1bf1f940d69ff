import pg from "pg";
import type { Database } from "./database.ts";
import { sql } from "drizzle-orm";

/**
 * Wake-ups over Postgres LISTEN/NOTIFY: a hint that a run's facts changed, so
 * a waiter looks now instead of at its next poll. Never the fact itself:
 * every waiter still reads Postgres, and still polls on its interval, so a
 * lost notification (the listening connection down, a database restart, a
 * pooler in transaction mode that drops LISTEN) costs latency, never
 * correctness.
 *
 * Four channels, payload the run id:
 * - `rlq_facts`: a round, rewards, a train step or eval results landed (the
 *   controller waits on it between ticks);
 * - `rlq_abort`: the controller committed decisions that abort rounds (a
 *   step's seal, a weight sync's `group.aborted`); rollout jobs watching those
 *   rounds look at once instead of at their next abort poll;
 * - `rlq_weights`: the weight sync's part of the log advanced (`weights.syncing`
 *   or `weights.synced` recorded, or the controller's load of a sync's version
 *   ended on some engines): a rollout worker's router reads the log and moves
 *   (runtime/engines.ts `RunRouter`, core/weight-sync.ts `RouterMode`);
 * - `rlq_kept`: the controller kept groups for a step's batch: the train
 *   worker reads them before the seal (jobs/batch-stager.ts).
 *
 * NOTIFY is transactional: sent inside a transaction it is delivered at
 * commit, so a woken waiter always finds the fact.
 */
export type Channel = "rlq_facts" | "rlq_abort" | "rlq_weights" | "rlq_kept";

export interface Notifications {
  /** `onWake` runs on every notification for `runId` on `channel`, and whenever notifications may have been missed (reconnect). */
  subscribe(channel: Channel, runId: string, onWake: () => void): () => void;
  close(): Promise<void>;
}

/** NOTIFY each run id on `channel` after its facts committed (a hint: a failure here is ignored). */
export async function notifyRuns(pool: pg.Pool, channel: Channel, runIds: Iterable<string>): Promise<void> {
  const ids = [...new Set(runIds)];
  if (ids.length === 0) return;
  // Nothing lost: a hint; every waiter still polls the facts on its interval.
  await pool.query(`SELECT pg_notify($1, r) FROM unnest($2::text[]) AS r`, [channel, ids]).catch(() => undefined);
}

/** A hint for one run, sent at most once per event-loop turn however often it is asked for in that turn (many engines' loads ending together). */
export function coalescedNotifier(pool: pg.Pool, channel: Channel, runId: string): () => void {
  let isScheduled = false;
  return () => {
    if (isScheduled) return;
    isScheduled = true;
    setImmediate(() => {
      isScheduled = false;
      void notifyRuns(pool, channel, [runId]);
    });
  };
}

/** NOTIFY inside a transaction: delivered when it commits, never if it rolls back. */
export async function notifyInTx(tx: Database, channel: Channel, runId: string): Promise<void> {
  await tx.execute(sql`SELECT pg_notify(${channel}, ${runId})`);
}

export interface NotificationOptions {
  applicationName?: string;
  /** First reconnect delay; doubles up to 10 s. */
  retryMs?: number;
}

/**
 * One LISTEN connection per process, opened on the first subscription and
 * kept while any subscription lives. It reconnects after an error or a
 * server restart (1 s, doubling to 10 s) and wakes every subscriber when it
 * does: notifications sent while it was down are lost.
 */
export function createNotifications(url: string, options: NotificationOptions = {}): Notifications {
  const subs = new Map<string, Set<() => void>>(); // `${channel}\0${runId}` → callbacks
  const listening = new Set<Channel>();
  let client: pg.Client | null = null;
  let connecting: Promise<void> | null = null;
  let retryTimer: NodeJS.Timeout | null = null;
  let retryMs = options.retryMs ?? 1000;
  let closed = false;

  const wakeAll = () => {
    for (const set of subs.values()) for (const cb of set) cb();
  };
  const channelsInUse = () => new Set([...subs.keys()].map((k) => k.slice(0, k.indexOf("\0")) as Channel));

  const scheduleReconnect = () => {
    if (closed || retryTimer !== null || subs.size === 0) return;
    retryTimer = setTimeout(() => {
      retryTimer = null;
      void ensureConnected();
    }, retryMs);
    retryTimer.unref();
    retryMs = Math.min(retryMs * 2, 10_000);
  };

  const drop = (c: pg.Client) => {
    if (client !== c) return;
    client = null;
    listening.clear();
    // Nothing lost: the connection is being dropped; its notifications are replaced by wakeAll below.
    c.end().catch(() => undefined);
    wakeAll();
    scheduleReconnect();
  };

  const ensureConnected = (): Promise<void> => {
    if (closed || client !== null) return listenAll();
    connecting ??= (async () => {
      const c = new pg.Client({ connectionString: url, application_name: options.applicationName ?? "rlq-listen" });
      c.on("error", () => drop(c));
      c.on("end", () => drop(c));
      c.on("notification", (n) => {
        const set = subs.get(`${n.channel}\0${n.payload ?? ""}`);
        if (set) for (const cb of set) cb();
      });
      try {
        await c.connect();
      } catch {
        // Nothing lost: no connection means no notifications; the reconnect wakes every subscriber.
        c.end().catch(() => undefined);
        scheduleReconnect();
        return;
      }
      if (closed) {
        // Nothing lost: closed while connecting; nobody listens any more.
        await c.end().catch(() => undefined);
        return;
      }
      client = c;
      retryMs = options.retryMs ?? 1000;
      await listenAll();
      wakeAll(); // anything sent before this connection listened was missed
    })().finally(() => {
      connecting = null;
    });
    return connecting;
  };

  const listenAll = async (): Promise<void> => {
    const c = client;
    if (c === null) return;
    for (const ch of channelsInUse()) {
      if (listening.has(ch)) continue;
      listening.add(ch);
      try {
        await c.query(`LISTEN ${ch}`); // a fixed identifier from the Channel type, never input
      } catch {
        drop(c);
        return;
      }
    }
  };

  return {
    subscribe(channel, runId, onWake) {
      const key = `${channel}\0${runId}`;
      let set = subs.get(key);
      if (!set) subs.set(key, (set = new Set()));
      const cb = () => onWake();
      set.add(cb);
      if (!closed) void ensureConnected();
      return () => {
        set.delete(cb);
        if (set.size === 0) subs.delete(key);
      };
    },
    async close() {
      closed = true;
      if (retryTimer) clearTimeout(retryTimer);
      retryTimer = null;
      subs.clear();
      // Nothing lost: closing; a failed connect or end leaves nothing to deliver.
      if (connecting) await connecting.catch(() => undefined);
      const c = client;
      client = null;
      if (c) await c.end().catch(() => undefined); // closing, as above
    },
  };
}

/**
 * A sticky wake flag for a loop: `clear()` before it reads the facts,
 * `wait(ms)` after; a wake-up that came in between ends the wait at once.
 */
export interface Waker {
  readonly wake: () => void;
  readonly clear: () => void;
  readonly wait: (ms: number, signal?: AbortSignal) => Promise<void>;
}

export function createWaker(): Waker {
  let woken = false;
  let resolveWait: (() => void) | null = null;
  return {
    wake: () => {
      woken = true;
      resolveWait?.();
    },
    clear: () => {
      woken = false;
    },
    wait: (ms, signal) => {
      if (woken || signal?.aborted) return Promise.resolve();
      return new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(t);
          signal?.removeEventListener("abort", done);
          resolveWait = null;
          resolve();
        };
        const t = setTimeout(done, ms);
        resolveWait = done;
        signal?.addEventListener("abort", done, { once: true });
      });
    },
  };
}
