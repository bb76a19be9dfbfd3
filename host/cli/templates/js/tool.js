// The component's tools: each documented `export function` listed in TOOLS below. Their
// input and output schemas come from their JSDoc (build.mjs reads it, see schema.mjs); the
// functions are tested natively by test.mjs. Built into a WebAssembly component with
// componentize-js against wit/tool.wit (world `tool`).

const MAX_CHARS = 1 << 20;

/**
 * Counts the words and characters of a text.
 * @param {object} input
 * @param {string} input.text The text to count.
 * @returns {{words: integer, characters: integer}} Words (runs between whitespace) and characters.
 */
export function count({ text }) {
  if (typeof text !== 'string') {
    throw new TypeError('`text` must be a string');
  }
  if (text.length > MAX_CHARS) {
    throw new RangeError('`text` is over 1 MiB: give a shorter text');
  }
  const words = text.split(/\s+/).filter((w) => w.length > 0).length;
  return { words, characters: [...text].length };
}

// The tools: name → the function, its effect class and whether calling it twice is as once.
const TOOLS = {
  {{tool}}: { run: count, effect: '{{effect}}', idempotent: {{idempotent}} },
};

// Written by build.mjs from the JSDoc above each function (absent when run natively).
const SCHEMAS = globalThis.__keelSchemas ?? {};

export const tools = {
  describe() {
    return Object.entries(TOOLS).map(([name, t]) => {
      const s = SCHEMAS[t.run.name] ?? {};
      return {
        name,
        description: s.description ?? '',
        inputSchema: JSON.stringify(s.input ?? { type: 'object' }),
        outputSchema: s.output ? JSON.stringify(s.output) : undefined,
        effect: t.effect,
        idempotent: t.idempotent,
      };
    });
  },

  invoke(name, input) {
    const t = TOOLS[name];
    if (!t) {
      throw { tag: 'unknown-tool', val: `no tool named ${name}` };
    }
    try {
      return JSON.stringify(t.run(JSON.parse(input)));
    } catch (e) {
      // Anything thrown that is not a tool-error variant would abort the component.
      throw { tag: 'invalid-input', val: String(e) };
    }
  },
};
