import { describe, expect, it } from "vitest";
import type { LoggedDecision } from "./decisions.ts";
import {
  abortingSyncTarget,
  foldRunSync,
  loadKeepsRequests,
  initialLoader,
  initialRouter,
  isAdmitting,
  isSyncBusy,
  nextEngineMode,
  nextLoaderMode,
  nextRouterMode,
  shouldSendLoad,
  type RouterEvent,
  type RouterMode,
} from "./weight-sync.ts";

const d = (seq: number, kind: LoggedDecision["kind"], payload: object) => ({ seq, kind, payload }) as LoggedDecision;
const run = (mode: RouterMode, ...events: RouterEvent[]) => events.reduce(nextRouterMode, mode);

describe("run sync (from the log)", () => {
  it("syncing then synced; a second syncing before synced is a corrupt log", () => {
    const log = [
      d(0, "weights.syncing", { step: 0, weightVersion: 1, mode: "drain" }),
      d(1, "weights.synced", { step: 0, weightVersion: 1, checkpointUri: "u" }),
    ];
    expect(foldRunSync(log).mode).toEqual({ kind: "synced", version: 1, checkpointUri: "u" });
    expect(() => foldRunSync([log[0] as LoggedDecision, d(1, "weights.syncing", { step: 1, weightVersion: 2, mode: "abort" })])).toThrow(/still in progress/);
    expect(() => foldRunSync([log[0] as LoggedDecision, d(1, "weights.synced", { step: 0, weightVersion: 2, checkpointUri: "u" })])).toThrow(/loads version 1/);
  });
});

describe("in_place", () => {
  it("a sync in place holds no router and pauses each engine around its load, keeping its requests", () => {
    // weights.syncing's schema (core/decisions.ts) does not take in_place yet: the machine does.
    const log = [d(0, "weights.syncing", { step: 0, weightVersion: 1, mode: "in_place" })];
    const { mode } = foldRunSync(log);
    expect(mode).toMatchObject({ kind: "syncing", strategy: "in_place", to: 1 });
    expect(abortingSyncTarget(mode)).toBeNull();
    expect(loadKeepsRequests("in_place")).toBe(true);
    expect(loadKeepsRequests("abort") || loadKeepsRequests("drain")).toBe(false);
  });
});

describe("engine modes", () => {
  it("refused is final; a failed load leaves the engine stale; a moved version makes a healthy engine stale", () => {
    expect(nextEngineMode("refused", { kind: "admitted" })).toBe("refused");
    expect(nextEngineMode("loading", { kind: "loadFailed" })).toBe("stale");
    expect(nextEngineMode("dead", { kind: "loadFailed" })).toBe("dead");
    expect(nextEngineMode("healthy", { kind: "versionMoved", isOnVersion: false })).toBe("stale");
    expect(nextEngineMode("healthy", { kind: "versionMoved", isOnVersion: true })).toBe("healthy");
    expect(nextEngineMode("dead", { kind: "reported" })).toBe("dead");
    expect(nextEngineMode("starting", { kind: "reported" })).toBe("healthy");
  });
});

describe("loader", () => {
  it("sends a load once per version, and again after a failure", () => {
    let m = nextLoaderMode(initialLoader, { kind: "begin", version: 3 });
    expect(shouldSendLoad(m, 3)).toBe(false);
    m = nextLoaderMode(m, { kind: "failed", version: 3 });
    expect(shouldSendLoad(m, 3)).toBe(true);
    m = nextLoaderMode(nextLoaderMode(m, { kind: "begin", version: 3 }), { kind: "ended", version: 3 });
    expect(m).toEqual({ kind: "idle", loaded: 3 });
    expect(shouldSendLoad(m, 3)).toBe(false);
  });
});

describe("router", () => {
  it("follows reported versions until pinned", () => {
    expect(run(initialRouter, { kind: "reported", version: 2 }, { kind: "reported", version: 1 })).toEqual({ kind: "open", version: 2, isPinned: false });
    expect(run(initialRouter, { kind: "pinned", version: 1 }, { kind: "reported", version: 2 })).toEqual({ kind: "open", version: 1, isPinned: true });
  });

  it("an abort-mode sync: held until its version is pinned, then awaiting the loads until weights.synced", () => {
    const open: RouterMode = { kind: "open", version: 1, isPinned: true };
    const held = run(open, { kind: "hold", until: Number.MAX_SAFE_INTEGER }, { kind: "logRead", target: 2, version: 1 });
    expect(held).toEqual({ kind: "held", version: 1, isPinned: true, until: 2 });
    expect(isAdmitting(held)).toBe(false);
    const awaiting = run(held, { kind: "pinned", version: 2 });
    expect(awaiting).toEqual({ kind: "awaitingLoad", version: 2 });
    expect(isAdmitting(awaiting) && isSyncBusy(awaiting)).toBe(true);
    // A job of the old version never moves it back.
    expect(run(awaiting, { kind: "pinned", version: 1 })).toBe(awaiting);
    expect(run(awaiting, { kind: "logRead", target: null, version: 2 })).toEqual({ kind: "open", version: 2, isPinned: true });
  });

  it("a hint with no sync in progress lets go at once; weights.synced read while held releases", () => {
    const open: RouterMode = { kind: "open", version: 1, isPinned: true };
    expect(run(open, { kind: "hold", until: Number.MAX_SAFE_INTEGER }, { kind: "logRead", target: null, version: 1 })).toEqual(open);
    const held: RouterMode = { kind: "held", version: 1, isPinned: true, until: 2 };
    expect(run(held, { kind: "logRead", target: null, version: 2 })).toEqual({ kind: "open", version: 2, isPinned: true });
  });

  it("a trainer push held by this process is let go only by resume", () => {
    const held = run({ kind: "open", version: 1, isPinned: true }, { kind: "hold", until: null }, { kind: "pinned", version: 2 });
    expect(held).toEqual({ kind: "held", version: 2, isPinned: true, until: null });
    expect(run(held, { kind: "resume" })).toEqual({ kind: "open", version: 2, isPinned: true });
  });
});
