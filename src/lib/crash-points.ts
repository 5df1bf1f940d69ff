/**
 * Test-only fault injection. RLQ_CRASH_AT="name[:probability],..." makes the
 * process SIGKILL itself when it reaches a named point, so tests can crash
 * between two effects that must both happen (e.g. checkpoint written, step
 * not committed). Unset in production: a no-op.
 */
export function createCrashPoints(spec: string | undefined): (name: string) => void {
  if (!spec) return () => undefined;
  const points = new Map<string, number>();
  for (const part of spec.split(",")) {
    const [name, p] = part.split(":");
    if (name) points.set(name, p === undefined ? 1 : Number(p));
  }
  return (name) => {
    const p = points.get(name);
    if (p !== undefined && Math.random() < p) process.kill(process.pid, "SIGKILL");
  };
}
