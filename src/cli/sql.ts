import type { Db } from "../store/db.ts";
import { readOnlyQuery } from "../store/read-only.ts";

function cell(v: unknown): string {
  if (v === null || v === undefined) return "";
  if (v instanceof Date) return v.toISOString();
  if (typeof v === "object") {
    const s = JSON.stringify(v);
    return s.length > 60 ? s.slice(0, 57) + "..." : s;
  }
  return typeof v === "string" ? v : JSON.stringify(v);
}

/** `rlq sql`: a table on a terminal, or with --json a JSON array of row objects on stdout. */
export async function runSql(db: Db, query: string, asJson: boolean): Promise<number> {
  try {
    const { fields, rows } = await readOnlyQuery(db, query);
    if (asJson) {
      process.stdout.write(JSON.stringify(rows) + "\n");
      return 0;
    }
    const table = [fields, ...rows.map((r) => fields.map((f) => cell(r[f])))];
    const widths = fields.map((_, i) => Math.max(...table.map((row) => (row[i] ?? "").length)));
    for (const [ri, row] of table.entries()) {
      process.stdout.write(row.map((c, i) => c.padEnd(widths[i] ?? 0)).join(" | ") + "\n");
      if (ri === 0) process.stdout.write(widths.map((w) => "-".repeat(w)).join("-+-") + "\n");
    }
    process.stdout.write(`(${rows.length} row${rows.length === 1 ? "" : "s"})\n`);
    return 0;
  } catch (e) {
    process.stderr.write(`rlq sql: ${(e as Error).message}\n`);
    return 1;
  }
}
