/**
 * What an amend of a live run may change, checked in one place: by the API
 * and `rlq run amend` before the request is recorded, and by the controller
 * again when it applies it (a request written by other means, or one checked
 * against a config an earlier amend has since changed). Pure.
 */

import { amendableKeys, ConfigError, parseRunConfig, type RunConfig } from "./run-config.ts";
import { renamedKeyAdvice } from "./config-versions.ts";

const amendableList = () =>
  Object.entries(amendableKeys)
    .map(([k, why]) => `${k} (${why})`)
    .join(", ");

/**
 * Check `changes` against the run's current config: every key amendable, and
 * the amended config valid under the run-config schema. Returns the amended
 * config; throws ConfigError naming each key refused, its value and what to
 * write instead.
 */
export function checkAmend(changes: Readonly<Record<string, unknown>>, current: Readonly<Record<string, unknown>>, source = "amend"): RunConfig {
  const keys = Object.keys(changes);
  if (keys.length === 0) throw new ConfigError(`${source}: no keys to change; write the keys and their new values, e.g. {num_rollout: 10}`);
  const bad = keys.filter((k) => !(k in amendableKeys));
  if (bad.length > 0) {
    const renamed = bad.flatMap((k) => (renamedKeyAdvice(k) === null ? [] : [`'${k}' ${renamedKeyAdvice(k)}`]));
    throw new ConfigError(
      `${source}: keys ${bad.join(", ")} cannot be amended on a live run (allowed: ${amendableList()})${renamed.length > 0 ? `; ${renamed.join("; ")}` : ""}; to change anything else, start a new run`,
    );
  }
  return parseRunConfig({ ...current, ...changes }, source);
}
