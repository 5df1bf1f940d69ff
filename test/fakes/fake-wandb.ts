import { createServer, type IncomingMessage, type ServerResponse } from "node:http";

/**
 * A local stand-in for the W&B server, as far as a run's metrics go: the two
 * calls W&B's JS SDK makes (wandb/wandb-js, @wandb/sdk 0.5.1):
 * - POST /graphql with the `UpsertBucket` mutation (dist/internal/api.js): creates the
 *   run (bucket) named `name` in `modelName`/`entityName` or resumes it, and answers
 *   `{data: {upsertBucket: {bucket: {id, name, displayName, project: {id, name, entity: {id, name}}}, inserted}}}`;
 * - POST /files/{entity}/{project}/{run}/file_stream (dist/internal/filestream.js,
 *   `sendRecords` / `sendFinish`): `{files: {"wandb-history.jsonl": {offset, content}, ...}}`
 *   puts `content` at line `offset` (a repeated chunk replaces the same lines: the SDKs
 *   retry a chunk with its offset), `wandb-summary.json` is replaced, `{complete, exitcode}`
 *   marks the run finished.
 * Both need `Authorization: Basic base64("api:" + key)` (401 otherwise, as the real API).
 * A history chunk that would leave a gap is refused (400): a client bug, not a W&B behaviour
 * to rely on. `failAfterApply` makes the next file_stream take the lines and then answer 500,
 * which is what a client sees when it dies between the server's write and its own bookkeeping.
 */
export interface FakeWandbRun {
  entity: string;
  project: string;
  name: string;
  displayName: string | null;
  group: string | null;
  config: Record<string, unknown>;
  history: string[];
  summary: string | null;
  finished: boolean;
  exitcode: number | null;
}

export interface FakeWandb {
  url: string;
  runs: Map<string, FakeWandbRun>;
  requests: Array<{ path: string; body: unknown }>;
  failAfterApply: number;
  close(): Promise<void>;
}

const readBody = (req: IncomingMessage) =>
  new Promise<string>((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    req.on("error", reject);
  });

export async function startFakeWandb(apiKey: string, defaultEntity = "rlq-tests"): Promise<FakeWandb> {
  const runs = new Map<string, FakeWandbRun>();
  const requests: FakeWandb["requests"] = [];
  const expected = `Basic ${Buffer.from(`api:${apiKey}`).toString("base64")}`;
  const state: FakeWandb = { url: "", runs, requests, failAfterApply: 0, close: async () => undefined };
  const send = (res: ServerResponse, status: number, body: unknown) => res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body));

  const server = createServer((req, res) => {
    void (async () => {
      const text = await readBody(req);
      const body = text.length > 0 ? (JSON.parse(text) as Record<string, unknown>) : {};
      requests.push({ path: req.url ?? "", body });
      if (req.headers.authorization !== expected) return send(res, 401, { errors: [{ message: "user is not logged in" }] });
      if (req.method === "POST" && req.url === "/graphql") {
        const query = typeof body.query === "string" ? body.query : "";
        const v = (body.variables ?? {}) as Record<string, string | null | undefined>;
        if (!/mutation UpsertBucket/.test(query) || !/upsertBucket\(/.test(query)) return send(res, 400, { errors: [{ message: "unsupported query" }] });
        const entity = v.entity ?? defaultEntity;
        const project = v.project ?? "uncategorized";
        const name = v.name ?? Math.random().toString(36).slice(2, 10);
        const key = `${entity}/${project}/${name}`;
        const existing = runs.get(key);
        const config = v.config ? (JSON.parse(v.config) as Record<string, unknown>) : {};
        const run: FakeWandbRun = existing ?? {
          entity,
          project,
          name,
          displayName: null,
          group: null,
          config: {},
          history: [],
          summary: null,
          finished: false,
          exitcode: null,
        };
        run.displayName = v.displayName ?? run.displayName;
        run.group = v.groupName ?? run.group;
        run.config = { ...run.config, ...config };
        runs.set(key, run);
        return send(res, 200, {
          data: {
            upsertBucket: {
              bucket: {
                id: Buffer.from(key).toString("base64"),
                name,
                displayName: run.displayName,
                project: { id: project, name: project, entity: { id: entity, name: entity } },
              },
              inserted: !existing,
            },
          },
        });
      }
      const m = /^\/files\/([^/]+)\/([^/]+)\/([^/]+)\/file_stream$/.exec(req.url ?? "");
      if (req.method === "POST" && m) {
        const run = runs.get(`${m[1]}/${m[2]}/${m[3]}`);
        if (!run) return send(res, 404, { error: `run ${m[1]}/${m[2]}/${m[3]} not found` });
        if (body.complete === true) {
          run.finished = true;
          run.exitcode = Number(body.exitcode ?? 0);
          return send(res, 200, { exitcode: null, limits: {} });
        }
        const files = (body.files ?? {}) as Record<string, { offset: number; content: string[] }>;
        const hist = files["wandb-history.jsonl"];
        if (hist) {
          if (hist.offset > run.history.length) return send(res, 400, { error: `history offset ${hist.offset} leaves a gap after line ${run.history.length}` });
          hist.content.forEach((line, i) => {
            JSON.parse(line);
            run.history[hist.offset + i] = line;
          });
        }
        const summary = files["wandb-summary.json"];
        if (summary) run.summary = summary.content[summary.content.length - 1] ?? run.summary;
        if (state.failAfterApply > 0) {
          state.failAfterApply--;
          return send(res, 500, { error: "injected: applied, then failed" });
        }
        return send(res, 200, { exitcode: null, limits: {} });
      }
      return send(res, 404, { error: `no route ${req.method} ${req.url}` });
    })().catch((e: unknown) => send(res, 500, { error: String(e) }));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  const address = server.address();
  state.url = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}`;
  state.close = () => new Promise<void>((r) => server.close(() => r()));
  return state;
}
