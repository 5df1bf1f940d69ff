import { spawn } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { repoRoot } from "../helpers/processes.ts";
import { rlqNodeFlags } from "../../src/runtime/node-flags.ts";
import { requirePythonModules } from "../helpers/python.ts";

/**
 * The Python client (python/rlq_client: the standard library, and pandas for
 * rollouts_frame) against a real rlq, under the project's Python: its own
 * unittest suite, given this world's database, queue prefix, fake engines and
 * trainer, starts a run, waits for it through `rlq up`, reads its
 * status and queries its rollouts through `rlq sql`; and pauses a second run,
 * sees it paused, resumes it and sees it complete.
 */
let w: World;
beforeAll(async () => {
  w = await createWorld("pyclient");
});
afterAll(async () => {
  await w?.close();
});

describe("python/rlq_client", () => {
  it("starts, amends, pauses, resumes, waits for and queries runs (python -m unittest)", async () => {
    const python = requirePythonModules(["pandas"]);
    const child = spawn(python, ["-m", "unittest", "-v", "tests.test_client"], {
      cwd: join(repoRoot, "python/rlq_client"),
      env: {
        ...process.env,
        RLQ_CLIENT_TEST_COMMAND: JSON.stringify([process.execPath, ...rlqNodeFlags, join(repoRoot, "bin/rlq.js")]),
        RLQ_CLIENT_TEST_ENV: JSON.stringify({ ...w.env, NODE_COMPILE_CACHE: join(tmpdir(), "node-compile-cache") }),
        RLQ_CLIENT_TEST_CONFIG: JSON.stringify(w.baseConfig({ num_rollout: 1, engine: { kind: "sglang", urls: [await w.freshEngine()] } })),
        // Its own engine: the engines of the first run serve that run's weight versions.
        RLQ_CLIENT_TEST_PAUSE_CONFIG: JSON.stringify(w.baseConfig({ num_rollout: 2, engine: { kind: "sglang", urls: [await w.freshEngine()] } })),
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    child.stdout.on("data", (d: Buffer) => (output += d.toString()));
    child.stderr.on("data", (d: Buffer) => (output += d.toString()));
    const code = await new Promise<number | null>((r) => child.on("exit", r));
    expect(code, output).toBe(0);
    expect(output).toMatch(/Ran 3 tests/);
  });
});
