import pino, { type Logger } from "pino";
import { redact, redactDeep } from "../lib/redact.ts";

export type { Logger };

/**
 * Structured logs, object first: log.info({ runId, step }, "train step committed"). Logs go to stderr.
 * Every line passes through lib/redact: registered secrets and URL passwords never reach a log.
 */
export function createLogger(level: string, name = "rlq"): Logger {
  return pino(
    {
      name,
      level,
      base: { pid: process.pid },
      formatters: { log: (obj) => redactDeep(obj) },
      hooks: {
        logMethod(args, method) {
          method.apply(this, args.map((a) => (typeof a === "string" ? redact(a) : a)) as Parameters<typeof method>);
        },
      },
    },
    pino.destination(2),
  );
}
