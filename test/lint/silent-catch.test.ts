import { execFileSync } from "node:child_process";
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { repoRoot } from "../helpers/processes.ts";

/**
 * @file No silent catch (docs/errors.md, /work/shared/STYLE.md "Validation and errors"): a catch
 * that drops its error either handles a named case, with a comment beside it (on its line or the
 * line above) saying why nothing is lost, or it logs with context and so is not one of these forms.
 *
 * The forms are found with grep, as an operator would: issue 40's own pattern
 * (`catch(() => undefined)`, `catch(() => {})`, `catch {}`) and the other ways of saying the same:
 * a handler that answers a constant (`null`, `false`, `true`, `[]`, `""`, `void 0`), an empty
 * `catch (e) {}`, and an `"error"` listener that drops the error.
 */
const PATTERNS = [
  String.raw`catch *\(\(\) *=> *(undefined|\{\})\)|catch *\{ *\}`,
  String.raw`\.catch\( *\(_?[A-Za-z]*\) *=> *(undefined|null|false|true|void 0|\[\]( as [^)]*)?|""|\{ *\}) *\)`,
  String.raw`catch *\( *[A-Za-z_$][A-Za-z0-9_$]* *\) *\{ *\}`,
  String.raw`\.on\( *"error", *\(_?[A-Za-z]*\) *=> *(undefined|\{ *\}) *\)`,
];

interface Hit {
  file: string;
  line: number;
  text: string;
}

/** Every line under `root/src` that one of PATTERNS finds, and whether a comment stands beside it. */
function silentCatches(root: string): { commented: Hit[]; uncommented: Hit[] } {
  let out = "";
  try {
    out = execFileSync("grep", ["-rnE", PATTERNS.join("|"), "src"], { cwd: root, encoding: "utf8", maxBuffer: 64 << 20 });
  } catch (e) {
    // grep exits 1 when it finds nothing: that is the answer, not a failure; any other status is.
    if ((e as { status?: number }).status !== 1) throw e;
  }
  const commented: Hit[] = [];
  const uncommented: Hit[] = [];
  const files = new Map<string, string[]>();
  for (const row of out.split("\n").filter((l) => l !== "")) {
    const m = /^([^:]+):(\d+):(.*)$/.exec(row);
    if (!m) throw new Error(`grep answered a line of an unexpected shape: ${row}`);
    const hit = { file: m[1] as string, line: Number(m[2]), text: (m[3] as string).trim() };
    let lines = files.get(hit.file);
    if (!lines) files.set(hit.file, (lines = readFileSync(join(root, hit.file), "utf8").split("\n")));
    const above = (lines[hit.line - 2] ?? "").trim();
    const isBeside = /\/\/|\/\*/.test(hit.text.replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`(?:[^`\\]|\\.)*`/g, "")) || /^(\/\/|\/\*|\*)/.test(above);
    (isBeside ? commented : uncommented).push(hit);
  }
  return { commented, uncommented };
}

function show(hits: Hit[]): string {
  return hits.map((h) => `${h.file}:${h.line}: ${h.text}`).join("\n");
}

describe("no silent catch in src/", () => {
  it("every catch that drops its error has a comment beside it saying why nothing is lost", () => {
    const { uncommented } = silentCatches(repoRoot);
    expect(
      show(uncommented),
      "Each of these catches drops its error: log it with context (the caller's logger: observability/logger.ts), handle a named case " +
        "(lib/if-missing.ts for a missing file, a code of lib/errors.ts), or put a comment on its line or the line above saying why nothing is lost",
    ).toBe("");
  });

  const copy = mkdtempSync(join(tmpdir(), "rlq-silent-catch-"));
  afterAll(() => rmSync(copy, { recursive: true, force: true }));

  it("fails on a silent catch planted in a copy of src/, and passes the same catch with a comment", () => {
    cpSync(join(repoRoot, "src"), join(copy, "src"), { recursive: true });
    const before = silentCatches(copy).uncommented.length;
    const planted = [
      "export async function probeA(p: Promise<void>) { await p.catch(() => undefined); }",
      "export async function probeB(p: Promise<number>) { return p.catch(() => null); }",
      "export function probeC(f: () => void) { try { f(); } catch (e) {} }",
      "export function probeD(f: () => void) { try { f(); } catch {} }",
      'export function probeE(s: { on(ev: string, f: () => void): void }) { s.on("error", () => undefined); }',
      "export async function probeF(p: Promise<string[]>) { return p.catch(() => [] as string[]); }",
      "// The probe's promise only orders work: its failure reaches the caller through p itself.",
      "export async function probeG(p: Promise<void>) { await p.catch(() => undefined); }",
      "export async function probeH(p: Promise<void>) { await p.catch(() => undefined); } // same: ordering only",
    ];
    writeFileSync(join(copy, "src/lib/planted-probe.ts"), `${planted.join("\n")}\n`);
    const { commented, uncommented } = silentCatches(copy);
    expect(uncommented.length - before).toBe(6);
    expect(uncommented.filter((h) => h.file === "src/lib/planted-probe.ts").map((h) => h.line)).toEqual([1, 2, 3, 4, 5, 6]);
    expect(commented.filter((h) => h.file === "src/lib/planted-probe.ts").map((h) => h.line)).toEqual([8, 9]);
  });
});
