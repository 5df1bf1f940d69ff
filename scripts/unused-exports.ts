/**
 * Lists the exports of src/ (tests excepted) that nothing uses: no file of the project (src, its
 * tests, test/, bench/, scripts/, examples/, workers/) refers to them, and neither does their own
 * file. Such an export is dead code. Run: npx tsx scripts/unused-exports.ts [--local]
 * With --local it also lists the exports only their own file uses (the export itself is unneeded).
 *
 * The public entry points (package.json "exports") and the drizzle schema (read by drizzle-kit
 * through drizzle.config.ts) count as used. A module imported whole (`export *`, a dynamic import
 * not destructured) counts as used whole.
 */
import ts from "typescript";
import { relative, resolve as resolvePath } from "node:path";

const root = resolvePath(import.meta.dirname, "..");
const showLocal = process.argv.includes("--local");
const kept = new Set(["src/index.ts", "src/algorithms/index.ts", "src/reward/index.ts", "src/store/schema/index.ts"]);

const config = ts.getParsedCommandLineOfConfigFile(join("tsconfig.json"), {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: () => {} });
if (!config) throw new Error("tsconfig.json: could not be read");
const program = ts.createProgram(config.fileNames, config.options);
const checker = program.getTypeChecker();
const files = program.getSourceFiles().filter((f) => !f.fileName.includes("/node_modules/") && f.fileName.startsWith(root));

function join(path: string): string {
  return resolvePath(root, path);
}

const target = (s: ts.Symbol) => (s.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(s) : s);
/** Per symbol: the files other than its own that refer to it, and how often its own file does. */
const usedFrom = new Map<ts.Symbol, Set<string>>();
const usedLocally = new Map<ts.Symbol, number>();
const usedWhole = new Set<string>();

function markExport(module: ts.Symbol, name: string, from: string): void {
  const e = checker.getExportsOfModule(module).find((x) => x.name === name);
  if (e) usedFrom.set(target(e), new Set([...(usedFrom.get(target(e)) ?? []), from]));
}

/** `const { a } = await import("m")` and `(await import("m")).a` use a and nothing else of m. */
function dynamicImport(n: ts.CallExpression, from: string): void {
  const spec = n.arguments[0];
  const module = spec && ts.isStringLiteral(spec) ? checker.getSymbolAtLocation(spec) : undefined;
  const file = module?.valueDeclaration;
  if (!module || !file || !ts.isSourceFile(file)) return;
  const use = ts.isAwaitExpression(n.parent) ? n.parent.parent : undefined;
  if (use && ts.isVariableDeclaration(use) && ts.isObjectBindingPattern(use.name)) {
    for (const el of use.name.elements) markExport(module, (el.propertyName ?? el.name).getText(), from);
  } else if (use && ts.isParenthesizedExpression(use) && ts.isPropertyAccessExpression(use.parent)) {
    markExport(module, use.parent.name.text, from);
  } else usedWhole.add(file.fileName);
}

for (const f of files) {
  const visit = (n: ts.Node): void => {
    if (ts.isIdentifier(n)) {
      const s = checker.getSymbolAtLocation(n);
      const t = s && target(s);
      // A declaration's own name is not a use of it.
      if (t && !(t.declarations ?? []).some((d) => (d as ts.NamedDeclaration).name === n)) {
        if (t.declarations?.[0]?.getSourceFile().fileName === f.fileName) usedLocally.set(t, (usedLocally.get(t) ?? 0) + 1);
        else usedFrom.set(t, new Set([...(usedFrom.get(t) ?? []), f.fileName]));
      }
    }
    if (ts.isExportDeclaration(n) && !n.exportClause && n.moduleSpecifier) {
      const file = checker.getSymbolAtLocation(n.moduleSpecifier)?.valueDeclaration;
      if (file && ts.isSourceFile(file)) usedWhole.add(file.fileName);
    }
    if (ts.isCallExpression(n) && n.expression.kind === ts.SyntaxKind.ImportKeyword) dynamicImport(n, f.fileName);
    ts.forEachChild(n, visit);
  };
  visit(f);
}

const found: string[] = [];
for (const f of files) {
  const rel = relative(root, f.fileName);
  if (!rel.startsWith("src/") || rel.endsWith(".test.ts") || kept.has(rel) || usedWhole.has(f.fileName)) continue;
  const module = checker.getSymbolAtLocation(f);
  if (!module) continue;
  for (const e of checker.getExportsOfModule(module)) {
    if ((usedFrom.get(target(e))?.size ?? 0) > 0) continue;
    const isLocal = (usedLocally.get(target(e)) ?? 0) > 0;
    if (!isLocal) found.push(`${rel}: ${e.name} (unused)`);
    else if (showLocal) found.push(`${rel}: ${e.name} (used only in its file)`);
  }
}
for (const line of found) console.log(line);
console.log(`${found.length} export(s)`);
// Exits 1 on dead code, so a check can run it; exports used only in their file do not fail it.
if (found.some((l) => l.endsWith("(unused)"))) process.exitCode = 1;
