import { describe, expect, it } from "vitest";
import type { LoggedDecision } from "./decisions.ts";
import {
  foldColocateTurn,
  initialEngineMemory,
  nextColocateAction,
  nextColocateTurn,
  nextEngineMemory,
  shouldLoadOnStart,
  type ColocateTurn,
  type ColocateView,
  type EngineMemory,
} from "./colocate.ts";

const d = (seq: number, kind: LoggedDecision["kind"], payload: object) => ({ seq, kind, payload }) as LoggedDecision;
const released = d(0, "engines.released", { step: 0 });
const resumedWeights = d(1, "engines.resumed", { step: 0, tag: "weights" });
const resumedKv = d(2, "engines.resumed", { step: 0, tag: "kv_cache" });

describe("the engines' memory, from the log", () => {
  it("resident → released → weights → resident, and other decisions leave it", () => {
    const modes: EngineMemory[] = [];
    let m = initialEngineMemory;
    for (const x of [released, d(1, "train.dispatched", { step: 0, weightVersionIn: 0 }), resumedWeights, resumedKv]) {
      m = nextEngineMemory(m, x);
      modes.push(m);
    }
    expect(modes).toEqual(["released", "released", "weights", "resident"]);
  });

  const cases: Array<[string, EngineMemory, LoggedDecision, RegExp]> = [
    ["released twice", "released", released, /engines are released, not resident/],
    ["weights resumed while resident", "resident", resumedWeights, /weights resumed while the engines are resident/],
    ["KV cache resumed before the weights", "released", resumedKv, /KV cache resumed while the engines are released/],
    ["released with weights resumed", "weights", released, /engines are weights, not resident/],
  ];
  it.each(cases)("a transition the controller never writes is a corrupt log: %s", (_name, mode, decision, message) => {
    expect(() => nextEngineMemory(mode, decision)).toThrow(message);
  });
});

describe("the colocated step's next action", () => {
  const view = (v: Partial<ColocateView>): ColocateView => ({
    phase: "drain",
    engineMemory: "resident",
    drainingCount: 0,
    weightVersion: 0,
    trainedVersion: 0,
    ...v,
  });

  it("walks rollout → released → training → pushing → resuming, one action per phase", () => {
    expect(nextColocateAction(view({ phase: "collect" }))).toBe("none");
    // SGLang asserts no request runs at a release: the aborted rounds land first.
    expect(nextColocateAction(view({ drainingCount: 2 }))).toBe("drain");
    expect(nextColocateAction(view({}))).toBe("release");
    expect(nextColocateAction(view({ engineMemory: "released" }))).toBe("train");
    expect(nextColocateAction(view({ phase: "train", engineMemory: "released" }))).toBe("await_train");
    expect(nextColocateAction(view({ phase: "sync", engineMemory: "released", trainedVersion: 1 }))).toBe("resume_weights");
    expect(nextColocateAction(view({ phase: "sync", engineMemory: "weights", trainedVersion: 1 }))).toBe("load");
    expect(nextColocateAction(view({ phase: "sync", engineMemory: "weights", weightVersion: 1, trainedVersion: 1 }))).toBe("resume_kv_cache");
    expect(nextColocateAction(view({ phase: "sync", weightVersion: 1, trainedVersion: 1 }))).toBe("next");
    expect(nextColocateAction(view({ phase: "done" }))).toBe("none");
  });

  it("a restarted controller loads only engines that are resident and not about to be released", () => {
    expect(shouldLoadOnStart({ phase: "collect", engineMemory: "resident" })).toBe(true);
    expect(shouldLoadOnStart({ phase: "sync", engineMemory: "resident" })).toBe(true);
    expect(shouldLoadOnStart({ phase: "drain", engineMemory: "resident" })).toBe(false);
    expect(shouldLoadOnStart({ phase: "train", engineMemory: "released" })).toBe(false);
    expect(shouldLoadOnStart({ phase: "sync", engineMemory: "released" })).toBe(false);
    expect(shouldLoadOnStart({ phase: "sync", engineMemory: "weights" })).toBe(false);
  });
});

describe("whose turn it is on the shared GPUs, as a rollout worker reads the log", () => {
  const sealed = d(0, "step.sealed", { step: 0, kept: [], aborted: [] });
  const started = d(5, "step.started", { step: 1, weightVersion: 1 });

  it("engines → release_due at the seal → released → weights → engines at the KV cache's resume; a new step starts in the engines' turn", () => {
    const turns: ColocateTurn[] = [];
    let t: ColocateTurn = "engines";
    for (const x of [sealed, released, d(2, "train.dispatched", { step: 0, weightVersionIn: 0 }), resumedWeights, resumedKv, started]) {
      t = nextColocateTurn(t, x);
      turns.push(t);
    }
    expect(turns).toEqual(["release_due", "released", "released", "weights", "engines", "engines"]);
  });

  it("a sealed step that trains nothing (its engines never released) gives the turn back at the next step", () => {
    expect(foldColocateTurn([sealed, started])).toBe("engines");
  });

  const corrupt: Array<[string, ColocateTurn, LoggedDecision, RegExp]> = [
    ["a step started while released", "released", started, /a step started while the engines are released/],
    ["a step started with only the weights resumed", "weights", started, /a step started while the engines are weights/],
    ["released twice", "released", released, /engines are released, not resident/],
    ["the KV cache resumed before the weights", "release_due", resumedKv, /KV cache resumed while the engines are resident/],
  ];
  it.each(corrupt)("a transition the controller never writes is a corrupt log: %s", (_name, turn, decision, message) => {
    expect(() => nextColocateTurn(turn, decision)).toThrow(message);
  });
});
