import type { Writable } from "node:stream";
import type { Db } from "../store/db.ts";
import { historyPages } from "../store/export.ts";

/** `rlq export ID --format jsonl`: one JSON object per sample. */
export async function exportRun(db: Db, runId: string, out: Writable): Promise<number> {
  let n = 0;
  for await (const page of historyPages(db, runId)) {
    for (const row of page) {
      if (!out.write(JSON.stringify(row) + "\n")) await new Promise((r) => out.once("drain", r));
      n++;
    }
  }
  process.stderr.write(`exported ${n} samples of run ${runId}\n`);
  return 0;
}
