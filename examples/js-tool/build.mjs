// Builds tool.js (beside this file) into a component: node build.mjs [OUT.wasm] [WIT_DIR]
// (needs the packages of package.json: npm install)
import { componentize } from '@bytecodealliance/componentize-js';
import { writeFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { dirname, join, resolve } from 'node:path';

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(process.argv[2] ?? join(here, 'js_tool.wasm'));
const wit = resolve(process.argv[3] ?? join(here, '..', '..', 'wit'));
const { component } = await componentize({
  sourcePath: join(here, 'tool.js'),
  witPath: wit,
  worldName: 'tool',
  // keel tools get no network: leave out the fetch() support that would import wasi:http.
  disableFeatures: ['http', 'fetch-event'],
});
await writeFile(out, component);
console.error(`wrote ${out} (${component.length} bytes)`);
