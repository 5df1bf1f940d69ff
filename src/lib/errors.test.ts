import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { ERROR_CODES, errorCodeRow, isRetriable, RlqError } from "./errors.ts";
import { backoffDelayMs, isRetriableStatus } from "./http-client.ts";

describe("the error-code table", () => {
  it("gives an RlqError its row's retriability unless the throw site decides", () => {
    expect(new RlqError("engine_unreachable", "x").isRetriable).toBe(true);
    expect(new RlqError("config_invalid", "x").isRetriable).toBe(false);
    expect(new RlqError("engine_http_error", "x").isRetriable).toBe(false); // "varies": the site decides
    expect(new RlqError("engine_http_error", "x", { isRetriable: true }).isRetriable).toBe(true);
    expect(new RlqError("trainer_out_of_memory", "x", { isRetriable: true }).isRetriable).toBe(true);
  });

  it("retries what is not an RlqError (a reset, a Postgres restart)", () => {
    expect(isRetriable(new Error("Connection terminated unexpectedly"))).toBe(true);
    expect(isRetriable(new RlqError("plugin_threw", "x"))).toBe(false);
  });

  it("has a meaning for every code; trainer protocol codes vary", () => {
    for (const [code, row] of Object.entries(ERROR_CODES)) expect(row.meaning.length, code).toBeGreaterThan(10);
    expect(errorCodeRow("trainer_whatever")?.retriable).toBe("varies");
    expect(errorCodeRow("no_such_code")).toBeNull();
  });

  it("docs/errors.md has a row for every code, with the table's retriability", () => {
    const doc = readFileSync(new URL("../../docs/errors.md", import.meta.url), "utf8");
    for (const [code, row] of Object.entries(ERROR_CODES)) {
      const line = doc.split("\n").find((l) => l.startsWith(`| \`${code}\` |`));
      expect(line, `docs/errors.md lacks ${code}`).toBeDefined();
      const said = (line as string).split("|")[2]?.trim();
      expect(said, code).toBe(row.retriable === true ? "yes" : row.retriable === false ? "no" : "varies");
    }
  });

  it("classifies HTTP statuses once: 5xx, 408 and 429 are worth asking again, other 4xx not", () => {
    expect([500, 502, 503, 504, 408, 429].every(isRetriableStatus)).toBe(true);
    expect([400, 401, 403, 404, 413, 422].some(isRetriableStatus)).toBe(false);
    expect([0, 1, 2, 5, 9].map((a) => backoffDelayMs(a, { firstMs: 250, maxMs: 5000 }))).toEqual([250, 500, 1000, 5000, 5000]);
  });
});
