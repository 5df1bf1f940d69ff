import { RlqError } from "../lib/errors.ts";

/** Stable codes of filter errors; none is retriable (the same input gives the same mistake). */
export type FilterErrorCode = "empty_group" | "plugin_filter_invalid" | "buffer_filter_invalid" | "unknown_filter";

export class FilterError extends RlqError {
  override readonly code: FilterErrorCode;
  constructor(code: FilterErrorCode, message: string, options: { cause?: unknown } = {}) {
    super(code, message, { ...options, isRetriable: false });
    this.name = "FilterError";
    this.code = code;
  }
}

/** Where a plugin value came from, for error messages: `dynamic_sampling_filter_path ./f.js`. */
export interface FilterPluginSite {
  option: string;
  path: string;
}

/** A short rendering of a returned value for a message. */
export function showValue(value: unknown): string {
  if (typeof value === "string") return `'${value.length > 80 ? `${value.slice(0, 80)}…` : value}'`;
  if (value === undefined || typeof value === "number" || typeof value === "boolean" || value === null) return String(value);
  if (typeof value === "function") return "a function";
  try {
    const json = JSON.stringify(value) ?? typeof value;
    return json.length > 120 ? `${json.slice(0, 120)}…` : json;
  } catch {
    // Not JSON (a cycle, a BigInt): the value's type names it in the message instead.
    return Object.prototype.toString.call(value);
  }
}
