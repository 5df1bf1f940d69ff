import { readFile } from "node:fs/promises";
import { parse as parseYaml } from "yaml";
import { ConfigError } from "./run-config.ts";

/** Parse `--set key=value` (value as a YAML scalar/flow value; dotted keys reach nested objects). */
export function applyOverrides(raw: Record<string, unknown>, sets: readonly string[]): Record<string, unknown> {
  const out: Record<string, unknown> = structuredClone(raw);
  for (const set of sets) {
    const eq = set.indexOf("=");
    if (eq <= 0) throw new ConfigError(`--set ${JSON.stringify(set)}: expected key=value`);
    const key = set.slice(0, eq).trim();
    const text = set.slice(eq + 1);
    let value: unknown;
    try {
      value = parseYaml(text);
    } catch (e) {
      throw new ConfigError(`--set ${key}: cannot parse value ${JSON.stringify(text)}: ${(e as Error).message}`);
    }
    const path = key.split(".");
    let cur: Record<string, unknown> = out;
    for (const part of path.slice(0, -1)) {
      const next = cur[part];
      if (next === undefined || next === null || typeof next !== "object") cur[part] = {};
      cur = cur[part] as Record<string, unknown>;
    }
    cur[path[path.length - 1] as string] = value === null && text.trim() === "" ? "" : value;
  }
  return out;
}

export async function readConfigFile(path: string): Promise<Record<string, unknown>> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (e) {
    throw new ConfigError(`config file ${path}: ${(e as Error).message}`);
  }
  let raw: unknown;
  try {
    raw = path.endsWith(".json") ? JSON.parse(text) : parseYaml(text);
  } catch (e) {
    throw new ConfigError(`config file ${path}: not valid ${path.endsWith(".json") ? "JSON" : "YAML"}: ${(e as Error).message}`);
  }
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
    throw new ConfigError(`config file ${path}: expected a mapping of keys to values`);
  }
  return raw as Record<string, unknown>;
}
