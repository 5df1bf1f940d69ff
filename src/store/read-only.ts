/**
 * Read-only SQL for people (`rlq sql`) and the dashboard. Four walls, any one of which holds alone:
 * 1. the statement must start with SELECT, WITH, VALUES, TABLE, EXPLAIN or SHOW;
 * 2. it runs through the extended query protocol (a cursor), which carries exactly one statement,
 *    so `commit; drop table ...` cannot leave the transaction;
 * 3. in a READ ONLY transaction with a statement timeout;
 * 4. logged in as rlq_reader, which may only SELECT the documented tables and views (migration
 *    0006); a URL that logs in as a user who may write facts is refused before anything runs.
 */

import pg from "pg";
import Cursor from "pg-cursor";
import { RlqError } from "../lib/errors.ts";
import { redactUrl } from "../lib/redact.ts";

export const readOnlyStarts = ["select", "with", "values", "table", "explain", "show"] as const;

/** A statement `rlq sql` will not run; the message says why and what to write instead. */
export class SqlRefusedError extends RlqError {
  constructor(message: string, cause?: unknown) {
    super("sql_refused", message, { cause });
  }
}

/** The first keyword of a statement, past whitespace, comments and opening parentheses. */
export function firstKeyword(text: string): string | null {
  let i = 0;
  while (i < text.length) {
    const c = text[i] ?? "";
    if (/\s/.test(c) || c === "(") {
      i++;
    } else if (text.startsWith("--", i)) {
      const j = text.indexOf("\n", i);
      i = j < 0 ? text.length : j + 1;
    } else if (text.startsWith("/*", i)) {
      let depth = 1;
      i += 2;
      while (i < text.length && depth > 0) {
        if (text.startsWith("/*", i)) {
          depth++;
          i += 2;
        } else if (text.startsWith("*/", i)) {
          depth--;
          i += 2;
        } else i++;
      }
    } else break;
  }
  const m = /^[A-Za-z_]+/.exec(text.slice(i));
  return m ? m[0].toLowerCase() : null;
}

/** Refuse what is not a read-only query, with a message that names it. */
export function screenStatement(text: string): void {
  const kw = firstKeyword(text);
  if (kw === null) throw new SqlRefusedError('rlq sql: the query is empty; write one statement, e.g. rlq sql "SELECT * FROM runs"');
  if (!(readOnlyStarts as readonly string[]).includes(kw)) {
    throw new SqlRefusedError(
      `rlq sql runs read-only queries only: a statement starting with ${readOnlyStarts.map((s) => s.toUpperCase()).join(", ")}; got ${kw.toUpperCase()}. ` +
        "Changes to a run go through rlq run pause|resume|cancel|amend; schema changes through rlq migrate.",
    );
  }
}

export interface ReadOnlyQueryOptions {
  /** Server-side statement timeout; the connection is also dropped 5 s after it. Default 30 s. */
  timeoutMs?: number;
  /** Stop after this many rows (the result says it was truncated). Default 1000. */
  maxRows?: number;
  /** Rows fetched per round trip. */
  batchRows?: number;
  applicationName?: string;
  /** Called once with the column names, then with each batch of rows as it arrives. */
  onFields?: (fields: string[]) => void;
  onRows?: (rows: Record<string, unknown>[]) => void;
}

/** Map what Postgres said to a message for a person; the statement's own errors pass through. */
function explain(e: unknown): Error {
  const err = e as Error & { code?: string };
  if (err.code === "42601" && /multiple commands/.test(err.message)) {
    return new SqlRefusedError("rlq sql runs one statement per call; this text holds several. Run each statement in its own rlq sql call.", e);
  }
  if (err.code === "25006") return new SqlRefusedError(`rlq sql is read-only: ${err.message}`, e);
  if (err.code === "42501")
    return new SqlRefusedError(`rlq sql runs as rlq_reader, which may only read the tables and views of docs/sql.md: ${err.message}`, e);
  if (err.code === "28P01" || err.code === "28000") {
    return new SqlRefusedError(
      `rlq sql logs in as rlq_reader and the server refused it (${err.message}): set RLQ_READER_DATABASE_URL with rlq_reader's password, or add a ~/.pgpass line for rlq_reader (docs/security.md)`,
      e,
    );
  }
  if (err.code === "57014")
    return new SqlRefusedError(`rlq sql: the statement ran past its timeout and was cancelled (${err.message}); narrow it with WHERE run_id = ... or LIMIT`, e);
  return err;
}

/**
 * Run one read-only statement as the reader at `url`, streaming its rows; resolves with the count
 * and whether `maxRows` cut it short. Nothing is written, whatever the text says.
 */
export async function streamReadOnlyQuery(url: string, text: string, options: ReadOnlyQueryOptions = {}): Promise<{ rowCount: number; isTruncated: boolean }> {
  screenStatement(text);
  const timeoutMs = Math.max(1, Math.floor(options.timeoutMs ?? 30_000));
  const maxRows = options.maxRows ?? 1000;
  const batchRows = Math.max(1, Math.min(options.batchRows ?? 500, maxRows + 1));
  const client = new pg.Client({ connectionString: url, application_name: options.applicationName ?? "rlq-sql", statement_timeout: timeoutMs });
  // A connection lost between two queries fails the next query, which is thrown: the event adds nothing.
  client.on("error", () => undefined);
  // The server cancels at the timeout; this only drops a connection that stopped answering.
  let timer: NodeJS.Timeout | undefined;
  const watchdog = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      reject(
        new SqlRefusedError(
          `rlq sql: no answer from ${redactUrl(url)} ${Math.round(timeoutMs / 1000) + 5} s after the statement started; the connection was dropped`,
        ),
      );
      // The rejection above reports it; an end that fails finds the connection already gone.
      void client.end().catch(() => undefined);
    }, timeoutMs + 5_000);
    timer.unref();
  });
  const work = (async () => {
    await client.connect();
    const who = await client.query<{ user: string; isSuper: boolean; canWrite: boolean }>(
      `SELECT current_user AS user, r.rolsuper AS "isSuper",
              coalesce(to_regclass('public.decisions') IS NOT NULL AND has_table_privilege('public.decisions', 'INSERT'), false) AS "canWrite"
       FROM pg_roles r WHERE r.rolname = current_user`,
    );
    const me = who.rows[0];
    if (!me || me.isSuper || me.canWrite) {
      throw new SqlRefusedError(
        `rlq sql connects as rlq_reader, but ${redactUrl(url)} logs in as ${me?.user ?? "?"}, who ${me?.isSuper ? "is a superuser" : "may write facts"}. ` +
          "Set RLQ_READER_DATABASE_URL to the rlq_reader role's URL (docs/security.md), or unset it to use DATABASE_URL's server as rlq_reader.",
      );
    }
    await client.query("BEGIN READ ONLY");
    await client.query(`SET LOCAL statement_timeout = ${timeoutMs}`);
    const cursor = client.query(new Cursor(text));
    let rowCount = 0;
    let isTruncated = false;
    let sentFields = false;
    try {
      for (;;) {
        const { rows, fields } = await new Promise<{ rows: Record<string, unknown>[]; fields: string[] }>((resolve, reject) =>
          cursor.read(batchRows, (err, got, result) =>
            err ? reject(err) : resolve({ rows: got as Record<string, unknown>[], fields: (result?.fields ?? []).map((f) => f.name) }),
          ),
        );
        if (!sentFields) {
          sentFields = true;
          options.onFields?.(fields);
        }
        if (rows.length === 0) break;
        const room = maxRows - rowCount;
        if (rows.length > room) {
          isTruncated = true;
          if (room > 0) options.onRows?.(rows.slice(0, room));
          rowCount += Math.max(0, room);
          break;
        }
        options.onRows?.(rows);
        rowCount += rows.length;
      }
    } finally {
      // A read-only transaction: a cursor that cannot close leaves nothing, and the ROLLBACK below reports the connection's state.
      await cursor.close().catch(() => undefined);
    }
    await client.query("ROLLBACK");
    return { rowCount, isTruncated };
  })();
  try {
    return await Promise.race([work, watchdog]);
  } catch (e) {
    throw explain(e);
  } finally {
    clearTimeout(timer);
    // Nothing was written and the answer is decided: an end that fails finds the connection already gone.
    await client.end().catch(() => undefined);
  }
}

/** The same, collected: for the dashboard and the demo. */
export async function readOnlyQuery(
  url: string,
  text: string,
  options: ReadOnlyQueryOptions = {},
): Promise<{ fields: string[]; rows: Record<string, unknown>[]; isTruncated: boolean }> {
  let fields: string[] = [];
  const rows: Record<string, unknown>[] = [];
  const res = await streamReadOnlyQuery(url, text, { ...options, onFields: (f) => (fields = f), onRows: (r) => rows.push(...r) });
  return { fields, rows, isTruncated: res.isTruncated };
}
