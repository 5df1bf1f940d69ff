import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { rlqNodeFlags } from "../../src/runtime/node-flags.ts";
import { repoRoot, spawnRlq } from "../helpers/processes.ts";

describe("rlq's V8 flags (src/runtime/node-flags.ts)", () => {
  it("bin/rlq.js's shebang and the npm scripts that start rlq pass the same flags", () => {
    const flags = rlqNodeFlags.join(" ");
    expect(readFileSync(join(repoRoot, "bin/rlq.js"), "utf8").split("\n")[0]).toBe(`#!/usr/bin/env -S node ${flags}`);
    const scripts = (JSON.parse(readFileSync(join(repoRoot, "package.json"), "utf8")) as { scripts: Record<string, string> }).scripts;
    expect(scripts.demo).toBe(`node ${flags} --import tsx src/cli/main.ts demo`);
    expect(scripts.rlq).toBe(`node ${flags} --import tsx src/cli/main.ts`);
  });

  it("bin/rlq.js starts through its shebang, and the tests' rlq processes get the same flags", async () => {
    // `env -S` splits the shebang's arguments: the command runs (and names the unknown command with the list of commands).
    const bin = spawnSync(join(repoRoot, "bin/rlq.js"), ["no-such-command"], { encoding: "utf8" });
    expect(bin.error).toBeUndefined();
    expect(bin.stderr + bin.stdout).toContain("rlq: unknown command 'no-such-command'");
    const p = spawnRlq(["no-such-command"], {});
    await p.exited;
    expect(p.child.spawnargs).toEqual(expect.arrayContaining([...rlqNodeFlags]));
  });
});
