import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { functionLengthExceptions, longFunctions, longFunctionsIn, MAX_FUNCTION_LINES } from "../../scripts/long-functions.ts";

/**
 * No function in src/ runs past MAX_FUNCTION_LINES except those in
 * scripts/long-functions-exceptions.json, each named with its reason in docs/architecture.md
 * "Function length". An exception that is no longer long is stale and fails too, so the list
 * only shrinks with the code.
 */
const root = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const key = (f: { file: string; name: string }) => `${f.file} ${f.name}`;

describe("function length", () => {
  const exceptions = functionLengthExceptions();
  const long = longFunctions(MAX_FUNCTION_LINES, root);

  it("finds a function one line past the limit, and none at the limit (the check can fail)", () => {
    const fn = (lines: number) => `export function f(): number {\n${"  let x = 0;\n".repeat(lines - 3)}  return x;\n}\n`;
    expect(longFunctionsIn("probe.ts", fn(MAX_FUNCTION_LINES), MAX_FUNCTION_LINES)).toEqual([]);
    expect(longFunctionsIn("probe.ts", fn(MAX_FUNCTION_LINES + 1), MAX_FUNCTION_LINES)).toEqual([
      { lines: MAX_FUNCTION_LINES + 1, file: "probe.ts", line: 1, name: "f" },
    ]);
  });

  it(`has no function in src/ over ${MAX_FUNCTION_LINES} lines outside scripts/long-functions-exceptions.json`, () => {
    const allowed = new Set(exceptions.map(key));
    const offenders = long.filter((f) => !allowed.has(key(f))).map((f) => `${f.file}:${f.line} ${f.name} (${f.lines} lines)`);
    // Split it into named pieces (docs/architecture.md "Function length"), or add it to the exceptions with its reason.
    expect(offenders).toEqual([]);
  });

  it("lists only exceptions that are still long, each with a reason", () => {
    const found = new Set(long.map(key));
    expect(exceptions.filter((e) => !found.has(key(e))).map(key)).toEqual([]);
    expect(exceptions.filter((e) => e.reason.trim().length === 0).map(key)).toEqual([]);
  });

  it('names every exception in docs/architecture.md "Function length"', () => {
    const doc = readFileSync(resolve(root, "docs/architecture.md"), "utf8");
    const start = doc.indexOf("## Function length");
    expect(start).toBeGreaterThanOrEqual(0);
    const end = doc.indexOf("\n## ", start + 1);
    const section = doc.slice(start, end < 0 ? undefined : end);
    expect(section).toContain("scripts/long-functions-exceptions.json");
    const unnamed = exceptions.filter((e) => {
      const name = e.name === "(argument of .superRefine)" ? "superRefine" : e.name;
      return !section.includes(e.file.replace(/^src\//, "")) || !section.includes(name);
    });
    expect(unnamed.map(key)).toEqual([]);
  });
});
