import { describe, expect, it } from "vitest";
import { redact, redactDeep, redactUrl, registerSecret } from "./redact.ts";

describe("redact", () => {
  it("hides URL passwords and token parameters", () => {
    expect(redactUrl("postgres://rlq:s3cret@db:5432/rlq?sslmode=require")).toBe("postgres://rlq:***@db:5432/rlq?sslmode=require");
    expect(redactUrl("rediss://default:pw@r:6380")).toBe("rediss://default:***@r:6380");
    expect(redactUrl("http://t:8700/batch?token=abcd&x=1")).toBe("http://t:8700/batch?token=***&x=1");
    expect(redactUrl("http://host:8700/x")).toBe("http://host:8700/x");
  });
  it("hides registered secrets anywhere in a line, and secret-named keys", () => {
    registerSecret("sk-very-secret-key");
    expect(redact("401 with Bearer sk-very-secret-key from engine")).toBe("401 with Bearer *** from engine");
    expect(redactDeep({ a: ["x sk-very-secret-key"], Authorization: "Bearer zz", n: 3 })).toEqual({ a: ["x ***"], Authorization: "***", n: 3 });
  });
});

describe("redactDeep on errors", () => {
  it("keeps an error's message and stack, redacted", () => {
    registerSecret("tok-0123456789");
    const out = redactDeep({ err: Object.assign(new Error("auth tok-0123456789 refused"), { code: "x" }) }) as unknown as {
      err: { message: string; code: string; type: string };
    };
    expect(out.err).toMatchObject({ type: "Error", message: "auth *** refused", code: "x" });
  });
});
