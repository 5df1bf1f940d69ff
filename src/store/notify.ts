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

import pg from "pg";
import type { Database } from "./database.ts";
import { sql } from "drizzle-orm";

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
  return new ListenConnection(url, options);
}

/**
 * The connection's life: none (`client` null, `connecting` null), connecting (`connecting` set),
 * listening (`client` set; `listening` the channels it has LISTENed on), waiting to reconnect
 * (`retryTimer` set), closed (`isClosed`, terminal). `connect` is the only writer of `client` on the
 * way up, `drop` on the way down, `close` at the end.
 */
class ListenConnection implements Notifications {
  /** `${channel}\0${runId}` → callbacks. */
  private readonly subs = new Map<string, Set<() => void>>();
  private readonly listening = new Set<Channel>();
  private client: pg.Client | null = null;
  private connecting: Promise<void> | null = null;
  private retryTimer: NodeJS.Timeout | null = null;
  private retryMs: number;
  private isClosed = false;

  constructor(
    private readonly url: string,
    private readonly options: NotificationOptions,
  ) {
    this.retryMs = options.retryMs ?? 1000;
  }

  subscribe(channel: Channel, runId: string, onWake: () => void): () => void {
    const key = `${channel}\0${runId}`;
    let set = this.subs.get(key);
    if (!set) this.subs.set(key, (set = new Set()));
    const cb = () => onWake();
    set.add(cb);
    if (!this.isClosed) void this.ensureConnected();
    return () => {
      set.delete(cb);
      if (set.size === 0) this.subs.delete(key);
    };
  }

  async close(): Promise<void> {
    this.isClosed = true;
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.retryTimer = null;
    this.subs.clear();
    // Nothing lost: closing; a failed connect or end leaves nothing to deliver.
    if (this.connecting) await this.connecting.catch(() => undefined);
    const c = this.client;
    this.client = null;
    if (c) await c.end().catch(() => undefined); // closing, as above
  }

  private wakeAll(): void {
    for (const set of this.subs.values()) for (const cb of set) cb();
  }

  private channelsInUse(): Set<Channel> {
    return new Set([...this.subs.keys()].map((k) => k.slice(0, k.indexOf("\0")) as Channel));
  }

  private scheduleReconnect(): void {
    if (this.isClosed || this.retryTimer !== null || this.subs.size === 0) return;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      void this.ensureConnected();
    }, this.retryMs);
    this.retryTimer.unref();
    this.retryMs = Math.min(this.retryMs * 2, 10_000);
  }

  private drop(c: pg.Client): void {
    if (this.client !== c) return;
    this.client = null;
    this.listening.clear();
    // Nothing lost: the connection is being dropped; its notifications are replaced by wakeAll below.
    c.end().catch(() => undefined);
    this.wakeAll();
    this.scheduleReconnect();
  }

  private ensureConnected(): Promise<void> {
    if (this.isClosed || this.client !== null) return this.listenAll();
    this.connecting ??= this.connect().finally(() => {
      this.connecting = null;
    });
    return this.connecting;
  }

  private async connect(): Promise<void> {
    const c = new pg.Client({ connectionString: this.url, application_name: this.options.applicationName ?? "rlq-listen" });
    c.on("error", () => this.drop(c));
    c.on("end", () => this.drop(c));
    c.on("notification", (n) => {
      const set = this.subs.get(`${n.channel}\0${n.payload ?? ""}`);
      if (set) for (const cb of set) cb();
    });
    try {
      await c.connect();
    } catch {
      // Nothing lost: no connection means no notifications; the reconnect wakes every subscriber.
      c.end().catch(() => undefined);
      this.scheduleReconnect();
      return;
    }
    if (this.isClosed) {
      // Nothing lost: closed while connecting; nobody listens any more.
      await c.end().catch(() => undefined);
      return;
    }
    this.client = c;
    this.retryMs = this.options.retryMs ?? 1000;
    await this.listenAll();
    this.wakeAll(); // anything sent before this connection listened was missed
  }

  private async listenAll(): Promise<void> {
    const c = this.client;
    if (c === null) return;
    for (const ch of this.channelsInUse()) {
      if (this.listening.has(ch)) continue;
      this.listening.add(ch);
      try {
        await c.query(`LISTEN ${ch}`); // a fixed identifier from the Channel type, never input
      } catch {
        this.drop(c);
        return;
      }
    }
  }
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
