/**
 * Secrets out of every line rlq prints. Values read through config/secrets.ts are registered here;
 * `redact` replaces them (and the password of any URL) before a message is logged or printed.
 * Registration is process-wide on purpose: a secret read by one module must be hidden from the
 * logs of every other one.
 */
const secrets = new Set<string>();

/** Remember a secret value so that `redact` hides it. Values shorter than 4 characters are ignored (they would mangle text). */
export function registerSecret(value: string): void {
  if (value.length >= 4) secrets.add(value);
}

/** `postgres://user:pw@host/db` → `postgres://user:***@host/db`; also `?password=` and `token=` query parameters. */
export function redactUrl(text: string): string {
  return text
    .replace(/([a-z][a-z0-9+.-]*:\/\/[^\s:/@]*:)[^\s@/]*@/gi, "$1***@")
    .replace(/([?&](?:password|passwd|token|api_key|apikey|access_token)=)[^&\s]*/gi, "$1***");
}

/** Hide registered secrets and URL passwords in a string. */
export function redact(text: string): string {
  let out = redactUrl(text);
  for (const s of secrets) if (out.includes(s)) out = out.split(s).join("***");
  return out;
}

/** Deep copy of a JSON-like value with every string redacted (for status output and log objects). */
export function redactDeep<T>(value: T): T {
  if (typeof value === "string") return redact(value) as T;
  if (Array.isArray(value)) return value.map((v) => redactDeep(v)) as T;
  if (value instanceof Error) {
    const e = value as Error & { code?: unknown };
    return { type: e.name, message: redact(e.message), stack: e.stack === undefined ? undefined : redact(e.stack), code: e.code } as T;
  }
  if (value !== null && typeof value === "object" && !(value instanceof Date)) {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value))
      out[k] = /^(authorization|password|api_key|apikey|token|secret)$/i.test(k) && typeof v === "string" ? "***" : redactDeep(v);
    return out as T;
  }
  return value;
}
