import { describe, expect, it } from "vitest";
import { mulberry32 } from "../core/random.ts";
import { CallJournal, NonDeterminismError, type CallRecord, type JournalCall, type JournalEffects } from "./rollout-journal.ts";

/**
 * The replay journal without a database: a fake world plays the controller's
 * part (draw hands out ids from a counter, generate results arrive when the
 * test says so, in a scrambled order). The planner under test is slime's
 * as-completed over-sampling loop, the pattern most sensitive to timing.
 */
type Rec = CallRecord & { result?: unknown };
type Input = { n?: number; group?: number };
type Call = JournalCall<Rec, Input>;

interface World {
  log: Rec[];
  /** generate results that have "landed": group → reward. */
  facts: Map<number, number>;
  nextGroup: number;
  liveEffects: number;
}

const rewardOf = (g: number) => (g * 7 + 3) % 5;

function effects(w: World): JournalEffects<Rec, Input> {
  return {
    async effect(calls) {
      for (const c of calls) {
        if (!c.record) {
          w.liveEffects++;
          const rec: Rec = { ordinal: c.ordinal, op: c.op, key: c.key };
          if (c.op === "draw") rec.result = Array.from({ length: c.input.n ?? 0 }, () => w.nextGroup++);
          w.log.push(rec);
          c.record = rec;
        }
        if (c.op === "draw") c.outcome = { ok: true, value: c.record.result };
      }
    },
    async poll(calls) {
      for (const c of calls) {
        const r = w.facts.get(c.input.group as number);
        if (r !== undefined) c.outcome = { ok: true, value: r };
      }
    },
    delivered() {},
  };
}

interface Ctx {
  draw(n: number): Promise<number[]>;
  generate(g: number): Promise<number>;
}

function ctxOf(j: CallJournal<Rec, Input>): Ctx {
  return {
    draw: (n) => j.issue("draw", `n=${n}`, { n }) as Promise<number[]>,
    generate: (g) => j.issue("generate", `group=${g}`, { group: g }) as Promise<number>,
  };
}

/** slime's loop: over-sample 3, take groups as they complete, keep even rewards, top up one at a time. */
async function planner(ctx: Ctx, trace: number[]): Promise<number[]> {
  const pending = new Map<number, Promise<{ g: number; r: number }>>();
  const start = (g: number) =>
    pending.set(
      g,
      ctx.generate(g).then((r) => ({ g, r })),
    );
  for (const g of await ctx.draw(3)) start(g);
  const kept: number[] = [];
  while (kept.length < 2) {
    const { g, r } = await Promise.race(pending.values());
    pending.delete(g);
    trace.push(g);
    if (r % 2 === 0) kept.push(g);
    else for (const extra of await ctx.draw(1)) start(extra);
  }
  return kept;
}

/** Drive a journal to the function's return; generate results land one at a time in an order drawn from `seed`. */
async function drive(j: CallJournal<Rec, Input>, w: World, seed: number): Promise<unknown> {
  const rand = mulberry32(seed);
  const fx = effects(w);
  for (let i = 0; i < 1000; i++) {
    await j.advance(fx);
    if (j.result) {
      if (!j.result.ok) throw j.result.error;
      return j.result.value;
    }
    const waiting = j.calls.filter((c: Call) => c.op === "generate" && c.record && !w.facts.has(c.input.group as number));
    if (waiting.length === 0) throw new Error("stuck: nothing to complete");
    const c = waiting[Math.floor(rand() * waiting.length)] as Call;
    w.facts.set(c.input.group as number, rewardOf(c.input.group as number));
  }
  throw new Error("did not finish");
}

const world = (log: Rec[] = [], facts = new Map<number, number>()): World => ({ log: [...log], facts: new Map(facts), nextGroup: 0, liveEffects: 0 });

async function runLive(seed: number, records: Rec[] = [], facts?: Map<number, number>) {
  const w = world(records, facts);
  w.nextGroup = Math.max(0, ...records.flatMap((r) => (Array.isArray(r.result) ? (r.result as number[]).map((g) => g + 1) : [])));
  const j = new CallJournal<Rec, Input>(records, "test planner");
  const trace: number[] = [];
  await j.start(() => planner(ctxOf(j), trace));
  const kept = await drive(j, w, seed);
  j.checkReplayComplete();
  return { kept, trace, w, calls: j.calls.map((c) => `${c.op}(${c.key})`) };
}

describe("rollout function replay journal", () => {
  it("delivers results in call order, whatever order the jobs finish in", async () => {
    const w = world();
    const j = new CallJournal<Rec, Input>([], "test");
    const ctx = ctxOf(j);
    const seen: string[] = [];
    await j.start(async () => {
      const [a, b] = [ctx.generate(10), ctx.generate(11)];
      void b.then(() => seen.push("b"));
      const first = await Promise.race([a.then(() => "a"), b.then(() => "b")]);
      seen.push(`race:${first}`);
      await b;
      return seen;
    });
    await j.advance(effects(w));
    w.facts.set(11, 0); // the later call's job finishes first...
    await j.advance(effects(w));
    expect(seen).toEqual([]); // ...and is held back until the earlier one is delivered
    w.facts.set(10, 0);
    await j.advance(effects(w));
    expect(j.result).toEqual({ ok: true, value: ["race:a", "b"] });
  });

  it("keys every call by its ordinal and replays a finished step without any effect", async () => {
    const live = await runLive(1);
    expect(live.w.log.map((r) => r.ordinal)).toEqual([...live.w.log.keys()]);
    expect(live.w.liveEffects).toBe(live.calls.length);
    // A restarted controller: the records and every generate fact are there.
    const replay = await runLive(99, live.w.log, live.w.facts);
    expect(replay.w.liveEffects).toBe(0);
    expect(replay.calls).toEqual(live.calls);
    expect(replay.trace).toEqual(live.trace);
    expect(replay.kept).toEqual(live.kept);
  });

  it("sees the same call sequence live and on replay for any completion order (as-completed planner)", async () => {
    for (let seed = 1; seed <= 20; seed++) {
      const live = await runLive(seed);
      const replay = await runLive(seed + 1000, live.w.log, live.w.facts);
      expect(replay.calls, `seed ${seed}`).toEqual(live.calls);
      expect(replay.kept, `seed ${seed}`).toEqual(live.kept);
      expect(replay.w.liveEffects).toBe(0);
    }
  });

  it("a restart mid-step keeps the recorded calls and continues live: nothing drawn twice", async () => {
    const live = await runLive(7);
    for (let k = 1; k < live.w.log.length; k++) {
      const prefix = live.w.log.slice(0, k);
      // Only the facts of generates recorded before the crash can have landed.
      const facts = new Map([...live.w.facts].filter(([g]) => prefix.some((r) => r.op === "generate" && r.key === `group=${g}`)));
      const resumed = await runLive(7 + k, prefix, facts);
      expect(resumed.w.log.slice(0, k)).toEqual(prefix);
      expect(resumed.w.log.map((r) => r.ordinal)).toEqual([...resumed.w.log.keys()]);
      expect(resumed.w.liveEffects).toBe(resumed.w.log.length - k);
      const drawn = resumed.w.log.flatMap((r) => (r.op === "draw" ? (r.result as number[]) : []));
      expect(new Set(drawn).size).toBe(drawn.length);
      const generated = resumed.w.log.filter((r) => r.op === "generate").map((r) => r.key);
      expect(new Set(generated).size).toBe(generated.length);
    }
  });

  it("reports a changed call on replay as non-determinism, naming the call", async () => {
    const records: Rec[] = [
      { ordinal: 0, op: "draw", key: "n=2", result: [0, 1] },
      { ordinal: 1, op: "generate", key: "group=0" },
    ];
    const j = new CallJournal<Rec, Input>(records, "rollout_function_path plan.ts step 3");
    const ctx = ctxOf(j);
    await j.start(async () => {
      const [, second] = await ctx.draw(2);
      return ctx.generate(second as number); // the recorded run generated group 0 here
    });
    const err = await j.advance(effects(world(records))).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(NonDeterminismError);
    expect((err as Error).message).toMatch(/plan\.ts step 3: ctx call #1 is generate\(group=1\) on replay but was recorded as generate\(group=0\)/);
    expect((err as NonDeterminismError).code).toBe("rollout_fn_nondeterministic");
  });

  it("reports a function that returns before its recorded calls", async () => {
    const records: Rec[] = [
      { ordinal: 0, op: "draw", key: "n=1", result: [0] },
      { ordinal: 1, op: "draw", key: "n=1", result: [1] },
    ];
    const j = new CallJournal<Rec, Input>(records, "plan");
    const ctx = ctxOf(j);
    await j.start(async () => ctx.draw(1));
    await j.advance(effects(world(records)));
    expect(j.result?.ok).toBe(true);
    expect(() => j.checkReplayComplete()).toThrow(/returned after 1 ctx call\(s\) on replay, but 2 were recorded \(the next was draw\(n=1\)\)/);
  });

  it("refuses a log whose recorded calls are not gapless", () => {
    expect(() => new CallJournal<Rec, Input>([{ ordinal: 1, op: "draw", key: "n=1" }], "plan")).toThrow(/not gapless/);
  });

  it("stops delivering once the function returned (what it saw at return is final)", async () => {
    const w = world();
    const j = new CallJournal<Rec, Input>([], "test");
    const ctx = ctxOf(j);
    await j.start(async () => {
      void ctx.generate(5); // never awaited
      return "done";
    });
    w.facts.set(5, 1);
    await j.advance(effects(w));
    expect(j.result).toEqual({ ok: true, value: "done" });
    expect(j.calls[0]?.outcome).not.toBeNull();
  });
});
