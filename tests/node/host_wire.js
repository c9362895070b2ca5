#!/usr/bin/env node
// A host's side of the wire in Node.js, driven line by line: what a host written from proto/
// alone sends (proto3 defaults included) and what it hears back. Reads JSON commands on stdin,
// writes one JSON line per event on stdout:
//   {"op": "open"}                      open the Lease stream
//   {"op": "send", "msg": {...}}        write one LeaseRequest (a plain object, as proto-loader takes it)
//   {"op": "end"}                       close the host's side of the stream
//   {"op": "decide", "req": {...}}      call PlannerService.Decide
// Events: {"lease": {...}} per LeaseResponse, {"status": {code, details}} when the stream ends,
// {"decided": {...}} or {"error": {code, details, metadata}} per Decide.
//
// Usage: node host_wire.js <host:port> <pki-dir> <host-id>
'use strict';

const fs = require('fs');
const path = require('path');
const readline = require('readline');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [address, pkiDir, hostId] = process.argv.slice(2);
const protoRoot = path.resolve(__dirname, '..', '..', 'proto');
const definition = protoLoader.loadSync(
  ['amc/v1/lease_service.proto', 'amc/v1/planner_service.proto'].map((f) => path.join(protoRoot, f)),
  { includeDirs: [protoRoot], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true },
);
const amc = grpc.loadPackageDefinition(definition).amc.v1;
const read = (name) => fs.readFileSync(path.join(pkiDir, name));
const credentials = grpc.credentials.createSsl(
  read('ca.pem'),
  read(`host-${hostId}.key`),
  read(`host-${hostId}.pem`),
);
const options = { 'grpc.ssl_target_name_override': 'localhost' };
const leases = new amc.LeaseService(address, credentials, options);
const planner = new amc.PlannerService(address, credentials, options);
const say = (event) => process.stdout.write(`${JSON.stringify(event)}\n`);

let stream = null;
const lines = readline.createInterface({ input: process.stdin });
lines.on('line', (line) => {
  const command = JSON.parse(line);
  if (command.op === 'open') {
    stream = leases.Lease();
    stream.on('data', (message) => say({ lease: message }));
    stream.on('status', (status) => say({ status: { code: status.code, details: status.details } }));
    stream.on('error', () => {}); // the status event says it
  } else if (command.op === 'send') {
    stream.write(command.msg);
  } else if (command.op === 'end') {
    stream.end();
  } else if (command.op === 'decide') {
    planner.Decide(command.req, { deadline: new Date(Date.now() + 20000) }, (err, response) => {
      if (err) say({ error: { code: err.code, details: err.details, metadata: err.metadata.getMap() } });
      else say({ decided: response });
    });
  }
});
lines.on('close', () => process.exit(0));
