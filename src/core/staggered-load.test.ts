/**
 * Staggered weight loads (core/staggered-load.ts): which engines start loading, and the version rule
 * that keeps the per-token staleness bound exact while some engines are still on the old version.
 */
import { describe, expect, it } from "vitest";
import { mayServeAtVersion, nextEnginesToLoad } from "./staggered-load.ts";

const engines = ["e0", "e1", "e2", "e3", "e4"];

describe("nextEnginesToLoad", () => {
  it("starts every engine at once without a limit", () => {
    expect(nextEnginesToLoad(engines, new Set(), new Set(), null)).toEqual(engines);
  });

  it("starts at most the limit, in order, and the next ones as loads end", () => {
    expect(nextEnginesToLoad(engines, new Set(), new Set(), 2)).toEqual(["e0", "e1"]);
    expect(nextEnginesToLoad(engines, new Set(["e0", "e1"]), new Set(), 2)).toEqual([]);
    expect(nextEnginesToLoad(engines, new Set(["e1"]), new Set(["e0"]), 2)).toEqual(["e2"]);
    expect(nextEnginesToLoad(engines, new Set(["e4"]), new Set(["e0", "e1", "e2", "e3"]), 2)).toEqual([]);
  });

  it("refuses a limit that is not a positive integer", () => {
    expect(() => nextEnginesToLoad(engines, new Set(), new Set(), 0)).toThrow(/positive integer or null, got 0/);
  });
});

describe("mayServeAtVersion", () => {
  it("refuses an engine older than the group's admission under a bound, so no token is sampled staler than k", () => {
    // A group admitted at version 5 trains no later than step 5 + k on weights 5 + k: a token from
    // version 4 would be k + 1 stale.
    expect(mayServeAtVersion(4, 5, 1)).toBe(false);
    expect(mayServeAtVersion(5, 5, 1)).toBe(true);
    expect(mayServeAtVersion(6, 5, 1)).toBe(true);
    // A group admitted before the sync may go on on an engine that has not loaded yet.
    expect(mayServeAtVersion(4, 4, 2)).toBe(true);
  });

  it("lets any engine serve without a bound", () => {
    expect(mayServeAtVersion(0, 9, null)).toBe(true);
  });
});
