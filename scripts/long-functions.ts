/**
 * Lists the functions in src/ (tests excepted) longer than a bound, longest first: the check behind
 * docs/architecture.md "Function length". Run: npx tsx scripts/long-functions.ts [--max 100]
 * Counts source lines from the function's first to its last line, comments included.
 */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import ts from "typescript";

const at = process.argv.indexOf("--max");
const max = at >= 0 ? Number(process.argv[at + 1]) : 100;
const files = execFileSync("git", ["ls-files", "src/*.ts"], { encoding: "utf8" })
  .split("\n")
  .filter((f) => f !== "" && !f.endsWith(".test.ts"));

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

const long: Array<{ lines: number; where: string; name: string }> = [];
for (const file of files) {
  const src = ts.createSourceFile(file, readFileSync(file, "utf8"), ts.ScriptTarget.Latest, true);
  const visit = (n: ts.Node): void => {
    if (ts.isFunctionLike(n) && (n as { body?: ts.Node }).body !== undefined) {
      const first = src.getLineAndCharacterOfPosition(n.getStart()).line;
      const last = src.getLineAndCharacterOfPosition(n.getEnd()).line;
      if (last - first + 1 > max) long.push({ lines: last - first + 1, where: `${file}:${first + 1}`, name: nameOf(n) });
    }
    ts.forEachChild(n, visit);
  };
  visit(src);
}
for (const f of long.sort((a, b) => b.lines - a.lines)) console.log(`${String(f.lines).padStart(4)}  ${f.where}  ${f.name}`);
