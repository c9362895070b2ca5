// ESLint's recommended rules over the Node.js code amc ships and tests (`make check` runs it):
// the example host (examples/node-host), which people copy as the start of their own host, and
// the Node scripts of its tests. Versions are pinned in package.json like buf's.
'use strict';

const js = require('@eslint/js');
const globals = require('globals');

module.exports = [
  {
    files: ['examples/node-host/**/*.js', 'tests/node/**/*.js', 'eslint.config.js'],
    ...js.configs.recommended,
    languageOptions: {
      ecmaVersion: 2023,
      sourceType: 'commonjs',
      globals: globals.node,
    },
  },
];
