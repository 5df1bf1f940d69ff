import { describe, expect, it } from "vitest";
import { editDistance, nearest } from "./nearest.ts";

describe("nearest: the typo's intended word", () => {
  it("counts inserts, deletes, substitutions and adjacent swaps as one edit each", () => {
    expect(editDistance("run", "run")).toBe(0);
    expect(editDistance("rnu", "run")).toBe(1);
    expect(editDistance("migrat", "migrate")).toBe(1);
    expect(editDistance("kitten", "sitting")).toBe(3);
  });
  it("suggests only what is close enough to be a typo", () => {
    const cmds = ["migrate", "run", "worker", "up", "sql", "replay", "export", "db", "demo", "config"];
    expect(nearest("rnu", cmds)).toBe("run");
    expect(nearest("wroker", cmds)).toBe("worker");
    expect(nearest("replya", cmds)).toBe("replay");
    expect(nearest("kubernetes", cmds)).toBeNull();
  });
});
