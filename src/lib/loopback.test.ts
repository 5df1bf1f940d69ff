import { describe, expect, it } from "vitest";
import { isLoopbackHost } from "./loopback.ts";

describe("isLoopbackHost", () => {
  it.each([
    "127.0.0.1",
    "127.1.2.3",
    "127.255.255.255",
    "localhost",
    "LocalHost",
    "localhost.",
    "::1",
    "[::1]",
    "0:0:0:0:0:0:0:1",
    "0000::0001",
    "::ffff:127.0.0.1",
    "0:0:0:0:0:ffff:127.0.0.2",
  ])("%s is loopback", (host) => expect(isLoopbackHost(host)).toBe(true));
  it.each([
    "0.0.0.0",
    "::",
    "",
    "10.216.4.2",
    "192.168.1.10",
    "128.0.0.1",
    "126.255.255.255",
    "::2",
    "::ffff:10.0.0.1",
    "::127.0.0.1",
    "fe80::1",
    "localhost.example.com",
    "example.com",
    "127.0.0.1.example.com",
    "1::",
  ])("%s is beyond loopback", (host) => expect(isLoopbackHost(host)).toBe(false));
});
