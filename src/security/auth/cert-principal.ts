// SPDX-License-Identifier: Apache-2.0
/**
 * Client certificate → principal (docs/security.md "Client certificates (mutual TLS)"), in
 * the style of Kafka's `ssl.principal.mapping.rules`: an ordered list of rules, the first that
 * applies to a certificate decides (AUTH-5). Rules:
 *
 * - `RULE:<regex>/<replacement>/[L|U]`: the regex must match the whole subject DN in RFC 2253
 *   form (`CN=alice,OU=eng,O=Acme,C=US`: most specific name first, values escaped as RFC 2253
 *   says); the principal is the replacement (`$1`... name the regex's groups), lower-cased
 *   with `L`, upper-cased with `U`. A `/` or `\` inside the regex or the replacement is written
 *   `\/` or `\\`.
 * - `CN`: the subject's common name.
 * - `SAN:email`, `SAN:uri`, `SAN:dns`: the certificate's first subject alternative name of
 *   that type.
 *
 * A list is written one rule per element, or several separated by commas (as Kafka writes
 * them: a comma inside a RULE's regex belongs to the regex). The principal a rule gives must
 * be a principal name that authorization rules can name (1-128 letters, digits, ".", "_", "@",
 * "-"); anything else is refused, not passed on. `DEFAULT` (the whole DN as the principal) is
 * refused at startup for that reason: a DN is never such a name.
 */
import type { X509Certificate } from "node:crypto";
import { TlsConfigError } from "../../errors.js";

/** What authorization can name (src/security/acl/model.ts, the user names of credential-store.ts). */
const PRINCIPAL_NAME = /^[A-Za-z0-9._@-]{1,128}$/;

type SanKind = "email" | "uri" | "dns";
/** Node's `subjectAltName` prefixes of the kinds a rule can name. */
const SAN_PREFIX: Record<SanKind, string> = { email: "email", uri: "URI", dns: "DNS" };

type Rule =
  | { kind: "regex"; text: string; pattern: RegExp; replacement: string; fold: "" | "L" | "U" }
  | { kind: "cn"; text: string }
  | { kind: "san"; text: string; san: SanKind };

/** The outcome for one certificate: a principal, or why there is none (logged, never sent). */
export type CertMapping = { principal: string; rule: string } | { principal: null; reason: string };

/** One rule at the start of `s`, with the comma that ends it: `(?:[^/\\]|\\.)*` is a part with escapes. */
const RULE_AT = /^\s*(?:(DEFAULT)|(CN)|SAN:(email|uri|dns)|RULE:((?:[^/\\]|\\.)*)\/((?:[^/\\]|\\.)*)\/([LU]?))\s*(?:,|$)/;

function bad(message: string): TlsConfigError {
  return new TlsConfigError(`tls principal rules: ${message}`);
}

function regexRule(text: string, rawPattern: string, rawReplacement: string, fold: string): Rule {
  // `\/` and `\\` mean "/" and "\" to a regex as they do in the rule, so the part is used as is.
  const source = rawPattern;
  let pattern: RegExp;
  try {
    // Anchored: the rule applies only when the whole DN matches, as in Kafka.
    pattern = new RegExp(`^(?:${source})$`);
  } catch (err) {
    throw bad(`${JSON.stringify(text)}: invalid regular expression: ${(err as Error).message}`);
  }
  // `$n` naming a group the regex does not have would silently stay "$n" in the principal.
  const groups = (new RegExp(`${source}|`).exec("") ?? [""]).length - 1;
  // A replacement has no escapes of its own: `\x` is x (the slash or backslash the rule escaped).
  const replacement = rawReplacement.replace(/\\(.)/g, "$1");
  for (const m of replacement.matchAll(/\$(\d+)/g)) {
    if (Number(m[1]) > groups) throw bad(`${JSON.stringify(text)}: the replacement names $${m[1]} but the regex has ${groups} group(s)`);
  }
  if (replacement.length === 0) throw bad(`${JSON.stringify(text)}: the replacement is empty`);
  return { kind: "regex", text, pattern, replacement, fold: fold === "L" || fold === "U" ? fold : "" };
}

/** Parses one element of the list (one rule or several separated by commas). */
function parseList(list: string, into: Rule[]): void {
  let rest = list.trim();
  if (rest.length === 0) throw bad("an empty rule list");
  while (rest.length > 0) {
    const m = RULE_AT.exec(rest);
    if (!m) throw bad(`cannot parse ${JSON.stringify(rest.slice(0, 200))}: expected RULE:<regex>/<replacement>/[L|U], CN, SAN:email, SAN:uri or SAN:dns`);
    const text = m[0].trim().replace(/,$/, "").trim();
    if (m[1] !== undefined) {
      throw bad("DEFAULT (the whole DN as the principal) is not supported: a DN is not a principal name authorization rules can name; use CN or e.g. RULE:^CN=([^,]+),.*$/$1/");
    }
    if (m[2] !== undefined) into.push({ kind: "cn", text });
    else if (m[3] === "email" || m[3] === "uri" || m[3] === "dns") into.push({ kind: "san", text, san: m[3] });
    else into.push(regexRule(text, m[4], m[5], m[6]));
    rest = rest.slice(m[0].length).trimStart();
  }
}

/**
 * The subject DN in RFC 2253 form from Node's `X509Certificate.subject`, which lists the RDNs
 * one per line in certificate order (most general first), the values of a multi-valued RDN
 * separated by " + ", each value already escaped as RFC 2253 says (OpenSSL's ESC_2253). RFC
 * 2253 lists them the other way round, as `openssl x509 -nameopt RFC2253` does.
 */
export function rfc2253(subject: string): string {
  const rdns = subject.split("\n").filter((l) => l.length > 0);
  return rdns
    .reverse()
    .map((rdn) => rdn.split(" + ").reverse().join("+"))
    .join(",");
}

/**
 * An RFC 2253 value without its escapes: `\,` is ",", and `\01` the byte 0x01 (OpenSSL writes
 * control characters so), which must not become the letters "01" of a valid name.
 */
function unescapeRfc2253(v: string): string {
  return v.replace(/\\([0-9A-Fa-f]{2}|.)/g, (_, e: string) => (e.length === 2 ? String.fromCharCode(parseInt(e, 16)) : e));
}

/** The value of the most specific CN of a subject (first in RFC 2253 order), RFC 2253 escapes removed. */
function commonName(subject: string): string | null {
  const lines = subject.split("\n").reverse();
  for (const line of lines) {
    for (const ava of line.split(" + ").reverse()) {
      if (ava.startsWith("CN=")) return unescapeRfc2253(ava.slice(3));
    }
  }
  return null;
}

/**
 * The entries of Node's `subjectAltName` ("DNS:a, email:b, URI:c"); a value with special
 * characters is a JSON string literal there (`DNS:"a,b"`).
 */
export function subjectAltNames(san: string | undefined): { type: string; value: string }[] {
  const out: { type: string; value: string }[] = [];
  const entry = /\s*([A-Za-z ]+):("(?:[^"\\]|\\.)*"|[^,]*)(?:,|$)/y;
  let m: RegExpExecArray | null;
  while (san !== undefined && entry.lastIndex < san.length && (m = entry.exec(san)) !== null) {
    const value = m[2].startsWith('"') ? jsonString(m[2]) : m[2];
    if (value !== null) out.push({ type: m[1], value });
  }
  return out;
}

function jsonString(literal: string): string | null {
  try {
    const v: unknown = JSON.parse(literal);
    return typeof v === "string" ? v : null;
  } catch {
    return null;
  }
}

export class CertPrincipalMapper {
  private constructor(private readonly rules: readonly Rule[]) {}

  /**
   * Parses the rules (each element one rule or a comma-separated list, in order). Throws
   * `TlsConfigError` naming the rule that cannot be used, so a bad rule stops the start.
   */
  static parse(lists: readonly string[]): CertPrincipalMapper {
    const rules: Rule[] = [];
    for (const l of lists) parseList(l, rules);
    if (rules.length === 0) throw bad("no rules");
    return new CertPrincipalMapper(rules);
  }

  /** The rules as written (for the startup log). */
  describe(): string[] {
    return this.rules.map((r) => r.text);
  }

  /** AUTH-5: the first rule that applies decides; its result must be a principal name. */
  map(cert: X509Certificate): CertMapping {
    const dn = rfc2253(cert.subject);
    for (const rule of this.rules) {
      const name = apply(rule, cert, dn);
      if (name === null) continue;
      if (!PRINCIPAL_NAME.test(name)) return { principal: null, reason: `rule ${rule.text} gives an invalid principal name` };
      return { principal: name, rule: rule.text };
    }
    return { principal: null, reason: "no principal rule matches the client certificate" };
  }
}

function apply(rule: Rule, cert: X509Certificate, dn: string): string | null {
  if (rule.kind === "cn") return commonName(cert.subject);
  if (rule.kind === "san") return subjectAltNames(cert.subjectAltName).find((e) => e.type === SAN_PREFIX[rule.san])?.value ?? null;
  if (!rule.pattern.test(dn)) return null;
  const name = dn.replace(rule.pattern, rule.replacement);
  return rule.fold === "L" ? name.toLowerCase() : rule.fold === "U" ? name.toUpperCase() : name;
}
