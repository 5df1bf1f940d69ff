/**
 * @file Decoding a config that a run recorded, under the rlq that reads it now.
 *
 * What the fold (core/run-state.ts), a snapshot's restore and a worker's run context use in place
 * of parseRunConfig: the recorded config goes up the version chain (config-versions.ts) first, so
 * today's schema only ever sees a config of today's shape. A stored config has every default filled
 * in, so the parse is "stored" (the checks of what a user wrote do not run again).
 */
import { parseRunConfig, type RunConfig } from "./run-config.ts";
import { upgradeRecordedConfig } from "./config-versions.ts";

/** A recorded config (`run.created`, the `runs` row, a snapshot) as today's RunConfig. */
export function decodeRecordedConfig(recorded: unknown, source: string): RunConfig {
  return parseRunConfig(upgradeRecordedConfig(recorded, source), source);
}

/** `config` (today's shape) with a `run.amended` decision's changes, recorded at their own version, applied. */
export function applyRecordedChanges(config: RunConfig, changes: unknown, source: string): RunConfig {
  return parseRunConfig({ ...config, ...upgradeRecordedConfig(changes, source) }, source);
}
