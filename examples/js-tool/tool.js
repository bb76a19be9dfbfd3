// A keel tool written in JavaScript: `js_slugify` turns a title into a URL slug.
//
// Built into a WebAssembly component with componentize-js against keel's `wit/tool.wit`
// (world `tool`); see README.md.

import { log } from 'keel:tool/host@0.1.0';

const INPUT_SCHEMA = {
  type: 'object',
  properties: {
    text: { type: 'string', description: 'The title to turn into a slug.' },
    max_length: { type: 'integer', minimum: 1, description: 'Longest slug (default 64).' },
  },
  required: ['text'],
  additionalProperties: false,
};

function slugify(text, maxLength) {
  // (The engine has no Unicode normalization tables, so accented letters are dropped rather
  // than folded to their base letter.)
  const slug = text
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '-')
    .replace(/^-+|-+$/g, '');
  return slug.slice(0, maxLength).replace(/-+$/, '');
}

export const tools = {
  describe() {
    return [
      {
        name: 'js_slugify',
        description: 'Turns a title into a lowercase, dash-separated URL slug.',
        inputSchema: JSON.stringify(INPUT_SCHEMA),
        outputSchema: undefined,
        effect: 'read-only',
        idempotent: true,
      },
    ];
  },

  invoke(name, input) {
    if (name !== 'js_slugify') {
      throw { tag: 'unknown-tool', val: `no tool named ${name}` };
    }
    let args;
    try {
      args = JSON.parse(input);
    } catch (e) {
      throw { tag: 'invalid-input', val: `the input is not JSON: ${e}` };
    }
    if (typeof args.text !== 'string') {
      throw { tag: 'invalid-input', val: '`text` must be a string' };
    }
    log('info', `slugifying ${args.text.length} characters`);
    try {
      return JSON.stringify({ slug: slugify(args.text, args.max_length ?? 64) });
    } catch (e) {
      // Anything thrown that is not a tool-error variant would abort the component.
      throw { tag: 'failed', val: String(e) };
    }
  },
};
