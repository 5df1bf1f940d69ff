import { streamReadOnlyQuery } from "../store/read-only.ts";

function cell(v: unknown): string {
  if (v === null || v === undefined) return "";
  if (v instanceof Date) return v.toISOString();
  if (typeof v === "object") {
    const s = JSON.stringify(v);
    return s.length > 60 ? s.slice(0, 57) + "..." : s;
  }
  return typeof v === "string" ? v : JSON.stringify(v);
}

/**
 * `rlq sql`: one read-only statement as rlq_reader (store/read-only.ts), its rows streamed as they
 * arrive: a table on a terminal (column widths from the first batch), or with --json a JSON array.
 * `--limit N` stops after N rows (default 1000) and says so on stderr.
 */
export async function runSql(readerUrl: string, query: string, options: { asJson: boolean; limit: number; timeoutMs?: number }): Promise<number> {
  let fields: string[] = [];
  let widths: number[] | null = null;
  let first = true;
  const out = (s: string) => process.stdout.write(s);
  try {
    if (options.asJson) out("[");
    const res = await streamReadOnlyQuery(readerUrl, query, {
      maxRows: options.limit,
      ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
      onFields: (f) => (fields = f),
      onRows: (rows) => {
        if (options.asJson) {
          for (const r of rows) {
            out((first ? "\n" : ",\n") + JSON.stringify(r));
            first = false;
          }
          return;
        }
        const cells = rows.map((r) => fields.map((f) => cell(r[f])));
        if (widths === null) {
          widths = fields.map((f, i) => Math.max(f.length, ...cells.map((row) => (row[i] ?? "").length)));
          out(fields.map((f, i) => f.padEnd(widths?.[i] ?? 0)).join(" | ") + "\n");
          out(widths.map((w) => "-".repeat(w)).join("-+-") + "\n");
        }
        for (const row of cells) out(row.map((c, i) => c.padEnd(widths?.[i] ?? 0)).join(" | ") + "\n");
      },
    });
    if (options.asJson) out(first ? "]\n" : "\n]\n");
    else {
      if (widths === null && fields.length > 0) out(fields.join(" | ") + "\n" + fields.map((f) => "-".repeat(f.length)).join("-+-") + "\n");
      out(`(${res.rowCount} row${res.rowCount === 1 ? "" : "s"})\n`);
    }
    if (res.isTruncated) process.stderr.write(`rlq sql: stopped at --limit ${options.limit}; more rows exist (raise --limit, or narrow the query)\n`);
    return 0;
  } catch (e) {
    if (options.asJson && first) out("]\n");
    process.stderr.write(`${(e as Error).message.startsWith("rlq sql") ? "" : "rlq sql: "}${(e as Error).message}\n`);
    return 1;
  }
}
