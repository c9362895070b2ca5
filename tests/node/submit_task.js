#!/usr/bin/env node
// Polyglot proof: a Node.js client that reads only the .proto contract, connects over mTLS with an
// operator certificate, submits a task and reads it back. Prints the task as JSON on success.
//
// Usage: node submit_task.js <host:port> <pki-dir> <operator-name> <goal>
'use strict';

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [address, pkiDir, operator, goal] = process.argv.slice(2);
if (!address || !pkiDir || !operator || !goal) {
  console.error('usage: node submit_task.js <host:port> <pki-dir> <operator-name> <goal>');
  process.exit(2);
}

const protoRoot = path.resolve(__dirname, '..', '..', 'proto');
const definition = protoLoader.loadSync(path.join(protoRoot, 'amc/v1/task_service.proto'), {
  includeDirs: [protoRoot],
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});
const amc = grpc.loadPackageDefinition(definition).amc.v1;

const credentials = grpc.credentials.createSsl(
  fs.readFileSync(path.join(pkiDir, 'ca.pem')),
  fs.readFileSync(path.join(pkiDir, `operator-${operator}.key`)),
  fs.readFileSync(path.join(pkiDir, `operator-${operator}.pem`)),
);
const client = new amc.TaskService(address, credentials);
const deadline = () => new Date(Date.now() + 10000);

function call(method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: deadline() }, (err, response) =>
      err ? reject(err) : resolve(response),
    );
  });
}

(async () => {
  const submitted = await call('SubmitTask', {
    goal,
    client_request_id: `node-${process.pid}-${Date.now()}`,
    lease_duration: { seconds: 30, nanos: 0 },
  });
  const taskId = submitted.task.task_id;
  const got = await call('GetTask', { task_id: taskId });
  if (got.task.task_id !== taskId || got.task.goal !== goal) {
    throw new Error(`read back a different task: ${JSON.stringify(got.task)}`);
  }
  process.stdout.write(
    JSON.stringify({
      task_id: got.task.task_id,
      goal: got.task.goal,
      status: got.task.status,
      lease_seconds: Number(got.task.lease_duration.seconds),
    }) + '\n',
  );
  client.close();
})().catch((err) => {
  console.error(`error: ${err.code !== undefined ? `code ${err.code}: ` : ''}${err.message}`);
  client.close();
  process.exit(1);
});
