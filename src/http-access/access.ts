/**
 * Who may read the dashboard. On a loopback host (lib/loopback.ts) anyone on this machine may
 * read, and only pause/resume and Bull Board's changes need the token. Bound beyond loopback,
 * every request needs it, pages, JSON, /queues and /metrics alike, in one of two forms:
 * - `Authorization: Bearer <token>`: scripts, and Prometheus (`authorization` / `bearer_token` in
 *   a scrape config);
 * - the cookie `rlq_dashboard_token`, for a browser, which cannot add a header to a page it opens.
 *   A person opens `/?token=<token>` once; the answer sets the cookie and redirects to the same
 *   URL without the query, so the token leaves the address bar and never travels in a Referer.
 *   The cookie is HttpOnly (the page's scripts cannot read it) and SameSite=Strict (no other site
 *   can make the browser send it). It is not Secure: the dashboard serves plain HTTP, and a browser
 *   drops a Secure cookie set over it; behind a TLS proxy the proxy may add the attribute.
 * `/healthz` answers without the token: it says `{ ok: true }` and nothing else, for a load
 * balancer's probe, which carries no token.
 * Nothing here logs a request, and a refusal never repeats the token it was given.
 */

import type { NextFunction, Request, Response } from "express";
import { ConfigError } from "../config/run-config.ts";
import { isLoopbackHost } from "../lib/loopback.ts";
import { secretEquals, tokenMatches } from "./token.ts";

export const tokenCookie = "rlq_dashboard_token";

/** Refuse to serve beyond loopback without a token, naming what to set. */
export function assertTokenForHost(host: string, token: string | undefined): void {
  if (token !== undefined || isLoopbackHost(host)) return;
  throw new ConfigError(
    `the dashboard and /metrics would listen on ${host} (--host / RLQ_DASHBOARD_HOST), beyond loopback, where every request needs the dashboard token: ` +
      `set RLQ_DASHBOARD_TOKEN (at least 16 characters) or RLQ_DASHBOARD_TOKEN_FILE (a file holding it), or listen on 127.0.0.1`,
  );
}

/** The cookie's value from a Cookie header, undefined when it is absent. */
function cookieValue(header: string | undefined, name: string): string | undefined {
  for (const part of (header ?? "").split(";")) {
    const eq = part.indexOf("=");
    if (eq > 0 && part.slice(0, eq).trim() === name) return decodeURIComponent(part.slice(eq + 1).trim());
  }
  return undefined;
}

/** Express middleware for a host beyond loopback: the request carries the token, or is answered 401. */
export function requireToken(token: string): (req: Request, res: Response, next: NextFunction) => void {
  return (req, res, next) => {
    if (req.path === "/healthz") return next();
    if (tokenMatches(token, req.header("authorization"))) return next();
    const cookie = cookieValue(req.header("cookie"), tokenCookie);
    if (cookie !== undefined && secretEquals(token, cookie)) return next();
    const query = req.query.token;
    if ((req.method === "GET" || req.method === "HEAD") && typeof query === "string" && secretEquals(token, query)) {
      const url = new URL(req.originalUrl, "http://dashboard");
      url.searchParams.delete("token");
      res.cookie(tokenCookie, token, { httpOnly: true, sameSite: "strict", path: "/" });
      res.redirect(303, url.pathname + url.search);
      return;
    }
    res
      .status(401)
      .set("www-authenticate", 'Bearer realm="rlq dashboard"')
      .json({
        error: {
          code: "bad_token",
          message:
            "this dashboard listens beyond loopback: every request needs the dashboard token, as the header 'Authorization: Bearer <RLQ_DASHBOARD_TOKEN>', " +
            "or, in a browser, open /?token=<RLQ_DASHBOARD_TOKEN> once (it sets a cookie)",
        },
      });
  };
}
