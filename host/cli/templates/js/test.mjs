import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { count } from './tool.js';
import { schemasOf } from './schema.mjs';

test('counts words and characters', () => {
  assert.deepEqual(count({ text: 'two words' }), { words: 2, characters: 9 });
});

test('refuses what is not a string', () => {
  assert.throws(() => count({ text: 7 }), TypeError);
});

test('the schemas come from the JSDoc', async () => {
  const { count: s } = schemasOf(await readFile(new URL('./tool.js', import.meta.url), 'utf8'));
  assert.equal(s.description, 'Counts the words and characters of a text.');
  assert.deepEqual(s.input.required, ['text']);
  assert.equal(s.input.properties.text.type, 'string');
  assert.deepEqual(s.output.required, ['words', 'characters']);
});
