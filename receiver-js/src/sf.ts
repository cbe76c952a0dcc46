/** Structured Field dictionaries (RFC 9651) as signatures need them: duplicate keys refused. */
import { type Dictionary, parseDictionary } from "structured-headers";

/**
 * Parse a dictionary and refuse one that names a key twice. RFC 9651 lets the last member win;
 * for `Signature-Input` or `Content-Digest` that would verify a member the sender may not have
 * meant, so both receivers refuse it. The parser has already accepted the text, so a comma outside
 * a quoted string is a member boundary and each member starts with its key.
 */
export function parseDictionaryStrict(value: string): Dictionary {
  const parsed = parseDictionary(repadded(value));
  let members = 1;
  let quoted = false;
  for (let i = 0; i < value.length; i++) {
    const c = value[i];
    if (quoted) {
      if (c === "\\") i++;
      else if (c === '"') quoted = false;
    } else if (c === '"') quoted = true;
    else if (c === ",") members++;
  }
  if (value.trim() === "") members = 0;
  if (members !== parsed.size) throw new Error("a key is named twice");
  return parsed;
}

/**
 * Byte sequences with their base64 padding made canonical, as RFC 9651 §4.2.7 asks of parsers
 * ("SHOULD NOT fail when '=' padding is not present") and as the Python receiver's parser does:
 * missing or short padding is completed; more than two `=`, or padding alone, stays as sent and
 * fails to parse. (`structured-headers` decodes with `atob`, which refuses `abcdef=`.)
 */
function repadded(value: string): string {
  let out = "";
  let quoted = false;
  for (let i = 0; i < value.length; i++) {
    const c = value[i] as string;
    if (quoted) {
      if (c === "\\") {
        out += c + (value[i + 1] ?? "");
        i++;
        continue;
      }
      if (c === '"') quoted = false;
    } else if (c === '"') {
      quoted = true;
    } else if (c === ":") {
      const end = value.indexOf(":", i + 1);
      const match = end < 0 ? null : /^([A-Za-z0-9+/]*)(=*)$/.exec(value.slice(i + 1, end));
      if (match !== null) {
        const [, data = "", padding = ""] = match;
        const canonical = padding.length > 2 || (padding && !data) ? data + padding : data + "=".repeat((4 - (data.length % 4)) % 4);
        out += `:${canonical}:`;
        i = end;
        continue;
      }
    }
    out += c;
  }
  return out;
}
