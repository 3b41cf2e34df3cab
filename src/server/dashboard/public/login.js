// SPDX-License-Identifier: Apache-2.0
// Logging in to a server with users or tokens: the form (a user name and password, sent as
// HTTP Basic, or a token, sent as Bearer), who is logged in (GET /v1/whoami) and logging out.
// The page shows the form only when the server answers 401: an open server needs no login.
import { h, fill } from "./format.js";
import { api, credential, errorLine } from "./api.js";

/** A line for the login form, left in sessionStorage across the reload that ends a login
 * (log out, or a credential the server refused): it also says a login is needed, so the
 * reloaded page shows the form without first sending a request bound to fail. */
const NOTICE_KEY = "sluice.dashboard.login-notice";

/** The caller as the server sees it; `authorization` (a login attempt) instead of the stored credential. */
export function whoami(authorization) {
  return api("GET", "/v1/whoami", undefined, authorization === undefined ? {} : { authorization });
}

/** HTTP Basic of a user name and password (UTF-8, as the server decodes it). */
export function basicAuthorization(user, password) {
  const bytes = new TextEncoder().encode(`${user}:${password}`);
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return `Basic ${btoa(bin)}`;
}

/** Forgets the credential and reloads the page, so nothing read under this login stays in it;
 * the reloaded page shows the login form with `text` (red when `error`). */
export function endLogin(text, error = false) {
  credential.forget();
  sessionStorage.setItem(NOTICE_KEY, JSON.stringify({ text, error }));
  location.reload();
}

/** The line `endLogin` left ({ text, error }), once; null when the page was not reloaded by it. */
export function takeNotice() {
  const m = sessionStorage.getItem(NOTICE_KEY);
  sessionStorage.removeItem(NOTICE_KEY);
  try {
    return m === null ? null : JSON.parse(m);
  } catch {
    return null;
  }
}

/** The login form in `el`; `onLogin(who)` runs once the server accepted what was typed. */
export function createLogin(el, onLogin) {
  const user = h("input", { id: "login-user", name: "username", autocomplete: "username", required: true });
  const password = h("input", { id: "login-password", name: "password", type: "password", autocomplete: "current-password" });
  const token = h("input", { id: "login-token", name: "token", type: "password", autocomplete: "off", spellcheck: "false" });
  const byPassword = h("input", { type: "radio", name: "login-with", id: "login-with-password", value: "password", checked: true });
  const byToken = h("input", { type: "radio", name: "login-with", id: "login-with-token", value: "token" });
  const passwordFields = h("div", { class: "login-fields" }, h("label", { for: "login-user" }, "User"), user, h("label", { for: "login-password" }, "Password"), password);
  const tokenFields = h("div", { class: "login-fields", hidden: true }, h("label", { for: "login-token" }, "Token"), token);
  const message = h("p", { id: "login-message", class: "error-line", role: "alert", hidden: true });
  const submit = h("button", { type: "submit", id: "login-submit" }, "Log in");
  const switchTo = () => {
    passwordFields.hidden = byToken.checked;
    tokenFields.hidden = !byToken.checked;
    user.required = !byToken.checked;
    token.required = byToken.checked;
  };
  byPassword.addEventListener("change", switchTo);
  byToken.addEventListener("change", switchTo);

  const say = (text, error = true) => {
    message.hidden = text === null;
    message.className = error ? "error-line" : "notice";
    fill(message, text ?? "");
  };
  const form = h(
    "form",
    { id: "login-form", "aria-label": "Log in", novalidate: true },
    h("h2", null, "Log in"),
    h("p", { class: "hint" }, "This server requires a login: a user's name and password, or a token (sluice users add, sluice tokens create)."),
    h("div", { class: "login-with" }, h("label", null, byPassword, " User and password"), h("label", null, byToken, " Token")),
    passwordFields,
    tokenFields,
    submit,
    message,
  );
  form.addEventListener("submit", async (ev) => {
    // Never submitted by the browser (the page's CSP forbids it anyway): the credential
    // goes only into the Authorization header, never into a URL.
    ev.preventDefault();
    if (byToken.checked ? token.value.trim() === "" : user.value === "") return say(byToken.checked ? "Enter a token." : "Enter a user name.");
    const authorization = byToken.checked ? `Bearer ${token.value.trim()}` : basicAuthorization(user.value, password.value);
    submit.disabled = true;
    say(null);
    try {
      const who = await whoami(authorization);
      credential.set(authorization);
      password.value = "";
      token.value = "";
      say(null);
      onLogin(who);
    } catch (e) {
      // The server's own words: the same for an unknown user and a wrong password.
      say(errorLine(e));
    } finally {
      submit.disabled = false;
    }
  });
  fill(el, form);
  return {
    /** Shows the form, with a line under it (why it is shown: { text, error }), or none. */
    show(notice) {
      el.hidden = false;
      say(notice?.text ?? null, notice?.error ?? false);
      (byToken.checked ? token : user).focus();
    },
    hide() {
      el.hidden = true;
    },
  };
}

/** The header's "who is logged in" part: the principal, its tenant, and Log out. */
export function showWho(el, who) {
  el.hidden = who.principal === null;
  if (who.principal === null) return;
  fill(
    el,
    h("span", { id: "who-name", title: who.superuser ? "admin on the cluster" : null }, who.principal),
    who.tenant ? h("span", { class: "tenant" }, ` · tenant ${who.tenant}`) : null,
    " ",
    h("button", { id: "logout", class: "link", onclick: () => endLogin("Logged out.") }, "Log out"),
  );
}
