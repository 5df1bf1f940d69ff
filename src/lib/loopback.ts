/**
 * Whether a listen address reaches only this machine: `localhost`, an IPv4 address in
 * 127.0.0.0/8, or the IPv6 loopback `::1` (in any spelling, bracketed or not, and IPv4-mapped
 * `::ffff:127.x.y.z`). Anything else is "beyond loopback": a wildcard (`0.0.0.0`, `::`, the empty
 * string, which Node binds to every interface), an interface's address, or a host name other than
 * localhost (its address is whatever a resolver says). The dashboard and /metrics require the
 * token for every request when their host is beyond loopback (http-access/access.ts).
 */

import { isIPv4, isIPv6 } from "node:net";

export function isLoopbackHost(host: string): boolean {
  const h = host
    .trim()
    .toLowerCase()
    .replace(/^\[(.*)\]$/, "$1");
  if (h === "localhost" || h === "localhost.") return true;
  if (isIPv4(h)) return h.split(".")[0] === "127";
  if (!isIPv6(h)) return false;
  // IPv4-mapped (`::ffff:127.0.0.1`): the IPv4 part stands in for the last two groups.
  const mapped = /^(.*:)(\d+\.\d+\.\d+\.\d+)$/.exec(h);
  if (mapped) return expandIPv6(`${mapped[1]}0:0`) === "0000:0000:0000:0000:0000:ffff:0000:0000" && isLoopbackHost(mapped[2] as string);
  return expandIPv6(h) === "0000:0000:0000:0000:0000:0000:0000:0001";
}

/** An IPv6 address with every group written out (`::1` → `0000:...:0001`); `h` is valid IPv6 without an embedded IPv4 part. */
function expandIPv6(h: string): string {
  const [head = "", tail] = h.split("::");
  const left = head === "" ? [] : head.split(":");
  const right = tail === undefined || tail === "" ? [] : tail.split(":");
  const groups = tail === undefined ? left : [...left, ...Array<string>(8 - left.length - right.length).fill("0"), ...right];
  return groups.map((g) => g.padStart(4, "0")).join(":");
}
