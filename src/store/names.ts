// SPDX-License-Identifier: Apache-2.0
import { InvalidNameError } from "../errors.js";

const NAME_RE = /^[a-zA-Z0-9._-]{1,249}$/;

/**
 * Names of topics, groups and queues become directory or file names, so they are checked
 * against an allow-list: `[a-zA-Z0-9._-]`, 1-249 chars, not `.` or `..`. With that, a joined
 * path can never leave the data dir (invariant FS-1; checked again with assertInside).
 */
export function validateName(kind: string, name: unknown): string {
  if (typeof name !== "string") throw new InvalidNameError(kind, String(name), "must be a string");
  if (!NAME_RE.test(name)) {
    const why = name.length === 0 ? "must not be empty" : name.length > 249 ? "longer than 249 characters" : "only [a-zA-Z0-9._-] allowed";
    throw new InvalidNameError(kind, name, why);
  }
  if (name === "." || name === "..") throw new InvalidNameError(kind, name, "'.' and '..' are reserved");
  return name;
}
