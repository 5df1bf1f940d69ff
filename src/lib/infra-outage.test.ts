import { describe, expect, it } from "vitest";
import { RlqError } from "./errors.ts";
import { isInfrastructureOutage, retryThroughOutages } from "./infra-outage.ts";

const withCode = (message: string, code: string) => Object.assign(new Error(message), { code });
/** drizzle's shape: "Failed query: ..." with pg's error as the cause. */
const failedQuery = (cause: unknown) => new Error('Failed query: select * from "decisions"', { cause });

describe("isInfrastructureOutage", () => {
  it("knows Postgres and Redis out of reach, through drizzle's wrapper", () => {
    for (const e of [
      withCode("connect ECONNREFUSED 127.0.0.1:5432", "ECONNREFUSED"),
      failedQuery(withCode("terminating connection due to administrator command", "57P01")),
      failedQuery(withCode("the database system is starting up", "57P03")),
      failedQuery(withCode("terminating connection because of crash of another server process", "57P02")),
      failedQuery(withCode("connection failure", "08006")),
      failedQuery(new Error("Connection terminated unexpectedly")),
      new Error("timeout exceeded when trying to connect"),
      new Error("Client has encountered a connection error and is not queryable"),
      Object.assign(new Error("Reached the max retries per request limit (which is 20)."), { name: "MaxRetriesPerRequestError" }),
      new Error("Connection is closed."),
      new AggregateError([withCode("connect ECONNREFUSED ::1:5432", "ECONNREFUSED"), withCode("connect ECONNREFUSED 127.0.0.1:5432", "ECONNREFUSED")]),
    ])
      expect(isInfrastructureOutage(e), e.message).toBe(true);
  });

  it("leaves the work's own failures, and other servers' outages, to their attempts", () => {
    for (const e of [
      failedQuery(withCode('duplicate key value violates unique constraint "train_steps_pkey"', "23505")),
      failedQuery(withCode('relation "runs" does not exist', "42P01")),
      failedQuery(withCode("could not serialize access", "40001")),
      new TypeError("Cannot read properties of undefined (reading 'step')"),
      new RlqError("no_decision_behind_job", "no train.dispatched decision"),
      // An engine's or a trainer's refused connection is theirs to wait for, not a database outage.
      new RlqError("engine_unreachable", "http://e:30000", { cause: withCode("connect ECONNREFUSED", "ECONNREFUSED") }),
      new RlqError("infra_unreachable", "waited 300 s", { cause: withCode("connect ECONNREFUSED", "ECONNREFUSED") }),
      new TypeError("fetch failed", { cause: withCode("connect ECONNREFUSED", "ECONNREFUSED") }),
      new Error("Connection terminated by the plugin's own protocol"),
    ])
      expect(isInfrastructureOutage(e), e.message).toBe(false);
  });
});

describe("retryThroughOutages", () => {
  const refused = () => withCode("connect ECONNREFUSED 127.0.0.1:5432", "ECONNREFUSED");

  it("runs the work again after an outage, and tells each wait", async () => {
    let calls = 0;
    const waits: number[] = [];
    const out = await retryThroughOutages(
      async () => {
        calls += 1;
        if (calls < 3) throw failedQuery(refused());
        return "done";
      },
      { timeoutMs: 60_000, signal: new AbortController().signal, onWait: (_w, _e, delayMs) => waits.push(delayMs) },
    );
    expect(out).toBe("done");
    expect(calls).toBe(3);
    expect(waits).toEqual([1000, 2000]);
  });

  it("throws the work's own failure at once", async () => {
    let calls = 0;
    const err = await retryThroughOutages(
      async () => {
        calls += 1;
        throw new RlqError("batch_inconsistent", "x");
      },
      { timeoutMs: 60_000, signal: new AbortController().signal, onWait: () => undefined },
    ).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "batch_inconsistent" });
    expect(calls).toBe(1);
  });

  it("past the timeout the outage goes through as infra_unreachable (an attempt is spent)", async () => {
    let t = 0;
    const err = await retryThroughOutages(
      async () => {
        t += 40;
        throw refused();
      },
      { timeoutMs: 100, signal: new AbortController().signal, onWait: () => undefined, now: () => t },
    ).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "infra_unreachable", isRetriable: true });
    expect(String((err as Error).message)).toMatch(/unreachable for 0 s \(RLQ_OUTAGE_TIMEOUT_S 0.1\): connect ECONNREFUSED/);
  });

  it("a shutdown ends the wait as worker_shutdown (the job goes back without an attempt)", async () => {
    const closing = new AbortController();
    const err = await retryThroughOutages(
      async () => {
        throw refused();
      },
      { timeoutMs: 60_000, signal: closing.signal, onWait: () => closing.abort() },
    ).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "worker_shutdown" });
  });
});
