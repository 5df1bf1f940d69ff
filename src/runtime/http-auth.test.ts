import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runConfigSchema } from "../config/run-config.ts";
import { createRemoteReward } from "../reward/remote.ts";
import { callHttpPlugin } from "../plugins/http.ts";
import { pluginHttpOptions, rmHttpOptions } from "./http-auth.ts";

/** rm_api_key and plugin_api_key: the token from env reaches the server as a bearer header; the config keeps the reference. */
describe("bearer tokens for reward and plugin servers", () => {
  let server: Server;
  let url: string;
  const seen: (string | undefined)[] = [];
  beforeAll(async () => {
    server = createServer((q, res) => {
      seen.push(q.headers.authorization);
      if (q.headers.authorization !== "Bearer rm-secret" && q.headers.authorization !== "Bearer plugin-secret") {
        res.writeHead(401).end("no");
        return;
      }
      res.writeHead(200, { "content-type": "application/json" }).end(q.headers.authorization === "Bearer rm-secret" ? "1" : '{"result": 0.5}');
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => server.close());

  const config = (extra: Record<string, unknown>) =>
    runConfigSchema.parse({
      prompt_data: "x.jsonl",
      rollout_batch_size: 1,
      rollout_max_response_len: 4,
      num_rollout: 1,
      ref_load: "ckpt",
      rm_type: "math",
      ...extra,
    });

  it("sends rm_api_key to rm_url and plugin_api_key to http plugins", async () => {
    process.env.RLQ_T16_RM = "rm-secret";
    process.env.RLQ_T16_PLUGIN = "plugin-secret";
    const c = config({ rm_type: "remote_rm", rm_url: url, rm_api_key: { env: "RLQ_T16_RM" }, plugin_api_key: { env: "RLQ_T16_PLUGIN" } });
    expect(JSON.stringify(c)).not.toContain("secret");
    const rm = createRemoteReward({ url, ...rmHttpOptions(c), maxAttempts: 1 });
    expect(await rm.scoreSample({ prompt: "p", response: "r", label: null })).toBe(1);
    expect(await callHttpPlugin(url, "reward", { args: {}, sample: {} }, pluginHttpOptions(c))).toBe(0.5);
    expect(seen).toEqual(["Bearer rm-secret", "Bearer plugin-secret"]);
  });

  it("no reference, no header; an unset variable names itself", () => {
    expect(pluginHttpOptions(config({}))).toEqual({});
    expect(() => rmHttpOptions(config({ rm_api_key: { env: "RLQ_T16_UNSET_VAR" } }))).toThrow(/rm_api_key: environment variable RLQ_T16_UNSET_VAR is not set/);
  });
});
