// The fingerprint of rlq's sources as they are on disk: every file under src/
// (path, size, modification time), and package.json. scripts/bundle.mjs records
// it beside the bundle it builds; bin/rlq.js runs that bundle only while the
// fingerprint still matches, so an edited source is never shadowed by an old
// bundle. Plain JavaScript with no dependencies: it runs before tsx is loaded.
import { createHash } from "node:crypto";
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

export const repoRoot = fileURLToPath(new URL("..", import.meta.url));
export const bundleDir = join(repoRoot, "dist", "bundle");
export const bundleEntry = join(bundleDir, "main.js");
export const bundleStamp = join(bundleDir, "sources.json");

function walk(dir, rel, out) {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) walk(p, `${rel}${e.name}/`, out);
    else if (e.isFile()) {
      const s = statSync(p);
      out.push(`${rel}${e.name}:${s.size}:${Math.round(s.mtimeMs)}`);
    }
  }
}

/** sha256 over the sorted list of src/ files and package.json (path:size:mtime). */
export function sourcesFingerprint() {
  const entries = [];
  walk(join(repoRoot, "src"), "src/", entries);
  const pkg = statSync(join(repoRoot, "package.json"));
  entries.push(`package.json:${pkg.size}:${Math.round(pkg.mtimeMs)}`);
  entries.sort();
  return createHash("sha256").update(entries.join("\n")).digest("hex");
}
