// Builds tool.js into WASM: npm run build (after npm install). The tools' schemas are read
// from their JSDoc (schema.mjs) and put before the source the component is built from; the
// project's name and version (package.json) are written into the component as the custom
// sections keel reads (`keel:component`, `version`).
import { componentize } from '@bytecodealliance/componentize-js';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { schemasOf } from './schema.mjs';

const source = await readFile('tool.js', 'utf8');
const schemas = schemasOf(source);
await mkdir('.build', { recursive: true });
const built = `globalThis.__keelSchemas = ${JSON.stringify(schemas)};\n${source}`;
await writeFile('.build/tool.js', built);

const { component } = await componentize({
  sourcePath: '.build/tool.js',
  witPath: 'wit',
  worldName: 'tool',
  // keel tools get no network unless a session grants it: leave out fetch() support, which
  // would import wasi:http.
  disableFeatures: ['http', 'fetch-event'],
});

const leb = (n) => {
  const out = [];
  do {
    let byte = n & 0x7f;
    n >>>= 7;
    if (n) byte |= 0x80;
    out.push(byte);
  } while (n);
  return out;
};
const section = (name, data) => {
  const body = [...leb(Buffer.byteLength(name)), ...Buffer.from(name), ...Buffer.from(data)];
  return Buffer.from([0, ...leb(body.length), ...body]);
};
const pkg = JSON.parse(await readFile('package.json', 'utf8'));
const stamped = Buffer.concat([
  Buffer.from(component),
  section('keel:component', pkg.name),
  section('version', pkg.version),
]);
await writeFile('{{wasm}}', stamped);
console.error(`wrote {{wasm}} (${stamped.length} bytes): ${pkg.name} ${pkg.version}`);
