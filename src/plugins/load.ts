/**
 * User plugins by module path, as in slime (custom_rm_path,
 * dynamic_sampling_filter_path, buffer_filter_path, ...). A module is loaded
 * with dynamic import(); its fingerprint (sha256 of the file) is recorded at
 * run start, and a run refuses to resume if the file changed.
 * `module.js:exportName` picks an export; otherwise the conventional name.
 */

import { readFile } from "node:fs/promises";
import { isAbsolute, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { sha256Hex } from "../lib/hash.ts";
import { RlqError } from "../lib/errors.ts";

export interface PluginRef {
  file: string;
  exportName: string | null;
}

export function parsePluginPath(path: string, baseDir: string): PluginRef {
  const colon = path.lastIndexOf(":");
  const hasExport = colon > 1 && !path.slice(colon).includes("/");
  const file = hasExport ? path.slice(0, colon) : path;
  return { file: isAbsolute(file) ? file : resolve(baseDir, file), exportName: hasExport ? path.slice(colon + 1) : null };
}

export async function fingerprintFile(file: string, what: string): Promise<string> {
  try {
    return sha256Hex(await readFile(file));
  } catch (e) {
    throw new RlqError("plugin_missing", `${what}: cannot read ${file}: ${(e as Error).message}`);
  }
}

const cache = new Map<string, unknown>();

/**
 * bin/rlq.js running dist/bundle/ registers no TypeScript loader up front (tsx's hooks would
 * re-read the bundle on every start); the first plugin written in TypeScript registers tsx.
 * From the sources (tsx already registered) the flag is never set and this does nothing.
 */
async function ensureTypeScriptLoader(file: string): Promise<void> {
  const flags = globalThis as unknown as Record<symbol, unknown>;
  const pending = Symbol.for("rlq.tsLoaderPending");
  if (flags[pending] !== true || !/\.[cm]?tsx?$/.test(file)) return;
  flags[pending] = false;
  const { register } = await import("tsx/esm/api");
  register();
}

/** Load a function export from a plugin module. */
export async function loadPluginFunction<F extends (...args: never[]) => unknown>(ref: PluginRef, defaultExports: readonly string[], what: string): Promise<F> {
  const key = `${ref.file}#${ref.exportName ?? defaultExports.join("|")}`;
  const hit = cache.get(key);
  if (hit) return hit as F;
  let mod: Record<string, unknown>;
  try {
    await ensureTypeScriptLoader(ref.file);
    mod = (await import(pathToFileURL(ref.file).href)) as Record<string, unknown>;
  } catch (e) {
    throw new RlqError("plugin_load_failed", `${what}: cannot import ${ref.file}: ${(e as Error).message}`, { cause: e });
  }
  const names = ref.exportName ? [ref.exportName] : [...defaultExports, "default"];
  for (const name of names) {
    const fn = mod[name];
    if (typeof fn === "function") {
      cache.set(key, fn);
      return fn as F;
    }
  }
  throw new RlqError("plugin_bad_export", `${what}: ${ref.file} exports no function named ${names.map((n) => `'${n}'`).join(" or ")}`);
}
