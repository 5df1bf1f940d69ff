import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { repoRoot } from "../helpers/processes.ts";

/** The installed command (bin/rlq.js) as a user types it: help and version need no database. */
function rlq(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [join(repoRoot, "bin/rlq.js"), ...args], { cwd: repoRoot, env: { PATH: process.env.PATH ?? "" } }, (err, stdout, stderr) => {
      resolve({ code: err ? Number(err.code ?? 1) : 0, stdout, stderr });
    });
  });
}

describe("rlq help and version from the real bin/rlq.js", () => {
  const version = (JSON.parse(readFileSync(join(repoRoot, "package.json"), "utf8")) as { version: string }).version;

  it("--help, help CMD, CMD --help and --version exit 0; a typo exits 2 with the nearest command", async () => {
    const help = await rlq(["--help"]);
    expect(help.code, help.stderr).toBe(0);
    expect(help.stdout).toMatch(/^ {2}rlq run start --config FILE/m);
    expect(help.stdout).toMatch(/^ {2}rlq config import-slime/m);
    const topic = await rlq(["help", "config"]);
    expect(topic.code).toBe(0);
    expect(topic.stdout).toMatch(/rlq config check FILE/);
    const sub = await rlq(["up", "--help"]);
    expect(sub.code).toBe(0);
    expect(sub.stdout).toMatch(/^ {2}rlq up /);
    const v = await rlq(["--version"]);
    expect(v).toMatchObject({
      code: 0,
      stdout: expect.stringMatching(new RegExp(`^rlq ${version.replace(/\./g, "\\.")} \\((bundle, built \\S+|sources)\\)\n$`)),
    });
    const typo = await rlq(["sttus"]);
    expect(typo.code).toBe(2);
    const typo2 = await rlq(["repaly", "r1"]);
    expect(typo2).toMatchObject({ code: 2, stderr: expect.stringContaining("rlq: unknown command 'repaly'; did you mean 'rlq replay'?") });
    const runTypo = await rlq(["run", "strat", "--config", "x.yaml"]);
    expect(runTypo).toMatchObject({ code: 2, stderr: expect.stringContaining("did you mean 'rlq run start'?") });
  });

  it("config import-slime runs from the command line and writes the report to stderr", async () => {
    const r = await rlq(["config", "import-slime", "test/fixtures/slime/run-qwen3-4B.sh"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe(readFileSync(join(repoRoot, "test/fixtures/slime/run-qwen3-4B.rlq.yaml"), "utf8"));
    expect(r.stderr).toBe(readFileSync(join(repoRoot, "test/fixtures/slime/run-qwen3-4B.report.txt"), "utf8"));
  });
});
