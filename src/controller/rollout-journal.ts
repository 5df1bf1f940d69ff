/**
 * The replay journal of one step of a user rollout function
 * (`rollout_function_path`, docs/plugins.md). The function is a deterministic
 * planner: it only talks to the world through `ctx` calls, and each call is
 * keyed by its ordinal in the step (the order the function made the calls).
 *
 * - A call whose record is in the decision log (written in the same
 *   transaction as its effect) is *replayed*: the effect is not performed
 *   again and its result comes from the record and the facts. A call without
 *   a record is performed live and its record written.
 * - Results are delivered to the function **in call order**, one at a time,
 *   and after each delivery the function runs until it blocks again (the
 *   microtask queue drains). So what the function observes — the sequence of
 *   results and therefore the sequence of its own calls — does not depend on
 *   which job happened to finish first, and a restarted controller that
 *   replays the log sees exactly what the crashed one saw (Temporal's
 *   workflow activations, reduced to one result per activation).
 * - On replay, call k must be the same operation with the same arguments as
 *   record k; anything else is a non-deterministic function (a clock,
 *   unseeded randomness, outside I/O) and is reported as such, never papered
 *   over: continuing would draw or generate twice.
 *
 * Pure bookkeeping: no I/O here; the driver (rollout-function.ts) performs
 * the effects and polls the facts.
 */

import { RlqError } from "../lib/errors.ts";

export type CallOp = "draw" | "generate" | "filter_dynamic" | "add_to_buffer";

/** What replay compares: the operation and its canonical arguments ("n=6", "group=12", "groups=3,7"). */
export interface CallRecord {
  ordinal: number;
  op: CallOp;
  key: string;
}

export type CallOutcome = { ok: true; value: unknown } | { ok: false; error: unknown };

export interface JournalCall<R extends CallRecord, I> {
  readonly ordinal: number;
  readonly op: CallOp;
  readonly key: string;
  readonly input: I;
  /** Replayed from the log, or written by the live effect; null until the call is effected. */
  record: R | null;
  /** The result, once known; delivered to the function in ordinal order. */
  outcome: CallOutcome | null;
}

export interface JournalEffects<R extends CallRecord, I> {
  /**
   * Effect a run of new calls, in ordinal order: replay those with a record
   * (`call.record` is already set and checked), perform the others and set
   * their record. May set outcomes (a draw's groups, a filter's verdict).
   */
  effect(calls: ReadonlyArray<JournalCall<R, I>>): Promise<void>;
  /** Look for results of effected calls still waiting (a generate's round and rewards). */
  poll(calls: ReadonlyArray<JournalCall<R, I>>): Promise<void>;
  /** Called synchronously just before a call's result is handed to the function. */
  delivered(call: JournalCall<R, I>): void;
}

export class NonDeterminismError extends RlqError {
  constructor(message: string) {
    super("rollout_fn_nondeterministic", message);
    this.name = "NonDeterminismError";
  }
}

/** Let the function run until it blocks on a ctx result again (every queued microtask runs first). */
export function drainMicrotasks(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

const DETERMINISM_HINT = "a rollout function must be deterministic given its ctx results (no clock, no unseeded randomness, no I/O outside ctx)";

export class CallJournal<R extends CallRecord, I> {
  readonly calls: Array<JournalCall<R, I>> = [];
  private readonly settlers: Array<{ resolve(v: unknown): void; reject(e: unknown): void }> = [];
  private delivered = 0;
  private returned: CallOutcome | null = null;
  private readonly records: readonly R[];

  /**
   * @param records the step's recorded calls (ordinals 0..m-1)
   * @param where names the function and the step in messages: "rollout_function_path f.ts step 3"
   */
  constructor(
    records: readonly R[],
    private readonly where: string,
  ) {
    this.records = [...records].sort((a, b) => a.ordinal - b.ordinal);
    this.records.forEach((r, i) => {
      if (r.ordinal !== i) throw new RlqError("decision_log_corrupt", `${where}: recorded ctx calls are not gapless (ordinal ${r.ordinal} at position ${i})`);
    });
  }

  /** How many calls the log holds for this step. */
  get recordedCount(): number {
    return this.records.length;
  }

  /** The function's own outcome once it returned or threw (null while it runs). */
  get result(): CallOutcome | null {
    return this.returned;
  }

  /** Run the function; it proceeds up to its first blocking ctx call. */
  async start(fn: () => unknown): Promise<void> {
    void Promise.resolve()
      .then(fn)
      .then(
        (value) => {
          this.returned = { ok: true, value };
        },
        (error: unknown) => {
          this.returned = { ok: false, error };
        },
      );
    await drainMicrotasks();
  }

  /** A ctx method makes a call: it gets the next ordinal and a promise of its result. */
  issue(op: CallOp, key: string, input: I): Promise<unknown> {
    const ordinal = this.calls.length;
    const promise = new Promise<unknown>((resolve, reject) => {
      this.settlers.push({ resolve, reject });
    });
    // A call the function never awaits must not become an unhandled rejection (it would kill the
    // process); the function's own outcome carries any error it does observe.
    promise.catch(() => undefined);
    this.calls.push({ ordinal, op, key, input, record: null, outcome: null });
    return promise;
  }

  /** The record for `call`, checked against what the function asks for now (null: a new call). */
  private match(call: JournalCall<R, I>): R | null {
    const rec = this.records[call.ordinal];
    if (!rec) return null;
    if (rec.op !== call.op || rec.key !== call.key) {
      throw new NonDeterminismError(
        `${this.where}: ctx call #${call.ordinal} is ${call.op}(${call.key}) on replay but was recorded as ${rec.op}(${rec.key}): ${DETERMINISM_HINT}`,
      );
    }
    return rec;
  }

  /**
   * Drive the step as far as it goes now: effect new calls, poll for results,
   * deliver them in order, repeat while the function makes progress.
   * Returns whether anything happened.
   */
  async advance(effects: JournalEffects<R, I>): Promise<boolean> {
    let progressed = false;
    for (;;) {
      const fresh = this.calls.filter((c) => c.record === null);
      if (fresh.length > 0) {
        for (const c of fresh) c.record = this.match(c);
        await effects.effect(fresh);
        const missed = fresh.find((c) => c.record === null);
        if (missed) throw new RlqError("invariant_violated", `${this.where}: ctx call #${missed.ordinal} (${missed.op}) was not effected`);
        progressed = true;
      }
      const waiting = this.calls.slice(this.delivered).filter((c) => c.outcome === null);
      if (waiting.length > 0) await effects.poll(waiting);
      const n = await this.deliver(effects);
      if (n === 0) return progressed;
      progressed = true;
    }
  }

  private async deliver(effects: JournalEffects<R, I>): Promise<number> {
    let n = 0;
    // Once the function has returned nothing more is delivered: what it saw at return is what the
    // step's outcome is built from, and replay must see the same.
    while (this.returned === null) {
      const c = this.calls[this.delivered];
      if (!c?.outcome) break;
      const settle = this.settlers[c.ordinal];
      if (!settle) throw new RlqError("invariant_violated", `${this.where}: no settler for ctx call #${c.ordinal}`);
      this.delivered++;
      effects.delivered(c);
      if (c.outcome.ok) settle.resolve(c.outcome.value);
      else settle.reject(c.outcome.error);
      n++;
      await drainMicrotasks();
    }
    return n;
  }

  /** After the function returned: on replay it must have made every recorded call again. */
  checkReplayComplete(): void {
    if (this.calls.length < this.records.length) {
      const next = this.records[this.calls.length] as R;
      throw new NonDeterminismError(
        `${this.where}: the function returned after ${this.calls.length} ctx call(s) on replay, but ${this.records.length} were recorded ` +
          `(the next was ${next.op}(${next.key})): ${DETERMINISM_HINT}`,
      );
    }
  }
}
