import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { repoRoot } from "./processes.ts";

/**
 * rlq's one Python environment (torch 2.13, transformers, vLLM's CPU build), built by
 * scripts/python-env.sh from python/requirements.lock. The integration suite's global setup builds
 * it (reused while its stamp matches the lock); a test that needs Python asks here and fails,
 * never skips, when it is missing, naming the command that builds it.
 */
export const BUILD_COMMAND = "bash scripts/python-env.sh";

export function venvDir(): string {
  return process.env.RLQ_VENV ?? join(repoRoot, ".venv");
}

/** Build the environment if it is missing or stale; returns its python. Used by the global setup. */
export function ensurePythonEnv(): string {
  const r = spawnSync("bash", [join(repoRoot, "scripts/python-env.sh")], { cwd: repoRoot, encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] });
  const py = r.stdout.trim().split("\n").pop() ?? "";
  if (r.status !== 0 || !existsSync(py))
    throw new Error(`could not build rlq's Python environment (exit ${r.status}); run \`${BUILD_COMMAND}\` and read its output`);
  return py;
}

/** The environment's python, for a test that needs torch, transformers or vLLM. Throws with the build command when it is missing. */
export function rlqPython(): string {
  const py = join(venvDir(), "bin", "python");
  if (!existsSync(py) || !existsSync(join(venvDir(), ".rlq-stamp")))
    throw new Error(`rlq's Python environment is missing at ${venvDir()}: build it with \`${BUILD_COMMAND}\` (npm test's global setup does)`);
  return py;
}

/** Fails with the install command unless `modules` import in the environment. */
export function requirePythonModules(modules: readonly string[]): string {
  const py = rlqPython();
  const r = spawnSync(py, ["-c", `import ${modules.join(", ")}`], { encoding: "utf8", timeout: 120_000 });
  if (r.status !== 0)
    throw new Error(
      `${py} cannot import ${modules.join(", ")}: rebuild the environment with \`rm -rf ${venvDir()} && ${BUILD_COMMAND}\`\n${r.stderr.slice(-2000)}`,
    );
  return py;
}

/** What the environment holds (for logs). */
export function pythonEnvStamp(): string {
  return readFileSync(join(venvDir(), ".rlq-stamp"), "utf8").trim();
}
