// SPDX-License-Identifier: Apache-2.0
/**
 * Message schemas per topic or queue, per type and version. A publish or enqueue through a
 * broker given a registry (`openBroker({ schemas })`, `connect({ schemas })`) is validated
 * before anything is sent or written, and refused with `SchemaViolationError` naming the field.
 *
 * A schema is either a JSON Schema (validated with ajv) or any object with a zod-style
 * `safeParse(value)` (a zod schema in code). The type and version of a message come from its
 * envelope headers (envelope.ts). Registering version n+1 of a type checks it is backward
 * compatible with every earlier version (compat.ts) unless told otherwise.
 */
import { Ajv, type ErrorObject, type ValidateFunction } from "ajv";
import { SchemaIncompatibleError, SchemaViolationError, ValidationError } from "../errors.js";
import type { Headers } from "../value-types.js";
import { backwardProblems, type JsonSchema } from "./compat.js";
import { ENVELOPE_HEADERS } from "./envelope.js";

/** What zod's `safeParse` returns, as far as sluice reads it. */
export interface ParseResult {
  success: boolean;
  error?: { issues?: ReadonlyArray<{ path: ReadonlyArray<PropertyKey>; message: string }> };
}

/** A schema in code: a zod schema, or anything with the same `safeParse`. */
export interface ParseSchema {
  safeParse(value: unknown): ParseResult;
}

export type MessageSchema = JsonSchema | ParseSchema;

export type SchemaTargetKind = "topic" | "queue";

export interface AddSchemaOptions {
  /** "backward" (default): refuse a version that older values would not pass. */
  compatibility?: "backward" | "none";
}

export interface SchemaTargetOptions {
  /** What to do with a message whose type has no schema on this target. Default "refuse". */
  unknownTypes?: "refuse" | "allow";
}

interface Version {
  schema: MessageSchema;
  check: (value: unknown) => { field: string; reason: string } | null;
}

const isParseSchema = (s: MessageSchema): s is ParseSchema => typeof (s as ParseSchema).safeParse === "function";

/** The schemas of one topic or queue. */
export class SchemaTarget {
  private readonly types = new Map<string, Map<number, Version>>();
  constructor(
    readonly kind: SchemaTargetKind,
    readonly name: string,
    private readonly ajv: Ajv,
    private options: SchemaTargetOptions,
  ) {}

  configure(options: SchemaTargetOptions): this {
    this.options = { ...this.options, ...options };
    return this;
  }

  /** Registers version `version` of `type`. Throws `SchemaIncompatibleError` (backward check). */
  add(type: string, version: number, schema: MessageSchema, opts: AddSchemaOptions = {}): this {
    if (typeof type !== "string" || type.length === 0) throw new ValidationError("schema type must be a non-empty string");
    if (!Number.isSafeInteger(version) || version < 1) throw new ValidationError(`schema version must be an integer >= 1, got ${String(version)}`);
    const versions = this.types.get(type) ?? new Map<number, Version>();
    if (versions.has(version)) throw new ValidationError(`${this.kind} ${JSON.stringify(this.name)}: ${type} v${version} is already registered`);
    if ((opts.compatibility ?? "backward") === "backward" && !isParseSchema(schema)) {
      const problems: string[] = [];
      for (const [v, earlier] of versions) {
        if (v < version && !isParseSchema(earlier.schema)) problems.push(...backwardProblems(earlier.schema, schema).map((p) => `vs v${v}: ${p}`));
      }
      if (problems.length > 0) throw new SchemaIncompatibleError(type, version, problems);
    }
    versions.set(version, { schema, check: isParseSchema(schema) ? parseCheck(schema) : this.jsonCheck(schema) });
    this.types.set(type, versions);
    return this;
  }

  /** Registered versions of `type`, ascending. */
  versions(type: string): number[] {
    return [...(this.types.get(type)?.keys() ?? [])].sort((a, b) => a - b);
  }

  /** Throws `SchemaViolationError` unless `value` matches the schema its headers name. */
  validate(value: unknown, headers: Headers | undefined): void {
    const type = header(headers, ENVELOPE_HEADERS.type);
    const versionText = header(headers, ENVELOPE_HEADERS.schemaVersion);
    const version = versionText === undefined ? 1 : Number(versionText);
    const refuse = (field: string, reason: string) => new SchemaViolationError(this.name, type ?? "", version, field, reason);
    if (type === undefined) {
      if (this.options.unknownTypes === "allow") return;
      throw refuse("", `no ${ENVELOPE_HEADERS.type} header: ${this.kind} ${JSON.stringify(this.name)} validates messages by type (build headers with envelope())`);
    }
    const versions = this.types.get(type);
    if (!versions) {
      if (this.options.unknownTypes === "allow") return;
      throw refuse("", `no schema for type ${JSON.stringify(type)} on this ${this.kind}`);
    }
    const v = versions.get(version);
    if (!v) throw refuse("", `no schema for version ${versionText} of ${type} (registered: ${this.versions(type).join(", ")})`);
    const problem = v.check(value);
    if (problem) throw refuse(problem.field, problem.reason);
  }

  private jsonCheck(schema: JsonSchema): Version["check"] {
    let fn: ValidateFunction;
    try {
      fn = this.ajv.compile(schema);
    } catch (e) {
      throw new ValidationError(`invalid JSON Schema: ${(e as Error).message}`);
    }
    return (value) => (fn(value) ? null : firstProblem(fn.errors ?? []));
  }
}

/** Schemas per topic and per queue. */
export class SchemaRegistry {
  private readonly targets = new Map<string, SchemaTarget>();
  // One compiler for all targets: ajv caches compiled schemas. `strict: false` accepts the
  // keywords people put in schemas for documentation (examples, x-*).
  private readonly ajv = new Ajv({ allErrors: false, strict: false });

  topic(name: string, options: SchemaTargetOptions = {}): SchemaTarget {
    return this.target("topic", name, options);
  }

  queue(name: string, options: SchemaTargetOptions = {}): SchemaTarget {
    return this.target("queue", name, options);
  }

  /** The target's schemas if it has any. Publishing to a target without schemas is not checked. */
  find(kind: SchemaTargetKind, name: string): SchemaTarget | undefined {
    return this.targets.get(`${kind}:${name}`);
  }

  /** Validates a message for `kind` `name`; no-op for targets without schemas. */
  validate(kind: SchemaTargetKind, name: string, value: unknown, headers: Headers | undefined): void {
    this.targets.get(`${kind}:${name}`)?.validate(value, headers);
  }

  private target(kind: SchemaTargetKind, name: string, options: SchemaTargetOptions): SchemaTarget {
    const id = `${kind}:${name}`;
    let t = this.targets.get(id);
    if (!t) this.targets.set(id, (t = new SchemaTarget(kind, name, this.ajv, options)));
    else t.configure(options);
    return t;
  }
}

function header(headers: Headers | undefined, name: string): string | undefined {
  const v = headers?.[name];
  if (v === undefined) return undefined;
  return typeof v === "string" ? v : Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString("utf8");
}

/** The first ajv error, as a JSON pointer to the field and a reason. */
function firstProblem(errors: ErrorObject[]): { field: string; reason: string } {
  const e = errors[0];
  if (!e) return { field: "", reason: "does not match the schema" };
  const missing = e.keyword === "required" ? (e.params as { missingProperty?: string }).missingProperty : undefined;
  const extra = e.keyword === "additionalProperties" ? (e.params as { additionalProperty?: string }).additionalProperty : undefined;
  const field = missing ?? extra;
  return { field: field === undefined ? e.instancePath : `${e.instancePath}/${field}`, reason: missing ? "is required" : extra ? "is not allowed" : (e.message ?? e.keyword) };
}

function parseCheck(schema: ParseSchema): Version["check"] {
  return (value) => {
    const r = schema.safeParse(value);
    if (r.success) return null;
    const issue = r.error?.issues?.[0];
    if (!issue) return { field: "", reason: "does not match the schema" };
    return { field: issue.path.map((p) => `/${String(p)}`).join(""), reason: issue.message };
  };
}
