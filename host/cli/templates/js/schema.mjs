// JSON Schemas from JSDoc: build.mjs reads the comment above each exported function of
// tool.js and gives the component its tools' input and output schemas, so they are written
// once, in the language of the code. Understood:
//
//   /**
//    * What the tool does (the description the model reads).
//    * @param {object} input
//    * @param {string} input.text What this field is.
//    * @param {number} [input.limit=10] An optional field, with its default.
//    * @returns {{words: integer, characters: integer}} What it returns.
//    */
//
// Types: string, number, integer, boolean, object, any, T[], Array<T>, {a: T, b?: T},
// 'a'|'b' (an enum), and unions of them (T|null makes a field optional).

/** The schemas of every documented `export function` in `source`, by function name. */
export function schemasOf(source) {
  const out = {};
  const re = /\/\*\*([\s\S]*?)\*\/\s*export\s+(?:async\s+)?function\s+([A-Za-z_$][\w$]*)/g;
  for (const [, body, fn] of source.matchAll(re)) {
    const lines = body.split('\n').map((l) => l.replace(/^\s*\*\s?/, '').trimEnd());
    const text = [];
    const tags = [];
    for (const l of lines) {
      if (l.trimStart().startsWith('@')) tags.push(l.trim());
      else if (tags.length) tags[tags.length - 1] += ` ${l.trim()}`;
      else text.push(l.trim());
    }
    const input = { type: 'object', properties: {}, required: [], additionalProperties: false };
    let output;
    for (const tag of tags) {
      const [kind, rest] = [tag.split(/\s/, 1)[0], tag.slice(tag.split(/\s/, 1)[0].length).trim()];
      if (kind !== '@param' && kind !== '@returns' && kind !== '@return') continue;
      const [type, after] = takeType(rest, `${fn}: ${tag}`);
      if (kind === '@param') {
        const m = after.match(/^(\[)?\s*([\w$.]+)\s*(?:=\s*([^\]]*))?\s*(\])?\s*(?:-\s*)?(.*)$/);
        if (!m) throw new Error(`${fn}: cannot read ${tag}`);
        const [, open, path, dflt, , description] = m;
        const parts = path.split('.');
        if (parts.length === 1) continue; // the input object itself
        if (parts.length !== 2) throw new Error(`${fn}: ${path}: only fields of the input object are read`);
        const [schema, nullable] = schemaOf(type, `${fn}: ${tag}`);
        if (description) schema.description = description;
        if (dflt !== undefined) schema.default = JSON.parse(dflt.replace(/^'(.*)'$/, '"$1"'));
        input.properties[parts[1]] = schema;
        if (!open && !nullable) input.required.push(parts[1]);
      } else {
        [output] = schemaOf(type, `${fn}: ${tag}`);
        if (after) output.description = after;
      }
    }
    out[fn] = { description: text.join(' ').replace(/\s+/g, ' ').trim(), input, output };
  }
  return out;
}

/** The `{type}` at the start of `text` (braces nested), and what follows it. */
function takeType(text, where) {
  if (!text.startsWith('{')) throw new Error(`${where}: the type in braces is missing`);
  let depth = 0;
  for (let i = 0; i < text.length; i += 1) {
    if (text[i] === '{') depth += 1;
    if (text[i] === '}') depth -= 1;
    if (depth === 0) return [text.slice(1, i).trim(), text.slice(i + 1).trim()];
  }
  throw new Error(`${where}: unbalanced braces`);
}

/** `text` split at `sep` outside brackets, braces and quotes. */
function splitTop(text, sep) {
  const parts = [];
  let depth = 0;
  let quote = null;
  let start = 0;
  for (let i = 0; i < text.length; i += 1) {
    const c = text[i];
    if (quote) {
      if (c === quote) quote = null;
    } else if (c === '"' || c === "'") quote = c;
    else if ('{[(<'.includes(c)) depth += 1;
    else if ('}])>'.includes(c)) depth -= 1;
    else if (c === sep && depth === 0) {
      parts.push(text.slice(start, i).trim());
      start = i + 1;
    }
  }
  parts.push(text.slice(start).trim());
  return parts.filter((p) => p.length > 0);
}

/** A JSDoc type's JSON Schema, and whether it admits null (an optional field). */
function schemaOf(type, where) {
  const alternatives = splitTop(type, '|');
  if (alternatives.length > 1) {
    const kept = alternatives.filter((a) => a !== 'null' && a !== 'undefined');
    const nullable = kept.length < alternatives.length;
    if (kept.every((a) => /^(['"]).*\1$/.test(a))) {
      return [{ enum: kept.map((a) => a.slice(1, -1)) }, nullable];
    }
    if (kept.length === 1) return [schemaOf(kept[0], where)[0], nullable];
    return [{ anyOf: kept.map((a) => schemaOf(a, where)[0]) }, nullable];
  }
  const t = type.trim();
  if (/^(['"]).*\1$/.test(t)) return [{ const: t.slice(1, -1) }, false];
  if (t.endsWith('[]')) return [{ type: 'array', items: schemaOf(t.slice(0, -2), where)[0] }, false];
  const array = t.match(/^Array<(.+)>$/);
  if (array) return [{ type: 'array', items: schemaOf(array[1], where)[0] }, false];
  if (t.startsWith('{') && t.endsWith('}')) {
    const properties = {};
    const required = [];
    for (const field of splitTop(t.slice(1, -1), ',')) {
      const colon = field.indexOf(':');
      if (colon < 0) throw new Error(`${where}: ${field}: a field is NAME: TYPE`);
      let name = field.slice(0, colon).trim();
      const optional = name.endsWith('?');
      if (optional) name = name.slice(0, -1);
      const [schema, nullable] = schemaOf(field.slice(colon + 1), where);
      properties[name] = schema;
      if (!optional && !nullable) required.push(name);
    }
    return [{ type: 'object', properties, required }, false];
  }
  const scalars = { string: 'string', number: 'number', integer: 'integer', boolean: 'boolean', object: 'object', Object: 'object' };
  if (scalars[t]) return [{ type: scalars[t] }, false];
  if (t === 'any' || t === '*') return [{}, false];
  if (t === 'null' || t === 'undefined') return [{ type: 'null' }, true];
  throw new Error(`${where}: no JSON Schema for the type {${t}}`);
}
