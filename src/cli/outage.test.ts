import { describe, expect, it } from "vitest";
import { createOutageClock, createServiceProbe, isOutageError, PROBE_TIMEOUT_MS } from "./outage.ts";
import { RlqError } from "../lib/errors.ts";

describe("rlq up's outage clock", () => {
  it("backs off, expires after the bound of back-to-back failures, and forgets an outage that ended", () => {
    let t = 1000;
    const clock = createOutageClock(5000, () => t);
    expect(clock.failed("run-a", t, "db down")).toBe(1000);
    t += 1000;
    expect(clock.failed("run-a", t, "db down")).toBe(2000);
    t += 2000;
    expect(clock.failed("run-a", t, "still down")).toBe(4000);
    expect(clock.expired()).toBeNull();
    t += 4000;
    expect(clock.expired()).toEqual({ key: "run-a", forMs: 7000, error: "still down" });
    clock.ok("run-a");
    expect(clock.expired()).toBeNull();
  });

  it("a controller that ran 30 s before failing starts a new outage", () => {
    let t = 0;
    const clock = createOutageClock(5000, () => t);
    clock.failed("r", 0, "x");
    t = 4000;
    clock.failed("r", 3000, "x");
    t = 40_000;
    expect(clock.failed("r", 5000, "y")).toBe(1000);
    t = 44_000;
    expect(clock.expired()).toBeNull();
    t = 46_000;
    expect(clock.expired()?.forMs).toBe(6000);
  });
});

describe("isOutageError", () => {
  it("knows a dropped connection from a mistake", () => {
    expect(isOutageError(Object.assign(new Error("the database system is not yet accepting connections"), { code: "57P03" }))).toBe(true);
    expect(isOutageError(new Error("Connection terminated unexpectedly"))).toBe(true);
    expect(
      isOutageError(
        new RlqError("http_unreachable", "add failed", { cause: Object.assign(new Error("connect ECONNREFUSED 10.0.0.2:6379"), { code: "ECONNREFUSED" }) }),
      ),
    ).toBe(true);
    expect(isOutageError(new RlqError("lease_lost", "run x: this controller no longer holds the run's lease"))).toBe(true);
    expect(isOutageError(new RlqError("run_not_found", "run x does not exist"))).toBe(false);
    expect(isOutageError(Object.assign(new Error('relation "runs" does not exist'), { code: "42P01" }))).toBe(false);
  });
});

describe("rlq up's probe of the queue store", () => {
  it("says ok once a probe answers, fails one that throws, and fails one unanswered for PROBE_TIMEOUT_MS (a Redis client holding commands)", async () => {
    let t = 0;
    let answer: (() => void) | null = null;
    let mode: "hang" | "throw" | "ok" = "ok";
    const probe = createServiceProbe(
      () => {
        if (mode === "throw") return Promise.reject(new Error("ECONNREFUSED"));
        if (mode === "hang") return new Promise<void>((r) => (answer = r));
        return Promise.resolve();
      },
      () => t,
    );
    const settle = () => new Promise((r) => setImmediate(r));
    expect(probe.poll()).toBeNull(); // started
    await settle();
    expect(probe.poll()).toBe("ok");
    t += 2000;
    mode = "throw";
    expect(probe.poll()).toBeNull();
    await settle();
    expect(probe.poll()).toEqual({ error: "ECONNREFUSED" });
    t += 2000;
    mode = "hang";
    expect(probe.poll()).toBeNull();
    t += PROBE_TIMEOUT_MS - 1;
    expect(probe.poll()).toBeNull(); // one probe in flight at a time, not yet overdue
    t += 1;
    expect(probe.poll()).toEqual({ error: "no answer for 5 s" });
    (answer as unknown as () => void)();
    await settle();
    expect(probe.poll()).toBe("ok");
  });
});
