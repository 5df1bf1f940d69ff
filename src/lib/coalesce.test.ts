import { describe, expect, it } from "vitest";
import { coalesce } from "./coalesce.ts";

/** A runner that records its batches and answers each key with key * 10 (an Error for negative keys). */
function recorder(options: { throwWhen?: (keys: number[]) => boolean } = {}) {
  const batches: number[][] = [];
  let release: () => void = () => undefined;
  let gate: Promise<void> | null = null;
  return {
    batches,
    /** Hold the next batches until `open()`. */
    hold() {
      gate = new Promise<void>((r) => (release = r));
    },
    open() {
      const g = release;
      gate = null;
      g();
    },
    run: async (keys: number[]): Promise<Array<number | Error>> => {
      batches.push(keys);
      if (gate) await gate;
      if (options.throwWhen?.(keys)) throw new Error(`batch ${keys.join(",")} failed`);
      return keys.map((k) => (k < 0 ? new Error(`bad key ${k}`) : k * 10));
    },
  };
}

describe("coalesce", () => {
  it("sends the calls of one event-loop turn as one batch and answers each caller", async () => {
    const r = recorder();
    const call = coalesce(r.run, { maxBatch: 10 });
    const results = await Promise.all([1, 2, 3].map((k) => call(k)));
    expect(results).toEqual([10, 20, 30]);
    expect(r.batches).toEqual([[1, 2, 3]]);
  });

  it("queues calls made while a batch runs and sends them together next, split by maxBatch", async () => {
    const r = recorder();
    r.hold();
    const call = coalesce(r.run, { maxBatch: 2 });
    const first = call(1);
    await new Promise((res) => setImmediate(res)); // the first batch is now running (held)
    const later = [2, 3, 4, 5, 6].map((k) => call(k));
    expect(r.batches).toEqual([[1]]);
    r.open();
    expect(await first).toBe(10);
    expect(await Promise.all(later)).toEqual([20, 30, 40, 50, 60]);
    expect(r.batches).toEqual([[1], [2, 3], [4, 5], [6]]);
  });

  it("runs up to maxInFlight batches at once", async () => {
    const r = recorder();
    r.hold();
    const call = coalesce(r.run, { maxBatch: 1, maxInFlight: 2 });
    const all = [1, 2, 3].map((k) => call(k));
    await new Promise((res) => setImmediate(res));
    expect(r.batches).toEqual([[1], [2]]);
    r.open();
    expect(await Promise.all(all)).toEqual([10, 20, 30]);
  });

  it("rejects only the caller whose entry is an Error", async () => {
    const r = recorder();
    const call = coalesce(r.run, { maxBatch: 10 });
    const out = await Promise.allSettled([call(1), call(-2), call(3)]);
    expect(out.map((o) => o.status)).toEqual(["fulfilled", "rejected", "fulfilled"]);
    expect((out[1] as PromiseRejectedResult).reason).toBeInstanceOf(Error);
    expect(((out[1] as PromiseRejectedResult).reason as Error).message).toBe("bad key -2");
  });

  it("retries each key alone when a batch throws, so one bad key fails only its caller", async () => {
    // A multi-row statement fails as a whole when one row is bad: here any batch holding 7.
    const r = recorder({ throwWhen: (keys) => keys.includes(7) });
    const call = coalesce(r.run, { maxBatch: 10 });
    const out = await Promise.allSettled([call(1), call(7), call(3)]);
    expect(out.map((o) => (o.status === "fulfilled" ? o.value : (o.reason as Error).message))).toEqual([10, "batch 7 failed", 30]);
    expect(r.batches).toEqual([[1, 7, 3], [1], [7], [3]]);
  });

  it("rejects a caller when the runner returns too few results", async () => {
    const call = coalesce<number, number>(async () => [], { maxBatch: 4 });
    await expect(call(1)).rejects.toThrow(/fewer results than keys/);
  });

  it("refuses a bad maxBatch or maxInFlight", () => {
    expect(() => coalesce(async () => [], { maxBatch: 0 })).toThrow(/maxBatch must be a positive integer, got 0/);
    expect(() => coalesce(async () => [], { maxBatch: 1, maxInFlight: 0 })).toThrow(/maxInFlight must be a positive integer, got 0/);
  });
});
