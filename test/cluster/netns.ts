import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";

/**
 * Hosts as Linux network namespaces (ip netns), joined by a bridge that lives in a namespace of
 * its own ("the switch"), so nothing is added to the machine's own namespace: traffic stays
 * between the namespaces the test made. Every name starts with a per-test random prefix
 * (`r16xxxx`), the subnet is 10.216.N.0/24 with N random, and `destroy()` deletes every namespace
 * (which deletes their veths and the bridge), also after a failure.
 */
export function netnsAvailable(): string | null {
  if (process.getuid?.() !== 0) return "not root (network namespaces need CAP_NET_ADMIN)";
  const probe = `r16probe${randomBytes(2).toString("hex")}`;
  const add = spawnSync("ip", ["netns", "add", probe], { encoding: "utf8" });
  if (add.status !== 0) return `ip netns add failed: ${(add.stderr || add.error?.message || "").trim()}`;
  spawnSync("ip", ["netns", "del", probe]);
  return null;
}

function sh(argv: string[]): string {
  const r = spawnSync(argv[0] as string, argv.slice(1), { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`${argv.join(" ")}: exit ${r.status}: ${r.stderr}`);
  return r.stdout;
}

export interface Host {
  name: string;
  ns: string;
  ip: string;
  /** The switch-side end of this host's link (link down = partition). */
  port: string;
  /** The host-side device (tc netem goes here). */
  dev: string;
}

export interface Cluster {
  prefix: string;
  subnet: string;
  hosts: Record<string, Host>;
  host(name: string): Host;
  /** Link down (true) or up (false) on the switch side: the host is cut off, its processes live on. */
  partition(name: string, down: boolean): void;
  /** tc netem on the host's link, or none. */
  netem(name: string, spec: string | null): void;
  /** Why tc netem cannot run here (a kernel without sch_netem), or null. */
  netemUnavailable(): string | null;
  /** SIGKILL every process in the host's namespace (its power cord). */
  powerOff(name: string): number[];
  /** A process in a host's namespace. */
  spawn(name: string, argv: string[], env: Record<string, string>, cwd: string): HostProc;
  exec(name: string, argv: string[]): string;
  destroy(): void;
}

export interface HostProc {
  child: ChildProcess;
  output(): string;
  exited: Promise<number | string>;
  kill(signal?: NodeJS.Signals): void;
}

export function createCluster(names: readonly string[]): Cluster {
  const prefix = `r16${randomBytes(2).toString("hex")}`;
  const n = 1 + ((randomBytes(1)[0] as number) % 250);
  const subnet = `10.216.${n}`;
  const sw = `${prefix}-sw`;
  const hosts: Record<string, Host> = {};
  const made: string[] = [];
  const procs: HostProc[] = [];
  const destroy = () => {
    for (const p of procs) p.kill("SIGKILL");
    for (const ns of made) {
      for (const pid of spawnSync("ip", ["netns", "pids", ns], { encoding: "utf8" }).stdout.split(/\s+/).filter(Boolean)) {
        try {
          process.kill(Number(pid), "SIGKILL");
        } catch {
          // already gone
        }
      }
      spawnSync("ip", ["netns", "del", ns]);
    }
  };
  try {
    sh(["ip", "netns", "add", sw]);
    made.push(sw);
    sh(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"]);
    sh(["ip", "-n", sw, "link", "set", "br0", "up"]);
    names.forEach((name, i) => {
      const ns = `${prefix}-${name}`;
      sh(["ip", "netns", "add", ns]);
      made.push(ns);
      const port = `p${i}`;
      // Created in the switch's namespace and one end moved: no device ever appears in ours.
      sh(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns]);
      sh(["ip", "-n", sw, "link", "set", port, "master", "br0"]);
      sh(["ip", "-n", sw, "link", "set", port, "up"]);
      const ip = `${subnet}.${i + 2}`;
      sh(["ip", "-n", ns, "addr", "add", `${ip}/24`, "dev", "eth0"]);
      sh(["ip", "-n", ns, "link", "set", "eth0", "up"]);
      sh(["ip", "-n", ns, "link", "set", "lo", "up"]);
      hosts[name] = { name, ns, ip, port, dev: "eth0" };
    });
  } catch (e) {
    destroy();
    throw e;
  }
  const host = (name: string) => {
    const h = hosts[name];
    if (!h) throw new Error(`no host ${name}`);
    return h;
  };
  return {
    prefix,
    subnet,
    hosts,
    host,
    partition(name, down) {
      sh(["ip", "-n", sw, "link", "set", host(name).port, down ? "down" : "up"]);
    },
    netem(name, spec) {
      const h = host(name);
      spawnSync("ip", ["netns", "exec", h.ns, "tc", "qdisc", "del", "dev", h.dev, "root"]);
      if (spec) sh(["ip", "netns", "exec", h.ns, "tc", "qdisc", "add", "dev", h.dev, "root", "netem", ...spec.split(" ")]);
    },
    netemUnavailable() {
      const h = host(names[0] as string);
      const r = spawnSync("ip", ["netns", "exec", h.ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], { encoding: "utf8" });
      if (r.status !== 0) return `tc qdisc add ... netem: ${(r.stderr || r.error?.message || "").trim()} (the kernel lacks sch_netem)`;
      spawnSync("ip", ["netns", "exec", h.ns, "tc", "qdisc", "del", "dev", "lo", "root"]);
      return null;
    },
    powerOff(name) {
      const pids = sh(["ip", "netns", "pids", host(name).ns])
        .split(/\s+/)
        .filter(Boolean)
        .map(Number);
      for (const pid of pids) {
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          // already gone
        }
      }
      return pids;
    },
    spawn(name, argv, env, cwd) {
      const child = spawn("ip", ["netns", "exec", host(name).ns, ...argv], { cwd, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
      let out = "";
      const keep = (d: Buffer) => {
        out += d.toString();
        if (out.length > 400_000) out = out.slice(-200_000);
      };
      child.stdout?.on("data", keep);
      child.stderr?.on("data", keep);
      const exited = new Promise<number | string>((resolve) => child.on("exit", (code, sig) => resolve(code ?? sig ?? -1)));
      const p: HostProc = {
        child,
        output: () => out,
        exited,
        kill(signal = "SIGKILL") {
          if (child.exitCode === null && child.signalCode === null) child.kill(signal);
        },
      };
      procs.push(p);
      return p;
    },
    exec(name, argv) {
      return sh(["ip", "netns", "exec", host(name).ns, ...argv]);
    },
    destroy,
  };
}
