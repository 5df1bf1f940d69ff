import { describe, expect, it } from "vitest";
import { popFirst, takeFromBuffer, validateBufferFilterResult } from "./buffer-filter.ts";
import { FilterError } from "./filter-error.ts";

const buffer = [{ groupId: "a" }, { groupId: "b" }, { groupId: "c" }];
const site = { option: "buffer_filter_path", path: "./buf.js" };

describe("pop_first", () => {
  it("takes min(len, n) groups from the front", () => {
    expect(popFirst(buffer, 2)).toEqual(["a", "b"]);
    expect(popFirst(buffer, 5)).toEqual(["a", "b", "c"]);
    expect(popFirst(buffer, 0)).toEqual([]);
    expect(popFirst([], 3)).toEqual([]);
  });
});

describe("custom buffer filter validation", () => {
  it("accepts a subset in any order, at most n", () => {
    expect(validateBufferFilterResult(["c", "a"], buffer, 2, site)).toEqual(["c", "a"]);
    expect(validateBufferFilterResult([], buffer, 2, site)).toEqual([]);
  });
  it.each([
    ["x", "expected an array of group ids"],
    [["z"], "[0] group id 'z' is not in the buffer"],
    [["a", "a"], "[1] group id 'a' is returned twice"],
    [["a", "b", "c"], "expected at most n = 2 group ids"],
    [[1], "[0] "],
  ] as const)("refuses %j", (value, detail) => {
    let error: unknown;
    try {
      validateBufferFilterResult(value, buffer, 2, site);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(FilterError);
    expect((error as FilterError).code).toBe("buffer_filter_invalid");
    expect((error as FilterError).message).toMatch(/^buffer_filter_path \.\/buf\.js returned .* for a buffer of 3 groups and n = 2: /);
    expect((error as FilterError).message).toContain(detail);
  });
});

describe("takeFromBuffer", () => {
  it("hands out in the filter's order and keeps the rest in buffer order", () => {
    expect(takeFromBuffer(buffer, ["c", "a"])).toEqual({ taken: [{ groupId: "c" }, { groupId: "a" }], remaining: [{ groupId: "b" }] });
    expect(takeFromBuffer(buffer, popFirst(buffer, 2))).toEqual({ taken: buffer.slice(0, 2), remaining: buffer.slice(2) });
  });
});
