/** The HTTP message as the verifier sees it: field lines grouped by lower-cased name. */

/**
 * Headers in any of the shapes Node code holds them: Node's `IncomingHttpHeaders`, a fetch
 * `Headers`, `[name, value]` pairs, or Node's flat `rawHeaders` array (which keeps repeats).
 */
export type HeadersInput =
  | Headers
  | Record<string, string | string[] | undefined>
  | Iterable<readonly [string, string]>
  | readonly string[];

/** Lower-cased field name → its field lines in wire order, each normalised as RFC 9421 §2.1 says. */
export type Fields = Map<string, string[]>;

/** RFC 9421 §2.1: unfold obsolete line folding and trim optional whitespace. */
export function normalizeValue(value: string): string {
  const unfolded = value.includes("\r\n") ? value.replace(/(?:(?<![ \t])[ \t]+)?\r\n[ \t]+/g, " ") : value;
  return unfolded.replace(/^[ \t]+|[ \t]+$/g, "");
}

export function normalizeFields(headers: HeadersInput): Fields {
  const fields: Fields = new Map();
  const add = (name: string, value: unknown): void => {
    if (typeof value !== "string") {
      throw new TypeError(
        `header ${JSON.stringify(name)} has a ${value === null ? "null" : typeof value} value: header values must be strings (leave a header out rather than pass null)`,
      );
    }
    const key = name.toLowerCase();
    const lines = fields.get(key);
    if (lines === undefined) fields.set(key, [normalizeValue(value)]);
    else lines.push(normalizeValue(value));
  };
  if (typeof Headers !== "undefined" && headers instanceof Headers) {
    // A fetch Headers object has already joined repeats with ", " (set-cookie aside).
    headers.forEach((value, name) => add(name, value));
  } else if (Array.isArray(headers) && (headers.length === 0 || typeof headers[0] === "string")) {
    const flat = headers as readonly string[];
    for (let i = 0; i + 1 < flat.length; i += 2) add(flat[i] as string, flat[i + 1]);
  } else if (Symbol.iterator in Object(headers)) {
    for (const [name, value] of headers as Iterable<readonly [string, string]>) add(name, value);
  } else {
    for (const [name, value] of Object.entries(headers as Record<string, string | string[] | undefined>)) {
      if (value === undefined) continue; // Node's IncomingHttpHeaders leave absent ones undefined
      if (Array.isArray(value)) for (const line of value) add(name, line);
      else add(name, value);
    }
  }
  return fields;
}

/** The combined value of a field (lines joined by ", "), or undefined when absent. */
export function fieldValue(fields: Fields, name: string): string | undefined {
  const lines = fields.get(name);
  return lines === undefined ? undefined : lines.join(", ");
}
