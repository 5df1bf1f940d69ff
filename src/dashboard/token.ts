import { timingSafeEqual } from "node:crypto";

/**
 * The dashboard's token check (RLQ_DASHBOARD_TOKEN), shared by the run pause/resume routes
 * (dashboard/server.ts) and Bull Board's writable mount (dashboard/bull-board.ts): a request
 * carries it as `Authorization: Bearer <token>`, compared in constant time.
 */
export function tokenMatches(expected: string, header: string | undefined): boolean {
  const m = /^Bearer (.+)$/.exec(header ?? "");
  if (!m) return false;
  const a = Buffer.from(m[1] as string);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}
