// ctxbudget for OpenClaw: `/ctxbudget [full [SECTION]|json]` and `/context budget [full
// [SECTION]|json]` answered with the ctxbudget proxy's report (GET <proxyUrl>/context/budget):
// a chat-sized summary, the whole text report (`full`), one section of it (`full caps`; the
// proxy knows the sections, `section=`) or the JSON, in every chat surface that goes through
// the gateway (Control UI, `openclaw tui`, channels).
//
// `context` is a reserved command name, so `/context budget` is caught by a `reply_dispatch`
// hook, which runs before OpenClaw's own `/context` handler; every other message (plain
// `/context` included) is left alone. Both spellings answer only senders OpenClaw authorizes
// for commands: OpenClaw checks /ctxbudget itself, and the hook asks OpenClaw's own
// `resolveCommandAuthorization` about the same message context. No npm dependencies: Node
// built-ins, `fetch`, and the `openclaw/plugin-sdk` that the gateway provides to plugins.

import { resolveCommandAuthorization } from "openclaw/plugin-sdk/command-auth-native";

export const DEFAULT_PROXY_URL = "http://127.0.0.1:4141";
export const DEFAULT_TIMEOUT_MS = 3000;
const CONFIG_KEY = "plugins.entries.ctxbudget.config";

const MODES = ["full", "json"];
/** What each mode asks the proxy for: the chat-sized summary, the whole text, the JSON. */
const QUERY = { summary: "?format=summary", full: "?format=text", json: "" };
// `full <section>` is the mode "full:<section>": the proxy answers a section it does not
// have with a 400 that lists the ones it has.
const SECTION = /^[a-z]{1,20}$/;

function fullSection(word) {
  return SECTION.test(word) ? `full:${word}` : null;
}

function query(mode) {
  if (String(mode).startsWith("full:")) {
    return `${QUERY.full}&section=${encodeURIComponent(mode.slice(5))}`;
  }
  return QUERY[mode] ?? QUERY.summary;
}

// Words apart by the spaces a user types (space, tab, CR, LF), as the proxy reads the command
// (proxy/pipeline/chat_command.py): JavaScript's \s and trim() also take NBSP and other
// Unicode spaces, which would answer here a text the proxy sends to the model.
const TYPED_SPACE = /[ \t\r\n]+/;

function typedWords(text) {
  return String(text ?? "")
    .replace(/^[ \t\r\n]+|[ \t\r\n]+$/g, "")
    .toLowerCase()
    .split(TYPED_SPACE);
}

/** "summary", "full", "full:<section>" or "json" when `text` is `/context budget [full
 * [SECTION]|json]`, else null. */
export function contextBudgetMode(text) {
  const words = typedWords(text);
  if (words[0] !== "/context" || words[1] !== "budget") return null;
  if (words.length === 2) return "summary";
  if (words.length === 3 && MODES.includes(words[2])) return words[2];
  if (words.length === 4 && words[2] === "full") return fullSection(words[3]);
  return null;
}

/** "summary", "full", "full:<section>" or "json" for the arguments of `/ctxbudget`, else
 * null. */
export function ctxbudgetMode(args) {
  const words = typedWords(args).filter(Boolean);
  if (words.length === 0) return "summary";
  if (words.length === 1 && MODES.includes(words[0])) return words[0];
  if (words.length === 2 && words[0] === "full") return fullSection(words[1]);
  return null;
}

/** The reply to the command: the proxy's report, or what went wrong and how to fix it. */
export async function report(mode, config = {}, env = process.env) {
  // The models' baseUrl (…/v1) works too: the report is at the proxy's root.
  const base = String(config.proxyUrl || DEFAULT_PROXY_URL)
    .replace(/\/+$/, "")
    .replace(/\/v1$/, "");
  const timeoutMs = Number(config.timeoutMs) || DEFAULT_TIMEOUT_MS;
  const headers = { accept: mode === "json" ? "application/json" : "text/plain" };
  if (config.proxyKeyEnv) {
    const key = env[config.proxyKeyEnv];
    if (!key) {
      return (
        `ctxbudget: ${CONFIG_KEY}.proxyKeyEnv names $${config.proxyKeyEnv}, which is not set ` +
        "in the OpenClaw gateway's environment. Set it there (then restart the gateway), or " +
        `remove proxyKeyEnv if the proxy has no keys.`
      );
    }
    headers.authorization = `Bearer ${key}`;
  }
  const url = `${base}/context/budget${query(mode)}`;
  let status;
  let body;
  try {
    // One deadline for connecting and reading the body: the chat never waits longer.
    const response = await fetch(url, { headers, signal: AbortSignal.timeout(timeoutMs) });
    status = response.status;
    body = await response.text();
  } catch (error) {
    return unreachable(base, timeoutMs, error);
  }
  if (status !== 200) return refused(base, status, body, config);
  if (mode !== "json") return body.trimEnd();
  try {
    return JSON.stringify(JSON.parse(body), null, 2);
  } catch {
    return body;
  }
}

function unreachable(base, timeoutMs, error) {
  const timedOut = error?.name === "TimeoutError" || error?.name === "AbortError";
  const why = timedOut
    ? `no answer within ${timeoutMs} ms`
    : error?.cause?.code || error?.cause?.message || error?.message || String(error);
  return (
    `ctxbudget: cannot reach the proxy at ${base} (${why}).\n` +
    "Fix: start it with `ctxbudget serve` (it listens on http://127.0.0.1:4141 by default), " +
    "or point the plugin at where it runs:\n" +
    `  openclaw config set ${CONFIG_KEY}.proxyUrl http://HOST:PORT`
  );
}

function refused(base, status, body, config) {
  let message = body.trim().slice(0, 300);
  try {
    message = JSON.parse(body).error?.message ?? message;
  } catch {
    // not JSON: keep the text
  }
  let fix = "";
  if (status === 401 || status === 403) {
    fix = config.proxyKeyEnv
      ? `\nFix: $${config.proxyKeyEnv} must hold one of the proxy's keys.`
      : `\nFix: the proxy has keys; put one in an environment variable of the gateway and name ` +
        `it: openclaw config set ${CONFIG_KEY}.proxyKeyEnv CTXBUDGET_KEY`;
  }
  return `ctxbudget: the proxy at ${base} answered ${status}: ${message}${fix}`;
}

const USAGE =
  "Usage: /ctxbudget [full [caps|money|kinds|requests|memory]|json] (or /context budget …)";
// What OpenClaw 2026.9.6 answers an unauthorized sender of a plugin command such as
// /ctxbudget (its executeRegisteredPluginCommand), so that both spellings answer alike.
const NOT_AUTHORIZED = "⚠️ This command requires authorization.";
const NOT_KEPT =
  "OpenClaw shows this reply but does not keep it in the chat history, because this chat " +
  "has no session yet; /ctxbudget is kept, and /context budget is once the chat has had " +
  "any other message";

/** Whether OpenClaw has created the session `sessionKey` (true when it cannot tell). */
function hasSession(api, sessionKey) {
  if (!sessionKey) return true;
  try {
    const entry = api.runtime.agent.session.getSessionEntry({
      sessionKey,
      readConsistency: "latest",
    });
    return Boolean(entry?.sessionId);
  } catch {
    return true;
  }
}

/** The message's text as OpenClaw's message hooks read it (`content` of before_dispatch). */
function messageText(inbound) {
  for (const text of [inbound.BodyForCommands, inbound.RawBody, inbound.Body]) {
    if (typeof text === "string" && text.trim()) return text;
  }
  return "";
}

/** Whether OpenClaw lets this message's sender run /ctxbudget: the `isAuthorizedSender` that
 * OpenClaw's command context gets from the same call on the same inputs (commands.allowFrom,
 * the channel's allowlists and pairing, owner-only channels, gateway identities). */
function isAuthorizedSender(inbound, cfg) {
  try {
    const commandAuthorized = inbound.CommandAuthorized === true;
    return resolveCommandAuthorization({ ctx: inbound, cfg, commandAuthorized })
      .isAuthorizedSender === true;
  } catch {
    return false; // cannot tell: no report
  }
}

/** The reply to `/context budget [full|json]` in `inbound` (a finalized message context), or null
 * when the message is not that command and stays OpenClaw's. */
async function contextBudgetReply(api, config, inbound, cfg) {
  // chat.send with command interpretation off: the text goes to the model, as /ctxbudget would
  if (inbound.CommandInterpretationSuppressed === true) return null;
  const mode = contextBudgetMode(messageText(inbound));
  if (!mode) return null;
  if (!isAuthorizedSender(inbound, cfg)) return NOT_AUTHORIZED;
  const text = await report(mode, config);
  if (hasSession(api, inbound.SessionKey)) return text;
  // OpenClaw 2026.9 keeps this reply in chat.history only once the session exists (a
  // registered command or a model turn creates it): say so, rather than let the report vanish
  // on reload unexplained. JSON stays bare, for scripts.
  api.logger.info(`ctxbudget: ${inbound.SessionKey} has no session yet: ${NOT_KEPT}`);
  return mode === "json" ? text : `${text}\n\n(${NOT_KEPT})`;
}

export default {
  id: "ctxbudget",
  name: "ctxbudget",
  description:
    "/context budget and /ctxbudget [full|json]: the ctxbudget proxy's report in chat",
  register(api) {
    const config = api.pluginConfig ?? {};

    api.registerCommand({
      name: "ctxbudget",
      description:
        "What ctxbudget saved, net, and clamped (add full for every request, full caps|money|kinds|requests|memory for one part, json for the raw report)",
      acceptsArgs: true,
      // requireAuth (the default): OpenClaw runs it only for authorized senders
      handler: async (ctx) => {
        const mode = ctxbudgetMode(ctx.args);
        return { text: mode ? await report(mode, config) : USAGE };
      },
    });

    // reply_dispatch sees every inbound message with its full context (the sender's command
    // authorization included, which before_dispatch does not carry); without it only
    // /ctxbudget works.
    if (config.contextBudgetCommand === false) return;
    api.on("reply_dispatch", async (event, ctx) => {
      if (event.isTailDispatch) return undefined; // an ACP reset's second pass: already seen
      const text = await contextBudgetReply(api, config, event.ctx, ctx.cfg);
      if (text === null) return undefined;
      const deliver = !event.suppressUserDelivery && event.sendPolicy !== "deny";
      const queuedFinal = deliver ? ctx.dispatcher.sendFinalReply({ text }) : false;
      ctx.recordProcessed("completed", { reason: "ctxbudget_context_budget" });
      ctx.markIdle("message_completed");
      return { handled: true, queuedFinal, counts: ctx.dispatcher.getQueuedCounts() };
    });
  },
};
