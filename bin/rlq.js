#!/usr/bin/env -S node --max-semi-space-size=64
// The rlq command. Runs dist/bundle/ (npm run bundle; npm install builds it)
// while it was built from the sources as they are now, else the TypeScript
// sources through tsx (a dependency), so the command always matches the
// sources; else the compiled CLI (npm run build) when the sources are not
// shipped. RLQ_FROM_SOURCES=1 always runs the sources. The shebang's V8 flags
// are src/runtime/node-flags.ts's (why there; a test keeps the two equal).
import { existsSync, readFileSync } from "node:fs";
import * as nodeModule from "node:module"; // a namespace: Node 20 has no enableCompileCache, and a named import would fail before the version check
import { pathToFileURL } from "node:url";
import { bundleEntry, bundleStamp, sourcesFingerprint } from "./sources-fingerprint.js";
import { nodeVersionProblem } from "./node-version.js";

const tooOld = nodeVersionProblem(process.versions.node, process.execPath);
if (tooOld) {
  process.stderr.write(tooOld);
  process.exit(1);
}

// V8's code cache on disk (os.tmpdir()/node-compile-cache) for every module loaded after this
// line: rlq's modules compile once, not on every start (bench/recovery.ts measures the restart it is for).
nodeModule.enableCompileCache?.();

/** The bundle's stamp when the bundle exists and matches the sources, else null. */
function freshBundle() {
  if (process.env.RLQ_FROM_SOURCES === "1" || !existsSync(bundleStamp) || !existsSync(bundleEntry)) return null;
  try {
    const stamp = JSON.parse(readFileSync(bundleStamp, "utf8"));
    return stamp.fingerprint === sourcesFingerprint() ? stamp : null;
  } catch {
    return null;
  }
}

const src = new URL("../src/cli/main.ts", import.meta.url);
const hasSources = existsSync(src);
const bundle = hasSources ? freshBundle() : null;
let cli;
if (bundle) {
  // No TypeScript loader up front: tsx's hooks would pass the bundle's megabytes through its
  // transform on every start (measured: slower than the sources). The first plugin written in
  // TypeScript registers it (src/plugins/load.ts).
  globalThis[Symbol.for("rlq.tsLoaderPending")] = true;
  globalThis[Symbol.for("rlq.entry")] = { bundleBuiltAt: bundle.builtAt }; // rlq --version says so
  cli = await import(pathToFileURL(bundleEntry).href);
} else if (hasSources) {
  const { register } = await import("tsx/esm/api");
  register();
  cli = await import(src.href);
} else {
  cli = await import(new URL("../dist/cli/main.js", import.meta.url).href);
}
cli.runCli(process.argv.slice(2));
