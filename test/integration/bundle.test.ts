import { statSync, utimesSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { repoRoot, runChecked } from "../helpers/processes.ts";

/**
 * bin/rlq.js runs dist/bundle/ (scripts/bundle.mjs; npm install builds it) only while it matches
 * the sources (bin/sources-fingerprint.js), and the sources through tsx otherwise. `rlq --version`
 * says which ran. Every test that starts rlq through spawnRlq runs the bundle this way, so the
 * runs, crashes and resumes of the suite are the bundle's tests too.
 */
const rlqVersion = (env: NodeJS.ProcessEnv = {}) =>
  runChecked(process.execPath, [join(repoRoot, "bin/rlq.js"), "--version"], {
    cwd: repoRoot,
    env: { PATH: process.env.PATH ?? "", ...env },
    timeoutMs: 120_000,
  });

describe("bin/rlq.js and dist/bundle", () => {
  it("runs the bundle while it matches the sources, the sources once one changes, and the bundle again when it is restored", async () => {
    if (!(await rlqVersion()).includes("(bundle")) {
      // A checkout whose sources changed since npm install: build the bundle for them.
      await runChecked(process.execPath, [join(repoRoot, "scripts/bundle.mjs")], { cwd: repoRoot, timeoutMs: 300_000 });
    }
    expect(await rlqVersion()).toMatch(/^rlq \S+ \(bundle, built \d{4}-\d\d-\d\dT/);
    expect(await rlqVersion({ RLQ_FROM_SOURCES: "1" })).toMatch(/^rlq \S+ \(sources\)\n$/);

    // An edited source (here only its modification time moves) is never shadowed by the older bundle.
    const file = join(repoRoot, "src/cli/help.ts");
    const before = statSync(file);
    try {
      utimesSync(file, before.atime, new Date(before.mtimeMs + 5_000));
      expect(await rlqVersion()).toMatch(/\(sources\)/);
    } finally {
      // Seconds as a number keep the sub-millisecond part a Date would drop (the fingerprint rounds to a millisecond).
      utimesSync(file, before.atimeMs / 1000, before.mtimeMs / 1000);
    }
    expect(await rlqVersion()).toMatch(/\(bundle, built /);
  });
});
