import { describe, expect, it } from "vitest";
import {
  defaultParams,
  idealPipeline,
  iterationMs,
  meanCappedLength,
  responseLength,
  SimEngine,
  type SimClock,
  type SimParams,
} from "../../bench/sim/model.ts";
import { benchModePolicies, simulatePolicy, syncArmPolicy } from "../../bench/sim/policy-sim.ts";

/** A virtual clock: timers run in time order when `run()` is called; nothing waits on the wall clock. */
function virtualClock(): SimClock & { run(until?: number): void } {
  let now = 0;
  let seq = 0;
  const timers: Array<{ t: number; seq: number; fn: () => void; isLive: boolean }> = [];
  return {
    now: () => now,
    at(t, fn) {
      const timer = { t: Math.max(t, now), seq: seq++, fn, isLive: true };
      timers.push(timer);
      return { cancel: () => void (timer.isLive = false) };
    },
    run(until = Infinity) {
      for (;;) {
        const live = timers.filter((x) => x.isLive).sort((a, b) => a.t - b.t || a.seq - b.seq);
        const next = live[0];
        if (!next || next.t > until) {
          if (until !== Infinity) now = until;
          return;
        }
        next.isLive = false;
        now = next.t;
        next.fn();
      }
    },
  };
}

const params = (over: Partial<SimParams> = {}): SimParams => ({ ...defaultParams(1), prefill0Ms: 5, prefillPerTokenMs: 0, weightLoadMs: 100, ...over });

describe("SimEngine (the engine farm's model of one SGLang engine)", () => {
  it("a lone request takes its prefill plus one iteration per token at batch 1", () => {
    const clock = virtualClock();
    const p = params();
    const e = new SimEngine(p, clock);
    let doneAt = -1;
    let produced = -1;
    e.submit({ rid: "a", target: 100, inputTokens: 10, onDone: (n) => ((doneAt = clock.now()), (produced = n)) });
    clock.run();
    expect(produced).toBe(100);
    expect(doneAt).toBeCloseTo(5 + 100 * iterationMs(p, 1), 6);
    expect(e.tokens).toBeCloseTo(100, 6);
  });

  it("two requests share the batch: each token costs an iteration at batch 2", () => {
    const clock = virtualClock();
    const p = params({ prefill0Ms: 0 });
    const e = new SimEngine(p, clock);
    const done: Record<string, number> = {};
    e.submit({ rid: "a", target: 50, inputTokens: 1, onDone: () => (done.a = clock.now()) });
    e.submit({ rid: "b", target: 100, inputTokens: 1, onDone: () => (done.b = clock.now()) });
    clock.run();
    // Both decode at batch 2 until a ends, then b alone at batch 1.
    expect(done.a).toBeCloseTo(50 * iterationMs(p, 2), 6);
    expect(done.b).toBeCloseTo(50 * iterationMs(p, 2) + 50 * iterationMs(p, 1), 6);
  });

  it("holds requests past maxRunning in FIFO order", () => {
    const clock = virtualClock();
    const p = params({ prefill0Ms: 0, maxRunning: 1 });
    const e = new SimEngine(p, clock);
    const order: string[] = [];
    for (const rid of ["a", "b", "c"]) e.submit({ rid, target: 10, inputTokens: 1, onDone: () => order.push(rid) });
    clock.run();
    expect(order).toEqual(["a", "b", "c"]);
    expect(clock.now()).toBeCloseTo(30 * iterationMs(p, 1), 6);
  });

  it("an abort ends a request now with the whole tokens it has", () => {
    const clock = virtualClock();
    const p = params({ prefill0Ms: 0 });
    const e = new SimEngine(p, clock);
    let got: [number, boolean] | null = null;
    e.submit({ rid: "a", target: 1000, inputTokens: 1, onDone: (n, isAborted) => (got = [n, isAborted]) });
    clock.run(iterationMs(p, 1) * 42.5);
    expect(e.abort("a")).toBe(true);
    expect(got).toEqual([42, true]);
  });

  it("a weight load waits for running requests, holds new ones, then serves them on the new version", async () => {
    const clock = virtualClock();
    const p = params({ prefill0Ms: 0 });
    const e = new SimEngine(p, clock);
    const seen: Array<[string, number, number]> = [];
    e.submit({ rid: "old", target: 10, inputTokens: 1, onDone: (_n, _a, v) => seen.push(["old", v, clock.now()]) });
    const loaded = e.load(1);
    e.submit({ rid: "new", target: 10, inputTokens: 1, onDone: (_n, _a, v) => seen.push(["new", v, clock.now()]) });
    clock.run();
    const t1 = 10 * iterationMs(p, 1);
    expect(seen[0]).toEqual(["old", 0, t1]);
    await loaded;
    expect(e.loadsAt).toEqual([{ version: 1, askedAt: 0, doneAt: t1 + p.weightLoadMs }]);
    expect(seen[1]?.[0]).toBe("new");
    expect(seen[1]?.[1]).toBe(1);
    expect(seen[1]?.[2]).toBeCloseTo(t1 + p.weightLoadMs + t1, 6);
    expect(e.firstDecodeAt.get(1)).toBeCloseTo(t1 + p.weightLoadMs, 6);
    expect(e.loadMs).toBeCloseTo(p.weightLoadMs, 6);
  });

  it("in place: a request kept through the load decodes on the new version from the load's end, not from its first token", async () => {
    const clock = virtualClock();
    const p = params({ prefill0Ms: 0 });
    const e = new SimEngine(p, clock);
    let spans: Array<[number, number, number]> = [];
    e.submit({ rid: "kept", target: 20, inputTokens: 1, onDone: (_n, _a, _v, s) => (spans = s) });
    const t = 5 * iterationMs(p, 1);
    clock.run(t);
    e.pauseInPlace();
    const loaded = e.load(1);
    clock.run(t + p.weightLoadMs);
    e.resume();
    clock.run();
    await loaded;
    expect(e.firstDecodeAt.get(0)).toBe(0);
    expect(e.firstDecodeAt.get(1)).toBeCloseTo(t + p.weightLoadMs, 6);
    expect(spans.map(([v]) => v)).toEqual([0, 1]);
  });

  it("an abort does not reach a request held behind a load (SGLang: not in rid_to_state yet): it runs on the new version", async () => {
    const clock = virtualClock();
    const p = params({ prefill0Ms: 0 });
    const e = new SimEngine(p, clock);
    const seen: Array<[string, number, boolean, number]> = [];
    e.submit({ rid: "old", target: 10, inputTokens: 1, onDone: (n, a, v) => seen.push(["old", n, a, v]) });
    const loaded = e.load(1);
    e.submit({ rid: "held", target: 10, inputTokens: 1, onDone: (n, a, v) => seen.push(["held", n, a, v]) });
    e.submit({ rid: "gone", target: 10, inputTokens: 1, onDone: (n, a, v) => seen.push(["gone", n, a, v]) });
    expect(e.abort("held")).toBe(false);
    e.disconnect("gone");
    expect(seen).toEqual([]);
    clock.run();
    await loaded;
    // The held request's abort did nothing: it ran whole, on version 1; the disconnected one ended at the load's end, untouched.
    expect(seen).toEqual([
      ["old", 10, false, 0],
      ["gone", 0, true, 1],
      ["held", 10, false, 1],
    ]);
  });

  it("a load waits for the requests the server already queued (each holds the update lock's reader side), not only the running ones", async () => {
    const clock = virtualClock();
    const p = params({ prefill0Ms: 0, maxRunning: 1 });
    const e = new SimEngine(p, clock);
    const seen: Array<[string, number]> = [];
    e.submit({ rid: "a", target: 10, inputTokens: 1, onDone: (_n, _a, v) => seen.push(["a", v]) });
    e.submit({ rid: "queued", target: 10, inputTokens: 1, onDone: (_n, _a, v) => seen.push(["queued", v]) });
    const loaded = e.load(1);
    clock.run();
    await loaded;
    expect(seen).toEqual([
      ["a", 0],
      ["queued", 0],
    ]);
    expect(e.loadsAt[0]?.doneAt).toBeCloseTo(20 * iterationMs(p, 1) + p.weightLoadMs, 6);
  });
});

describe("the length distribution and the ideal", () => {
  it("responseLength is deterministic per key, capped, and its mean matches meanCappedLength", () => {
    const p = defaultParams(1);
    expect(responseLength("run-1-3", p)).toBe(responseLength("run-1-3", p));
    let sum = 0;
    let max = 0;
    const n = 200_000;
    for (let i = 0; i < n; i++) {
      const l = responseLength(`r-${i}-${i % 8}`, p);
      sum += l;
      max = Math.max(max, l);
    }
    expect(max).toBe(p.lenCap);
    expect(sum / n).toBeGreaterThan(meanCappedLength(p) * 0.98);
    expect(sum / n).toBeLessThan(meanCappedLength(p) * 1.02);
  });

  it("idealPipeline: the engines' step time and the trainer's, pipelined or in sequence", () => {
    const p = params({
      prefill0Ms: 10,
      prefillPerTokenMs: 0,
      lenSigma: 1e-9,
      lenMu: Math.log(1000),
      lenCap: 1e9,
      maxRunning: 4,
      train0Ms: 500,
      trainTokensPerS: 8000,
      weightLoadMs: 100,
    });
    const ideal = idealPipeline(p, 2, 16);
    // 16 samples on 2 engines x 4 slots = 2 rounds of (10 + 1000 iterations at batch 4), then a load.
    const gen = 2 * (10 + 1000 * iterationMs(p, 4)) + 100;
    const train = 500 + (1000 * 16 * 1000) / 8000;
    expect(ideal.generateMsPerStep).toBeCloseTo(gen, 3);
    expect(ideal.trainMsPerStep).toBeCloseTo(train, 3);
    expect(ideal.pipelined.stepMs).toBeCloseTo(Math.max(gen, train), 3);
    expect(ideal.sequential.samplesPerS).toBeCloseTo((1000 * 16) / (gen + train), 6);
  });
});

describe("simulatePolicy (the bench's zero-overhead policy ideal)", () => {
  // 8 engines of the bench's default model; 16 steps, so async k=4 has 10 steady steps.
  const p = defaultParams(8);
  const rbs = (8 * p.maxRunning) / 8;
  const sps = (mode: keyof typeof benchModePolicies) => simulatePolicy(p, 8, benchModePolicies[mode], rbs, 8, 16).samplesPerS;

  it("never beats the fluid pipeline ideal, and a looser staleness bound never trains slower", () => {
    const pipeline = idealPipeline(p, 8, 8 * p.maxRunning).pipelined.samplesPerS;
    const [syncOff, k1, k2, k4] = [sps("sync_partial_off"), sps("async_k1"), sps("async_k2"), sps("async_k4")] as [number, number, number, number];
    // The pipeline ideal has no tail, no fill and no idle slot: a scheduled policy stays under it.
    for (const x of [syncOff, k1, k2, k4]) expect(x).toBeLessThan(pipeline);
    // AReaL's admission rule lets (k + 1) steps of groups run: more of them keep more slots busy.
    expect(syncOff).toBeLessThan(k1);
    expect(k1).toBeLessThan(k2);
    expect(k2).toBeLessThan(k4);
  });

  it("replays a run's own response lengths, and over the bench's short window the draw moves it more than in place does", () => {
    // cluster-sim.ts at 8 engines: async k=2, 6 steps, so a steady window of 2 steps of 128 samples.
    const run = (arm: "abort" | "in_place", keyPrefix?: string) =>
      simulatePolicy(p, 8, { ...benchModePolicies.async_k2, ...syncArmPolicy(arm, 8) }, rbs, 8, 6, keyPrefix).samplesPerS;
    // The default draw is the one the bench has always compared against.
    expect(run("abort", "sim")).toBe(run("abort"));
    const draws = ["draw0", "draw1", "draw2", "draw3", "draw4", "draw5"];
    const abort = draws.map((d) => run("abort", d));
    const inPlace = draws.map((d) => run("in_place", d));
    // In place keeps a request through the load instead of re-prefilling it: within a few % of abort on the same lengths.
    for (const [i, x] of inPlace.entries()) expect(Math.abs(x / (abort[i] as number) - 1)).toBeLessThan(0.06);
    // Another draw of the lengths moves the same policy by far more (these six: 0.66-0.78 of the pipeline ideal).
    expect(Math.max(...abort) / Math.min(...abort)).toBeGreaterThan(1.15);
  });
});
