// SPDX-License-Identifier: Apache-2.0
// Client certificate → principal rules (src/security/auth/cert-principal.ts, AUTH-5): the rule
// syntax and its errors, the RFC 2253 form of the subject DN (as openssl prints it), and which
// principal a certificate gets: the first rule that applies decides, with L/U case folding,
// CN and SAN shorthands, and invalid names refused.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { X509Certificate } from "node:crypto";
import { readFileSync } from "node:fs";
import { TlsConfigError } from "../src/errors.js";
import { CertPrincipalMapper, rfc2253, subjectAltNames } from "../src/security/auth/cert-principal.js";
import { tempDir } from "../src/testing/helpers.js";
import { ensureOpenssl, makeCa, makeLeaf, type CertFiles } from "./fixtures/tls-certs.js";

let dir: ReturnType<typeof tempDir>;
let ca: CertFiles;
let serial = 1;

before(() => {
  dir = tempDir("sluice-cert-principal-");
  ca = makeCa(dir.dir, "ca");
});

after(() => dir.cleanup());

function cert(subject: string, san?: string): { x509: X509Certificate; file: string } {
  serial++;
  const files = makeLeaf(dir.dir, ca, { name: `c${serial}`, cn: "", serial, client: true, subject, san });
  return { x509: new X509Certificate(readFileSync(files.cert)), file: files.cert };
}

const map = (rules: string[], c: X509Certificate): string | null => CertPrincipalMapper.parse(rules).map(c).principal;

test("the subject DN is in RFC 2253 form, as openssl -nameopt RFC2253 prints it", () => {
  const c = cert("/C=US/O=Acme, Inc/OU=eng+OU=ops/CN=alice #1");
  const r = spawnSync(ensureOpenssl(), ["x509", "-in", c.file, "-noout", "-subject", "-nameopt", "RFC2253"], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  const expected = r.stdout.trim().replace(/^subject=\s*/, "");
  assert.equal(rfc2253(c.x509.subject), expected);
  assert.equal(expected, "CN=alice #1,OU=ops+OU=eng,O=Acme\\, Inc,C=US");
});

test("RULE: the regex matches the whole DN; the replacement names its groups; L and U fold the case", () => {
  const c = cert("/O=Acme/OU=Services/CN=Billing-API").x509;
  assert.equal(map(["RULE:^CN=([^,]+),OU=Services,O=Acme$/$1/"], c), "Billing-API");
  assert.equal(map(["RULE:^CN=([^,]+),OU=Services,O=Acme$/$1/L"], c), "billing-api");
  assert.equal(map(["RULE:^CN=([^,]+),OU=Services,O=Acme$/$1/U"], c), "BILLING-API");
  assert.equal(map(["RULE:^CN=([^,]+),OU=(\\w+).*$/$1@$2/L"], c), "billing-api@services");
  // Anchored: a regex matching only part of the DN does not apply.
  assert.equal(map(["RULE:OU=Services/svc/"], c), null);
  assert.equal(map(["RULE:.*OU=Services.*/svc/"], c), "svc");
});

test("rules are tried in order and the first that applies decides", () => {
  const svc = cert("/OU=svc/CN=ALICE").x509;
  const plain = cert("/CN=bob").x509;
  const rules = ["RULE:^CN=([^,]+),OU=svc$/$1/L", "CN"];
  assert.equal(map(rules, svc), "alice");
  assert.equal(map(rules, plain), "bob");
  // The same as one comma-separated list (a comma inside a RULE's regex belongs to it).
  assert.equal(map(["RULE:^CN=([^,]+),OU=svc$/$1/L, CN"], svc), "alice");
  assert.equal(map(["RULE:^CN=([^,]+),OU=svc$/$1/L,CN"], plain), "bob");
  assert.deepEqual(CertPrincipalMapper.parse(["RULE:^CN=([^,]+),OU=svc$/$1/L, CN", "SAN:email"]).describe(), ["RULE:^CN=([^,]+),OU=svc$/$1/L", "CN", "SAN:email"]);
});

test("CN, SAN:email, SAN:uri and SAN:dns shorthands", () => {
  const c = cert("/O=Acme/CN=carol", "email:carol@acme.example,URI:spiffe://acme/carol,DNS:carol.acme.example").x509;
  assert.equal(map(["CN"], c), "carol");
  assert.equal(map(["SAN:email"], c), "carol@acme.example");
  assert.equal(map(["SAN:dns"], c), "carol.acme.example");
  // A URI is never a principal name (":" and "/"), so it is refused rather than passed on.
  const uri = CertPrincipalMapper.parse(["SAN:uri"]).map(c);
  assert.equal(uri.principal, null);
  assert.match(uri.principal === null ? uri.reason : "", /invalid principal name/);
  // A certificate without the SAN: the next rule applies.
  const noSan = cert("/CN=dave").x509;
  assert.equal(map(["SAN:email", "CN"], noSan), "dave");
  assert.deepEqual(subjectAltNames('DNS:a, email:"b,c@x", URI:spiffe://t/u'), [
    { type: "DNS", value: "a" },
    { type: "email", value: "b,c@x" },
    { type: "URI", value: "spiffe://t/u" },
  ]);
});

test("a certificate no rule applies to, or mapped to an invalid name, has no principal", () => {
  const noCn = cert("/O=Nobody").x509;
  const none = CertPrincipalMapper.parse(["CN", "RULE:^CN=x$/x/"]).map(noCn);
  assert.deepEqual(none, { principal: null, reason: "no principal rule matches the client certificate" });
  // The first rule that applies decides, even when its name is unusable: no fallback (AUTH-5).
  const spaced = cert("/CN=Eve Smith").x509;
  assert.equal(map(["CN", "RULE:.*/eve/"], spaced), null);
  // A control character (written "\\01" in the DN) is not turned into the letters "01".
  const control = cert("/CN=ali\x01ce").x509;
  assert.equal(control.subject, "CN=ali\\01ce");
  assert.equal(map(["CN"], control), null);
  assert.equal(map(["RULE:^CN=(.*)$/$1/"], control), null);
});

test("a rule that cannot be used is a TlsConfigError naming it", () => {
  const cases: [string[], RegExp][] = [
    [["RULE:^CN=(.*$/$1/"], /invalid regular expression/],
    [["RULE:^CN=(.*)$/$2/"], /names \$2 but the regex has 1 group/],
    [["RULE:^CN=(.*)$//"], /replacement is empty/],
    [["RULE:^CN=(.*)$/$1/X"], /cannot parse/],
    [["RULE:^CN=(.*)$/$1"], /cannot parse/],
    [["SAN:ip"], /cannot parse/],
    [["cn"], /cannot parse/],
    [["CN,,SAN:email"], /cannot parse/],
    [["DEFAULT"], /DEFAULT .* is not supported/],
    [[" "], /empty rule list/],
    [[], /no rules/],
  ];
  for (const [rules, message] of cases) {
    assert.throws(() => CertPrincipalMapper.parse(rules), (err: unknown) => err instanceof TlsConfigError && message.test(err.message), JSON.stringify(rules));
  }
});

test("a slash inside a rule is escaped as \\/", () => {
  const c = cert("/O=a\\/b/CN=frank").x509;
  assert.equal(rfc2253(c.subject), "CN=frank,O=a/b");
  assert.equal(map(["RULE:^CN=([^,]+),O=a\\/b$/$1/"], c), "frank");
});
