/**
 * @file Which process listens on a TCP port, and which ports are free, for messages that name the
 * holder of a port rlq wanted (store/embedded-postgres.ts). Linux only: the listening socket's
 * inode from /proc/net/tcp{,6}, then the process whose /proc/PID/fd holds that socket. Elsewhere,
 * or when /proc hides the process (another user's, without root), the answer is null and the
 * caller says only that the port is taken.
 */

import { readFileSync, readdirSync, readlinkSync } from "node:fs";
import { createServer } from "node:net";

/** The pid and command line of the process listening on `port`, or null when it cannot be told. */
export function portHolder(port: number): { pid: number; command: string } | null {
  const inodes = new Set<string>();
  for (const table of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    let text: string;
    try {
      text = readFileSync(table, "utf8");
    } catch {
      // No /proc (not Linux) or no IPv6 table: that table has no listener to name.
      continue;
    }
    for (const line of text.split("\n").slice(1)) {
      const f = line.trim().split(/\s+/);
      const local = f[1];
      // st 0A is TCP_LISTEN; the local address ends in the port, in hex.
      if (local === undefined || f[3] !== "0A" || parseInt(local.split(":")[1] ?? "", 16) !== port) continue;
      if (f[9] !== undefined && f[9] !== "0") inodes.add(f[9]);
    }
  }
  if (inodes.size === 0) return null;
  for (const pid of readdirSync("/proc").filter((d) => /^\d+$/.test(d))) {
    let fds: string[];
    try {
      fds = readdirSync(`/proc/${pid}/fd`);
    } catch {
      // Another user's process, or one that exited while we looked: it cannot be named.
      continue;
    }
    for (const fd of fds) {
      let target: string;
      try {
        target = readlinkSync(`/proc/${pid}/fd/${fd}`);
      } catch {
        // The descriptor closed while we looked.
        continue;
      }
      const m = /^socket:\[(\d+)\]$/.exec(target);
      if (m?.[1] !== undefined && inodes.has(m[1])) return { pid: Number(pid), command: commandLine(Number(pid)) };
    }
  }
  return null;
}

function commandLine(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").filter(Boolean).join(" ").slice(0, 200);
  } catch {
    // The process exited after its socket was found: its pid is all there is to say.
    return "?";
  }
}

/** Whether nothing listens on 127.0.0.1:`port` (true when this process could bind it just now). */
export function isPortFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once("error", () => resolve(false));
    s.listen(port, "127.0.0.1", () => s.close(() => resolve(true)));
  });
}

/** A port on 127.0.0.1 that was free a moment ago (the OS's choice). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const a = s.address();
      const port = typeof a === "object" && a !== null ? a.port : 0;
      s.close(() => resolve(port));
    });
  });
}
