import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";
import { describe, expect, it } from "vitest";

/**
 * The fold's switch is exhaustive, and the compiler proves it: the same program with one more
 * decision kind in core/decisions.ts (and nothing else changed) fails to type-check in
 * core/run-state.ts, at the `never` of its default case.
 */
const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "../..");

function diagnosticsWith(replace: { file: string; text: string } | null): ts.Diagnostic[] {
  const parsed = ts.getParsedCommandLineOfConfigFile(join(root, "tsconfig.json"), {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: () => undefined });
  if (!parsed) throw new Error("tsconfig.json did not parse");
  const host = ts.createCompilerHost(parsed.options);
  const read = host.readFile.bind(host);
  host.readFile = (name) => (replace !== null && resolve(name) === replace.file ? replace.text : read(name));
  const getSourceFile = host.getSourceFile.bind(host);
  host.getSourceFile = (name, lang, onError, fresh) =>
    replace !== null && resolve(name) === replace.file ? ts.createSourceFile(name, replace.text, lang) : getSourceFile(name, lang, onError, fresh);
  const program = ts.createProgram([join(root, "src/core/run-state.ts")], { ...parsed.options, noEmit: true }, host);
  return [...ts.getPreEmitDiagnostics(program)].filter((d) => d.file !== undefined && resolve(d.file.fileName) === join(root, "src/core/run-state.ts"));
}

describe("the fold covers every decision kind", () => {
  it("type-checks as committed, and fails in run-state.ts when a kind is added without a fold case", () => {
    expect(diagnosticsWith(null).map((d) => ts.flattenDiagnosticMessageText(d.messageText, "\n"))).toEqual([]);
    const decisions = join(root, "src/core/decisions.ts");
    const text = readFileSync(decisions, "utf8");
    const anchor = '  "eval.recorded": z.object({ step: z.number().int() }),\n';
    expect(text).toContain(anchor);
    const added = text.replace(anchor, `${anchor}  "probe.added": z.object({ step: z.number().int() }),\n`);
    const found = diagnosticsWith({ file: decisions, text: added }).map((d) => ts.flattenDiagnosticMessageText(d.messageText, "\n"));
    expect(found.some((m) => m.includes("probe.added") && m.includes("never"))).toBe(true);
  });
});
