#!/usr/bin/env node
// The rlq command: the compiled CLI when built (npm run build), else the
// TypeScript sources through tsx (a dependency), so a fresh clone works.
import { existsSync } from "node:fs";

const dist = new URL("../dist/cli/main.js", import.meta.url);
let cli;
if (existsSync(dist)) {
  cli = await import(dist.href);
} else {
  const { register } = await import("tsx/esm/api");
  register();
  cli = await import(new URL("../src/cli/main.ts", import.meta.url).href);
}
cli.runCli(process.argv.slice(2));
