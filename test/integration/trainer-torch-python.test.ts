import { describe, expect, it } from "vitest";
import { repoRoot, runCommand } from "../helpers/processes.ts";
import { rlqPython } from "../helpers/python.ts";

/**
 * The reference PyTorch trainer's own tests (parity with src/algorithms to
 * 1e-6, model, trainer, protocol server), run by `npm test` so CI runs them.
 * The parity vectors are exported by a committed script; `--check` fails if
 * the committed JSON no longer matches what src/algorithms produces. It runs in rlq's Python
 * environment (torch 2.13, transformers; scripts/python-env.sh), which the global setup builds.
 */
const py = rlqPython();

describe("workers/trainer-torch", () => {
  it("the committed parity vectors are what src/algorithms produces", async () => {
    const r = await runCommand(process.execPath, ["--import", "tsx", "scripts/export-parity-vectors.ts", "--check"], { cwd: repoRoot });
    expect(r.status, r.stdout + r.stderr).toBe(0);
  });

  it("its Python test suite passes (parity to 1e-6, model, trainer, protocol)", async () => {
    const r = await runCommand(py, ["-m", "unittest", "discover", "-s", "workers/trainer-torch/tests"], { cwd: repoRoot, timeoutMs: 580_000 });
    expect(r.status, r.status === null ? "the Python suite ran past 580 s and was killed" : r.stderr.slice(-4000)).toBe(0);
    expect(r.stderr).toMatch(/OK/);
    expect(r.stderr, "a Python test skipped: the suite must run whole in CI").not.toMatch(/skipped=\d+/);
    console.log(`${py}: ${/Ran \d+ tests?.*/.exec(r.stderr)?.[0] ?? ""} ${/OK.*$/m.exec(r.stderr)?.[0] ?? ""}`);
    // ~140 s on a quiet 2-core box (torch 2.13, transformers 5); the limit leaves room for a heavily loaded one, and the child is killed before it.
  }, 600_000);
});
