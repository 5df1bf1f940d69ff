/**
 * The dashboard's token (RLQ_DASHBOARD_TOKEN, or RLQ_DASHBOARD_TOKEN_FILE naming a file that holds
 * it): the run pause/resume routes (dashboard/server.ts) and Bull Board's writable mount
 * (dashboard/bull-board.ts) need it as `Authorization: Bearer <token>`, and, bound beyond
 * loopback, every request does (dashboard/access.ts). Compared in constant time.
 */

import { timingSafeEqual } from "node:crypto";
import type { Env } from "../config/env.ts";
import { ConfigError } from "../config/run-config.ts";
import { readSecret } from "../config/secrets.ts";
import { registerSecret } from "../lib/redact.ts";

export function tokenMatches(expected: string, header: string | undefined): boolean {
  const m = /^Bearer (.+)$/.exec(header ?? "");
  return m !== null && secretEquals(expected, m[1] as string);
}

/** `given === expected` in time that does not depend on where they differ. */
export function secretEquals(expected: string, given: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

/**
 * The token from the environment or from the file RLQ_DASHBOARD_TOKEN_FILE names (trailing newline
 * trimmed, registered with lib/redact so no log line prints it); undefined when neither is set.
 */
export function readDashboardToken(env: Env): string | undefined {
  if (env.RLQ_DASHBOARD_TOKEN !== undefined && env.RLQ_DASHBOARD_TOKEN_FILE !== undefined)
    throw new ConfigError("RLQ_DASHBOARD_TOKEN and RLQ_DASHBOARD_TOKEN_FILE are both set: set one of them");
  if (env.RLQ_DASHBOARD_TOKEN !== undefined) {
    registerSecret(env.RLQ_DASHBOARD_TOKEN);
    return env.RLQ_DASHBOARD_TOKEN;
  }
  if (env.RLQ_DASHBOARD_TOKEN_FILE === undefined) return undefined;
  // A file reference reads no environment variable: the source is empty.
  const token = readSecret({ file: env.RLQ_DASHBOARD_TOKEN_FILE }, "RLQ_DASHBOARD_TOKEN_FILE", {});
  if (token.length < 16) throw new ConfigError(`RLQ_DASHBOARD_TOKEN_FILE ${env.RLQ_DASHBOARD_TOKEN_FILE}: the token in it is shorter than 16 characters`);
  return token;
}
