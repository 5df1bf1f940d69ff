/**
 * Lists the functions in src/ (tests excepted) longer than a bound, longest first: the check behind
 * docs/architecture.md "Function length". Run: npx tsx scripts/long-functions.ts [--max 100]
 * Counts source lines from the function's first to its last line, comments included.
 * The functions allowed past the limit, each with its reason, are scripts/long-functions-exceptions.json;
 * test/lint/function-length.test.ts fails on any other.
 */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import ts from "typescript";

/** The limit docs/architecture.md "Function length" states, in source lines. */
export const MAX_FUNCTION_LINES = 100;

export interface LongFunction {
  lines: number;
  file: string;
  /** 1-based line of the function's first line. */
  line: number;
  name: string;
}

export interface FunctionLengthException {
  file: string;
  name: string;
  reason: string;
}

function nameOf(n: ts.Node): string {
  const named = (n as { name?: ts.Node }).name;
  if (named) return named.getText();
  const p = n.parent;
  if (ts.isVariableDeclaration(p) || ts.isPropertyAssignment(p) || ts.isPropertyDeclaration(p)) return p.name.getText();
  if (ts.isCallExpression(p)) {
    const callee = p.expression;
    return `(argument of ${ts.isPropertyAccessExpression(callee) ? `.${callee.name.getText()}` : callee.getText().slice(0, 40)})`;
  }
  return "(anonymous)";
}

/** The functions with a body in one source text longer than `max` lines. */
export function longFunctionsIn(file: string, text: string, max: number): LongFunction[] {
  const src = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
  const long: LongFunction[] = [];
  const visit = (n: ts.Node): void => {
    if (ts.isFunctionLike(n) && (n as { body?: ts.Node }).body !== undefined) {
      const first = src.getLineAndCharacterOfPosition(n.getStart()).line;
      const last = src.getLineAndCharacterOfPosition(n.getEnd()).line;
      if (last - first + 1 > max) long.push({ lines: last - first + 1, file, line: first + 1, name: nameOf(n) });
    }
    ts.forEachChild(n, visit);
  };
  visit(src);
  return long;
}

/** Every function in src/ (tests excepted, as git lists them from `cwd`) longer than `max` lines, longest first. */
export function longFunctions(max: number, cwd = process.cwd()): LongFunction[] {
  const files = execFileSync("git", ["ls-files", "src/*.ts"], { encoding: "utf8", cwd })
    .split("\n")
    .filter((f) => f !== "" && !f.endsWith(".test.ts"));
  return files.flatMap((f) => longFunctionsIn(f, readFileSync(`${cwd}/${f}`, "utf8"), max)).sort((a, b) => b.lines - a.lines);
}

/** The functions allowed past the limit (scripts/long-functions-exceptions.json). */
export function functionLengthExceptions(): FunctionLengthException[] {
  return JSON.parse(readFileSync(new URL("./long-functions-exceptions.json", import.meta.url), "utf8")) as FunctionLengthException[];
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const at = process.argv.indexOf("--max");
  const max = at >= 0 ? Number(process.argv[at + 1]) : MAX_FUNCTION_LINES;
  const allowed = new Set(functionLengthExceptions().map((e) => `${e.file} ${e.name}`));
  for (const f of longFunctions(max)) {
    const mark = allowed.has(`${f.file} ${f.name}`) ? "  (an exception)" : "";
    console.log(`${String(f.lines).padStart(4)}  ${f.file}:${f.line}  ${f.name}${mark}`);
  }
}
