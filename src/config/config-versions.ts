/**
 * @file Versions of the recorded run config, and the chain of upgrades between them.
 *
 * A run records its validated config once (the `run.created` decision, the `runs` row, snapshots)
 * and folds it again on every restart and `rlq replay`, possibly under a newer rlq. Every config
 * rlq records carries `config_version`: the shape of run-config.ts it was validated against. A
 * config recorded before versioning has no such key and is version 1. Decoding a recorded config
 * runs it through `configUpgrades` (pure functions, one per version step, like a migration chain)
 * up to CONFIG_VERSION, and only then through today's schema (config/recorded-config.ts), so a key
 * renamed, removed or tightened in run-config.ts never breaks the replay of an earlier run.
 *
 * A change to run-config.ts that a recorded config of the current version would no longer pass
 * (a key renamed or removed, a value narrowed, a default changed that a stored config relies on)
 * bumps CONFIG_VERSION and appends its upgrade here. Adding a key with a default needs neither:
 * the schema fills it in.
 *
 * This module imports no schema: the fold (core/run-state.ts) runs these functions on every restart.
 */
import { RlqError } from "../lib/errors.ts";

/** The key, in every recorded config (whole or an amendment's changes), that names its version. */
export const CONFIG_VERSION_KEY = "config_version";

/**
 * One step of the chain: turns a recorded config of version `from` into version `from + 1`.
 * Invariant: an upgrade touches only the keys present (a rename moves a key that is there, a
 * rewrite changes a value that is there) and adds no defaults, so the same function upgrades a
 * whole config and an amendment's partial `changes`. Pure: no I/O, no clock, returns a new object.
 */
export interface ConfigUpgrade {
  from: number;
  /** Why the shape changed: said in the error a config of the old shape gets when written by hand. */
  why: string;
  /** Keys of version `from` renamed in `from + 1` (old name → new name). */
  renamed: Readonly<Record<string, string>>;
  upgrade(config: Readonly<Record<string, unknown>>): Record<string, unknown>;
}

/** Rename keys that are present; an upgrade built from it satisfies ConfigUpgrade's invariant. */
export function renameKeys(config: Readonly<Record<string, unknown>>, renamed: Readonly<Record<string, string>>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(config)) out[renamed[key] ?? key] = value;
  return out;
}

const toTrainMaxAttempts = { max_attempts: "train_max_attempts" } as const;

/** The chain, in order: entry i upgrades version i + 1 to i + 2. */
export const configUpgrades: readonly ConfigUpgrade[] = [
  {
    from: 1,
    why: "it bounds the train job's attempts only (rollout, reward and eval jobs have their own retry rules)",
    renamed: toTrainMaxAttempts,
    upgrade: (c) => renameKeys(c, toTrainMaxAttempts),
  },
];

/** The version of run-config.ts's shape: what this rlq records, and the newest it can decode. */
export const CONFIG_VERSION = 1 + configUpgrades.length;

/** A config as rlq records it: the keys plus the version of the shape they follow. */
export function withConfigVersion(config: object): Record<string, unknown> {
  return { ...(config as Record<string, unknown>), [CONFIG_VERSION_KEY]: CONFIG_VERSION };
}

/**
 * A recorded config (or an amendment's changes) upgraded to the current shape, without its version
 * key. `upgrades` and `current` are for tests of the chain; callers use the defaults.
 *
 * @throws RlqError `config_version_unknown` for a version newer than this rlq knows (a run recorded
 *   by a newer rlq); `config_invalid` for a version that is not a positive integer, or a config that
 *   is not an object.
 */
export function upgradeRecordedConfig(
  recorded: unknown,
  source: string,
  upgrades: readonly ConfigUpgrade[] = configUpgrades,
  current: number = 1 + upgrades.length,
): Record<string, unknown> {
  if (recorded === null || typeof recorded !== "object" || Array.isArray(recorded))
    throw new RlqError("config_invalid", `${source}: a recorded config must be an object (got ${JSON.stringify(recorded)})`);
  const { [CONFIG_VERSION_KEY]: rawVersion = 1, ...rest } = recorded as Record<string, unknown>;
  if (typeof rawVersion !== "number" || !Number.isInteger(rawVersion) || rawVersion < 1)
    throw new RlqError("config_invalid", `${source}: ${CONFIG_VERSION_KEY} = ${JSON.stringify(rawVersion)}: expected a positive integer`);
  if (rawVersion > current)
    throw new RlqError(
      "config_version_unknown",
      `${source}: ${CONFIG_VERSION_KEY} = ${rawVersion}, but this rlq knows config versions 1 to ${current}: ` +
        "the run was recorded by a newer rlq; run it with that rlq version or a later one",
    );
  let config: Record<string, unknown> = rest;
  for (let version = rawVersion; version < current; version++) {
    const step = upgrades[version - 1];
    if (step?.from !== version) throw new RlqError("invariant_violated", `config upgrade chain: no upgrade from version ${version}`);
    config = step.upgrade(config);
  }
  return config;
}

/** For a key a user wrote under its old name: where it went and why, or null. */
export function renamedKeyAdvice(key: string): string | null {
  let name = key;
  let first: ConfigUpgrade | null = null;
  // A key renamed twice is sent to its newest name, with the reason of its first rename.
  for (const u of configUpgrades) {
    const to = u.renamed[name];
    if (to === undefined) continue;
    first ??= u;
    name = to;
  }
  return first === null ? null : `renamed to '${name}' (config version ${first.from + 1}): ${first.why}`;
}
