import { deepStrictEqual, strictEqual } from "node:assert/strict";

/**
 * The two matchers test/helpers/invariants.ts uses, for scripts/fault-outages.ts, which runs
 * outside vitest (vitest's own `expect` refuses to load there). `toEqual` compares JSON-normal
 * forms, as vitest's does not tell an absent property from an undefined one.
 */
export function expect(actual: unknown, message?: string) {
  const normal = (v: unknown) => JSON.parse(JSON.stringify(v ?? null)) as unknown;
  return {
    toEqual(expected: unknown) {
      deepStrictEqual(normal(actual), normal(expected), message);
    },
    toBe(expected: unknown) {
      strictEqual(actual, expected, message);
    },
  };
}
