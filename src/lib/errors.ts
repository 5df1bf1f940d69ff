/**
 * Errors carry a stable `code` and a `cause`. Whether an error is retried is
 * decided once, at the processor edge, from `isRetriable`.
 */
export class RlqError extends Error {
  readonly code: string;
  readonly isRetriable: boolean;
  constructor(code: string, message: string, options: { cause?: unknown; isRetriable?: boolean } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "RlqError";
    this.code = code;
    this.isRetriable = options.isRetriable ?? false;
  }
}

export function isRetriable(error: unknown): boolean {
  if (error instanceof RlqError) return error.isRetriable;
  // Unknown errors (network resets, Postgres serialization failures, 5xx) are retried.
  return true;
}

export function errorMessage(error: unknown): string {
  if (error instanceof Error) return error.message;
  return String(error);
}
