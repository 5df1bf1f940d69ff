/**
 * Start a worker_thread running one of our own modules, whether we run from
 * TypeScript sources (tsx, vitest) or from compiled `dist/` JavaScript.
 *
 * Why: engine sessions and trainer steps block the thread that runs them, and a
 * BullMQ worker whose event loop is blocked loses its job lock (docs/architecture.md "The queue"). A
 * plain `new Worker(file.ts)` fails because Node does not load TypeScript, and
 * tsx's loader registered in the parent does not reach workers; so a `.ts`
 * module is started through a one-line bootstrap that registers tsx first.
 */

import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import { Worker, type WorkerOptions } from "node:worker_threads";

export function spawnModuleWorker(moduleUrl: URL, options: WorkerOptions = {}): Worker {
  if (!moduleUrl.pathname.endsWith(".ts")) return new Worker(moduleUrl, options);
  // The ESM build of tsx's API: its CJS build resolves its loader relative to the
  // eval'd script and fails inside a worker.
  const tsxApi = pathToFileURL(
    createRequire(import.meta.url)
      .resolve("tsx/esm/api")
      .replace(/\.cjs$/, ".mjs"),
  ).href;
  const code = [
    `import(${JSON.stringify(tsxApi)})`,
    `  .then((api) => { api.register(); return import(${JSON.stringify(moduleUrl.href)}); })`,
    // Rethrow asynchronously so a failed import surfaces as the worker's 'error' event.
    `  .catch((e) => setImmediate(() => { throw e; }));`,
  ].join("\n");
  return new Worker(code, { ...options, eval: true });
}

/**
 * URL of a sibling module by base name: `./x.ts` when this code runs from sources,
 * `./x.js` from dist (tsc rewrites import specifiers, not URL strings).
 */
export function siblingModuleUrl(importMetaUrl: string, baseName: string): URL {
  const ext = importMetaUrl.endsWith(".ts") ? ".ts" : ".js";
  return new URL(`./${baseName}${ext}`, importMetaUrl);
}
