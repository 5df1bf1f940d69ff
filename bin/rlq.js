#!/usr/bin/env -S node --max-semi-space-size=64
// The rlq command. Runs the TypeScript sources through tsx (a dependency) so
// the command always matches the sources; falls back to the compiled CLI
// (npm run build) when the sources are not shipped. The shebang's V8 flags are
// src/runtime/node-flags.ts's (why there; a test keeps the two equal).
import { existsSync } from "node:fs";
import { enableCompileCache } from "node:module";

// V8's code cache on disk (os.tmpdir()/node-compile-cache) for every module loaded after this
// line: rlq's few hundred modules compile once, not on every start. It cut `rlq --version` by
// ~20% on a loaded 2-core box (bench/recovery.ts measures the restart it is for).
enableCompileCache?.();

const src = new URL("../src/cli/main.ts", import.meta.url);
let cli;
if (existsSync(src)) {
  const { register } = await import("tsx/esm/api");
  register();
  cli = await import(src.href);
} else {
  cli = await import(new URL("../dist/cli/main.js", import.meta.url).href);
}
cli.runCli(process.argv.slice(2));
