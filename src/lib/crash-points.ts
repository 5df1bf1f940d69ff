/**
 * Test-only fault injection. RLQ_CRASH_AT="name[:probability | :once=FILE],..."
 * makes the process SIGKILL itself when it reaches a named point, so tests
 * can crash between two effects that must both happen (e.g. checkpoint
 * written, step not committed). `once=FILE` fires only if FILE does not exist
 * yet (and creates it), so a restarted process gets past the point.
 * Unset in production: a no-op.
 */

import { existsSync, writeFileSync } from "node:fs";

export function createCrashPoints(spec: string | undefined): (name: string) => void {
  if (!spec) return () => undefined;
  const points = new Map<string, string | undefined>();
  for (const part of spec.split(",")) {
    const i = part.indexOf(":");
    const name = i < 0 ? part : part.slice(0, i);
    if (name) points.set(name, i < 0 ? undefined : part.slice(i + 1));
  }
  return (name) => {
    if (!points.has(name)) return;
    const arg = points.get(name);
    if (arg?.startsWith("once=")) {
      const file = arg.slice(5);
      if (existsSync(file)) return;
      writeFileSync(file, `${process.pid}\n`);
    } else if (arg !== undefined && Math.random() >= Number(arg)) {
      return;
    }
    process.kill(process.pid, "SIGKILL");
  };
}
