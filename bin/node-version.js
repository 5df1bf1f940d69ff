// The Node.js check bin/rlq.js runs before anything else. Plain JavaScript that Node 18 and 20
// parse, so an old Node reads the message instead of failing somewhere inside rlq.
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";

export const NEEDED = { major: 22, minor: 11 };

/**
 * null when `version` (process.versions.node) will do; else what to say: what rlq needs, what this
 * is, and the one command that gets Node 22 (.ci/node.sh in a checkout, which fetches Node's own
 * release binary from the npm registry; the package manager's Node 22 LTS elsewhere).
 */
export function nodeVersionProblem(version, execPath, repoRoot = fileURLToPath(new URL("..", import.meta.url))) {
  const [major, minor] = version.split(".").map(Number);
  if (major > NEEDED.major || (major === NEEDED.major && minor >= NEEDED.minor)) return null;
  const script = `${repoRoot.replace(/\/$/, "")}/.ci/node.sh`;
  const get = existsSync(script)
    ? `export PATH="$(bash ${script}):$PATH"   # fetches Node 22 from the npm registry`
    : "install Node.js 22 LTS (https://nodejs.org, or your package manager's nodejs 22)";
  return `rlq needs Node.js ${NEEDED.major}.${NEEDED.minor} or newer (package.json "engines"); this is Node.js ${version} (${execPath}).\nGet it with:\n  ${get}\n`;
}
