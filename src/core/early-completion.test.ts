/**
 * Early group completion's choice of a group's samples (core/early-completion.ts): the first n to
 * finish, else the finished ones and then the most advanced, always as ascending candidate indices.
 */
import { describe, expect, it } from "vitest";
import { chooseGroupSamples, isGroupSettled, type GroupCandidate } from "./early-completion.ts";

const cand = (index: number, tokens: number, finishedOrder: number | null): GroupCandidate => ({ index, tokens, finishedOrder });

describe("isGroupSettled", () => {
  it("settles once n candidates finished, not before", () => {
    expect(isGroupSettled(3, 4)).toBe(false);
    expect(isGroupSettled(4, 4)).toBe(true);
    expect(isGroupSettled(5, 4)).toBe(true);
  });
});

describe("chooseGroupSamples", () => {
  it("keeps the first n to finish, whatever their indices, and drops the slowest", () => {
    // Candidates 0 and 3 are the stragglers; 4 finished first.
    const cs = [cand(0, 900, null), cand(1, 10, 2), cand(2, 20, 1), cand(3, 700, null), cand(4, 5, 0), cand(5, 30, 3)];
    expect(chooseGroupSamples(cs, 4)).toEqual([1, 2, 4, 5]);
  });

  it("takes finish order over length when more than n finished", () => {
    const cs = [cand(0, 50, 3), cand(1, 10, 0), cand(2, 20, 1), cand(3, 5, 2)];
    expect(chooseGroupSamples(cs, 3)).toEqual([1, 2, 3]);
  });

  it("fills a round that ended early with the finished ones, then the most tokens, ties by index", () => {
    const cs = [cand(0, 40, null), cand(1, 80, null), cand(2, 12, 0), cand(3, 80, null), cand(4, 3, null)];
    expect(chooseGroupSamples(cs, 3)).toEqual([1, 2, 3]);
    expect(chooseGroupSamples(cs, 4)).toEqual([0, 1, 2, 3]);
  });

  it("with no extra candidates keeps them all", () => {
    const cs = [cand(0, 1, null), cand(1, 2, 0), cand(2, 3, null)];
    expect(chooseGroupSamples(cs, 3)).toEqual([0, 1, 2]);
  });

  it("refuses fewer candidates than samples, and a bad n, naming them", () => {
    expect(() => chooseGroupSamples([cand(0, 1, 0)], 2)).toThrow(/1 candidates for 2 samples/);
    expect(() => chooseGroupSamples([cand(0, 1, 0)], 0)).toThrow(/n must be a positive integer, got 0/);
  });
});
