import { spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { repoRoot, runCommand } from "../helpers/processes.ts";

/**
 * The reference PyTorch trainer's own tests (parity with src/algorithms to
 * 1e-6, model, trainer, protocol server), run by `npm test` so CI runs them.
 * The parity vectors are exported by a committed script; `--check` fails if
 * the committed JSON no longer matches what src/algorithms produces.
 */
function python(): string | null {
  const candidates = [process.env.RLQ_PYTHON, "python3", "/usr/bin/python3"].filter((c): c is string => Boolean(c));
  // Prefer an interpreter with torch (all tests run); numpy alone runs the parity tests.
  for (const probe of ["import torch, numpy", "import numpy"]) {
    for (const py of candidates) if (spawnSync(py, ["-c", probe], { stdio: "ignore" }).status === 0) return py;
  }
  return null;
}
const py = python();

describe("workers/trainer-torch", () => {
  it("the committed parity vectors are what src/algorithms produces", async () => {
    const r = await runCommand(process.execPath, ["--import", "tsx", "scripts/export-parity-vectors.ts", "--check"], { cwd: repoRoot });
    expect(r.status, r.stdout + r.stderr).toBe(0);
  });

  it.skipIf(!py)(
    "its Python test suite passes (parity to 1e-6, model, trainer, protocol)",
    async () => {
      const r = await runCommand(py as string, ["-m", "unittest", "discover", "-s", "workers/trainer-torch/tests"], { cwd: repoRoot, timeoutMs: 580_000 });
      expect(r.status, r.status === null ? "the Python suite ran past 580 s and was killed" : r.stderr.slice(-4000)).toBe(0);
      expect(r.stderr).toMatch(/OK/);
      console.log(`${py}: ${/Ran \d+ tests?.*/.exec(r.stderr)?.[0] ?? ""} ${/OK.*$/m.exec(r.stderr)?.[0] ?? ""}`);
      // ~60 s on a quiet 2-core box; the limit leaves room for a heavily loaded one, and the child is killed before it.
    },
    600_000,
  );
});
