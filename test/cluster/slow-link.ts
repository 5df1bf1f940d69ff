/**
 * TEST STAND-IN for `tc qdisc add dev eth0 root netem delay 200ms loss 5%` on kernels without
 * sch_netem (test/cluster/cluster.test.ts uses netem where it exists). A TCP proxy in the
 * trainer's namespace, in front of the trainer: `--listen HOST:PORT --to HOST:PORT`. SIGUSR1
 * turns the impairment on, SIGUSR2 off. Impaired, every chunk in either direction waits 200 ms
 * (order kept), and 5% of chunks wait 1 s more: what an application sees of a lost packet is
 * TCP's retransmission delay, not a hole in the stream. Only connections to the trainer pass
 * through it (the trainer's fetches of the batch do not).
 *
 *   node --import tsx test/cluster/slow-link.ts --listen 10.216.1.8:8700 --to 10.216.1.8:8701
 */
import { createConnection, createServer, type Socket } from "node:net";
import { parseArgs } from "node:util";

const { values } = parseArgs({ options: { listen: { type: "string" }, to: { type: "string" } } });
const split = (hp: string | undefined, what: string): [string, number] => {
  const m = /^(.+):(\d+)$/.exec(hp ?? "");
  if (!m) throw new Error(`--${what} HOST:PORT, got ${JSON.stringify(hp)}`);
  return [m[1] as string, Number(m[2])];
};
const [lh, lp] = split(values.listen, "listen");
const [th, tp] = split(values.to, "to");
let impaired = false;
process.on("SIGUSR1", () => {
  impaired = true;
  process.stdout.write("impaired\n");
});
process.on("SIGUSR2", () => {
  impaired = false;
  process.stdout.write("clear\n");
});

/** Forward `from` → `to`, each chunk released no earlier than the one before it. */
function pipeSlow(from: Socket, to: Socket): void {
  let releaseAt = 0;
  from.on("data", (chunk: Buffer) => {
    if (!impaired) {
      to.write(chunk);
      return;
    }
    const extra = Math.random() < 0.05 ? 1000 : 0;
    releaseAt = Math.max(releaseAt, Date.now() + 200 + extra);
    setTimeout(() => to.write(chunk), releaseAt - Date.now());
  });
  from.on("end", () => setTimeout(() => to.end(), Math.max(0, releaseAt - Date.now())));
  from.on("error", () => to.destroy());
}

createServer((client) => {
  const upstream = createConnection(tp, th);
  pipeSlow(client, upstream);
  pipeSlow(upstream, client);
  upstream.on("error", () => client.destroy());
  client.on("close", () => upstream.destroy());
  upstream.on("close", () => client.destroy());
}).listen(lp, lh, () => process.stdout.write(`listening ${lp}\n`));
