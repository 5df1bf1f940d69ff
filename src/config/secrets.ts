/**
 * A secret (API key, bearer token, password) is named in a run config or a flag, never written
 * there: `{ env: "SGLANG_API_KEY" }` reads an environment variable of the process that needs it,
 * `{ file: "/run/secrets/sglang" }` reads a file (trailing newline trimmed). The value is never
 * stored in the runs table (only the reference is) and is registered with lib/redact so that no log
 * line or status output prints it.
 */

import { readFileSync } from "node:fs";
import { z } from "zod";
import { registerSecret } from "../lib/redact.ts";
import { RlqError } from "../lib/errors.ts";

export const secretRefSchema = z.union([
  z.object({ env: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "an environment variable name") }).strict(),
  z.object({ file: z.string().min(1) }).strict(),
]);
export type SecretRef = z.infer<typeof secretRefSchema>;

/** A secret that could not be read: names the reference and what to do, never a value. */
export class SecretError extends RlqError {
  constructor(message: string, options: { cause?: unknown } = {}) {
    super("secret_unavailable", message, options);
    this.name = "SecretError";
  }
}

/** Resolve a reference. `source` is the process environment as config/env.ts hands it out. */
export function readSecret(ref: SecretRef, where: string, source: Readonly<Record<string, string | undefined>>): string {
  let value: string | undefined;
  if ("env" in ref) {
    value = source[ref.env];
    if (value === undefined || value === "")
      throw new SecretError(`${where}: environment variable ${ref.env} is not set (export it in the environment of the rlq process that needs it)`);
  } else {
    try {
      value = readFileSync(ref.file, "utf8").replace(/\r?\n$/, "");
    } catch (e) {
      throw new SecretError(`${where}: cannot read secret file ${ref.file}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`, { cause: e });
    }
    if (value === "") throw new SecretError(`${where}: secret file ${ref.file} is empty`);
  }
  registerSecret(value);
  return value;
}

/** Resolve an optional reference; undefined when none is configured. */
export function readOptionalSecret(ref: SecretRef | undefined, where: string, source: Readonly<Record<string, string | undefined>>): string | undefined {
  return ref === undefined ? undefined : readSecret(ref, where, source);
}
