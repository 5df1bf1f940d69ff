import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { ERROR_CODES, errorCodeRow, isBug, isRetriable, RlqError, TRAINER_PROTOCOL_CODES, trainerErrorCode } from "./errors.ts";
import { backoffDelayMs, isRetriableStatus } from "./http-client.ts";

describe("the error-code table", () => {
  it("gives an RlqError its row's retriability unless the throw site decides", () => {
    expect(new RlqError("engine_unreachable", "x").isRetriable).toBe(true);
    expect(new RlqError("config_invalid", "x").isRetriable).toBe(false);
    expect(new RlqError("engine_http_error", "x").isRetriable).toBe(false); // "varies": the site decides
    expect(new RlqError("engine_http_error", "x", { isRetriable: true }).isRetriable).toBe(true);
    expect(new RlqError("trainer_oom", "x", { isRetriable: true }).isRetriable).toBe(true);
  });

  it("refuses, at compile time, a code that is not in the table", () => {
    // @ts-expect-error a code built from a string is not an ErrorCode: the table is the closed set
    const e = new RlqError(`trainer_${"whatever"}`, "x");
    expect(errorCodeRow(e.code)).toBeNull();
  });

  it("retries an error that is not an RlqError only for a named reason: a Postgres transaction that lost a race", () => {
    const serialization = Object.assign(new Error("could not serialize access due to concurrent update"), { code: "40001" });
    expect(isRetriable(new Error("Failed query: update ...", { cause: serialization }))).toBe(true);
    expect(isRetriable(Object.assign(new Error("deadlock detected"), { code: "40P01" }))).toBe(true);
    expect(isRetriable(new RlqError("plugin_threw", "x"))).toBe(false);
    // A bug: the same input fails the same way.
    expect(isRetriable(new TypeError("Cannot read properties of undefined (reading 'step')"))).toBe(false);
    expect(isBug(new TypeError("x"))).toBe(true);
    expect(isRetriable(new Error("unique constraint", { cause: Object.assign(new Error("dup"), { code: "23505" }) }))).toBe(false);
    expect(isBug(new RlqError("plugin_threw", "x"))).toBe(false);
    expect(isBug(serialization)).toBe(false);
  });

  it("has a meaning for every code, each in lower snake_case", () => {
    for (const [code, row] of Object.entries(ERROR_CODES)) expect(row.meaning.length, code).toBeGreaterThan(10);
    for (const code of Object.keys(ERROR_CODES)) expect(code).toMatch(/^[a-z][a-z0-9]*(_[a-z0-9]+)*$/);
    expect(errorCodeRow("trainer_whatever")).toBeNull();
    expect(errorCodeRow("no_such_code")).toBeNull();
  });

  it("maps the trainer protocol's codes to the table, and any other code the trainer sends to trainer_error", () => {
    for (const [wire, code] of Object.entries(TRAINER_PROTOCOL_CODES)) {
      expect(trainerErrorCode(wire)).toBe(code);
      expect(errorCodeRow(code), code).not.toBeNull();
    }
    expect(trainerErrorCode("weight_push_failed")).toBe("trainer_error");
    expect(trainerErrorCode("__proto__")).toBe("trainer_error");
    const doc = readFileSync(new URL("../../docs/trainer-protocol.md", import.meta.url), "utf8");
    const documented = [...doc.matchAll(/^\| ([a-z_]+) \| \d{3} \| (?:yes|no) \|/gm)].map((m) => m[1]);
    expect(documented.sort()).toEqual(Object.keys(TRAINER_PROTOCOL_CODES).sort());
    // The torch trainer's own table of the codes it answers with (workers/trainer-torch/protocol.py).
    const protocolPy = readFileSync(new URL("../../workers/trainer-torch/protocol.py", import.meta.url), "utf8");
    const httpStatus = /^HTTP_STATUS = \{([^}]*)\}/m.exec(protocolPy)?.[1] ?? "";
    expect([...httpStatus.matchAll(/"([a-z_]+)":/g)].map((m) => m[1]).sort()).toEqual(Object.keys(TRAINER_PROTOCOL_CODES).sort());
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
