/** Structured Field dictionaries (RFC 9651) as signatures need them: duplicate keys refused. */
import { type Dictionary, parseDictionary } from "structured-headers";

/**
 * Parse a dictionary and refuse one that names a key twice. RFC 9651 lets the last member win;
 * for `Signature-Input` or `Content-Digest` that would verify a member the sender may not have
 * meant, so both receivers refuse it. The parser has already accepted the text, so a comma outside
 * a quoted string is a member boundary and each member starts with its key.
 */
export function parseDictionaryStrict(value: string): Dictionary {
  const parsed = parseDictionary(value);
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
