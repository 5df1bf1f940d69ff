import { secretSource } from "../config/env.ts";
import { readOptionalSecret, type SecretRef } from "../config/secrets.ts";
import type { RunConfig } from "../config/run-config.ts";
import { RlqError } from "../lib/errors.ts";

/** `{authorization: "Bearer ..."}` from a secret reference of the run config, or no header. */
function bearer(ref: SecretRef | null, where: string): { headers?: Record<string, string> } {
  let token: string | undefined;
  try {
    token = readOptionalSecret(ref ?? undefined, where, secretSource());
  } catch (e) {
    throw new RlqError("secret_unavailable", (e as Error).message, { cause: e, isRetriable: false });
  }
  return token ? { headers: { authorization: `Bearer ${token}` } } : {};
}

/** Options for http:// plugin calls (custom_rm_path, filters, custom_generate_function_path). */
export function pluginHttpOptions(config: RunConfig): { headers?: Record<string, string> } {
  return bearer(config.plugin_api_key, "plugin_api_key");
}

/** Options for rm_url (remote_rm). */
export function rmHttpOptions(config: RunConfig): { headers?: Record<string, string> } {
  return bearer(config.rm_api_key, "rm_api_key");
}
