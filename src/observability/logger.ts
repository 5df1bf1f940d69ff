import pino, { type Logger } from "pino";

export type { Logger };

/** Structured logs, object first: log.info({ runId, step }, "train step committed"). Logs go to stderr. */
export function createLogger(level: string, name = "rlq"): Logger {
  return pino({ name, level, base: { pid: process.pid } }, pino.destination(2));
}
