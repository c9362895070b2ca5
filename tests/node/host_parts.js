#!/usr/bin/env node
// Parts of examples/node-host/host.js that no whole run of it reaches, required as a module and
// driven directly. Prints one JSON line of what came of it.
//
//   node host_parts.js hand-back-revoked
//     A stopping host whose attempt is still stuck after the grace, its lease revoked by an
//     operator's cancel meanwhile (so no longer `held`): what `handBack` answers for it.
//
//   node host_parts.js unknown-values <serial>
//     What `act` does with an action naming values this host's contract lacks (a newer
//     cloud's): a key enum value it has no name for, an action of no kind it knows, a tap with
//     no target. Each error message, or null where the action ran.
//
//   node host_parts.js fault-during-probe
//     A host paused on its data folder probes it; while the probe's write is under way another
//     write fails on the disk (a real ENOSPC: /dev/full). Whether the host is still paused.
//
//   node host_parts.js backoff-ceilings
//     The reconnect backoff's ceilings (Math.random at its top): by failures in a row counted
//     as `main` counts them, and bounded by the leases of running attempts, as the Python
//     host's `backoff_delay` and `_lease_left` compute them. Also the progress renewal
//     interval host.js read from its settings.
//
// The environment is host.js's (AMC_HOST_CERTS_DIR, AMC_HOST_ID, AMC_HOST_DATA_DIR, …); no
// cloud is needed: nothing is sent while no stream is open, and answers are kept.
'use strict';

const fs = require('fs');
const path = require('path');

const host = require(path.resolve(__dirname, '..', '..', 'examples', 'node-host', 'host.js'));

async function handBackRevoked() {
  const lease = { task_id: 't1', attempt: 1, lease_id: 'lease-t1-1' };
  const stop = new AbortController();
  host.running.set(lease.lease_id, { stop, lease }); // a step that never ends at its stop
  host.revoked.set(lease.lease_id, { reason: 'REVOKE_REASON_CANCELLED', message: 'wrong phone' });
  let error = null;
  try {
    await host.handBack();
  } catch (err) {
    error = err.message;
  }
  const kept = host.results.get(lease.lease_id);
  return { error, running: host.running.size, result: kept ? kept.result : null };
}

async function unknownValues() {
  const device = host.adb.getDevice(process.argv[3]);
  const observation = { elements: [] };
  const tried = {
    key: { kind: 'press_key', press_key: { key: 9 } }, // how grpc-js decodes an enum value unknown to it
    kind: { purpose: 'a newer action', expected_outcome: '' }, // a oneof member unknown to it
    tap: { kind: 'tap', tap: { long_press: false, point: null } },
  };
  const errors = {};
  for (const [name, action] of Object.entries(tried)) {
    try {
      await host.act(device, action, observation);
      errors[name] = null;
    } catch (err) {
      errors[name] = err.message;
    }
  }
  return errors;
}

// What a write to a full disk throws: the kernel's own ENOSPC, from /dev/full.
function fullDiskError() {
  try {
    fs.writeFileSync('/dev/full', 'a result');
  } catch (err) {
    return err;
  }
  throw new Error('/dev/full took a write');
}

async function faultDuringProbe() {
  host.diskRefused(fullDiskError()); // paused
  const paused = host.dataFolder.why !== '';
  const probing = host.probeDataFolder(); // its write is under way (awaiting the file's open)
  host.diskRefused(fullDiskError()); // told meanwhile, as a result's write that failed
  await probing;
  return { paused, still_paused: host.dataFolder.why !== '' };
}

async function backoffCeilings() {
  Math.random = () => 1; // each delay is its ceiling
  const state = { failures: 0, welcomed: false };
  const failed = [1, 2, 3].map(() => host.backoff(host.failedInARow(state)));
  state.welcomed = true; // a stream the cloud welcomed, then lost
  const afterWelcome = host.backoff(host.failedInARow(state));
  const failedAgain = host.backoff(host.failedInARow(state));
  const capped = host.backoff(40);
  // A finished attempt's lease (no running attempt): no bound. A running one with 8 s left:
  // 4 s. One whose lease ran out by this host's clock, not paused yet: the floor.
  host.expiries.set('done', host.now() + 8000);
  const finished = host.backoff(6);
  host.running.set('run', { paused: false, leaseMs: 30000 });
  host.expiries.set('run', host.now() + 8000);
  const leaseLeft = host.backoff(6);
  host.expiries.set('run', host.now() - 1000);
  const ranOut = host.backoff(6);
  host.running.get('run').paused = true; // a paused attempt counts a whole lease
  const paused = host.backoff(6);
  host.revoked.set('run', { reason: 'REVOKE_REASON_CANCELLED', message: 'x' });
  const revokedLease = host.backoff(6);
  return {
    failed, afterWelcome, failedAgain, capped, finished,
    leaseLeft: Math.round(leaseLeft / 100) * 100, ranOut, paused, revokedLease,
    renewMinMs: host.PROGRESS_RENEW_MIN_MS,
  };
}

const checks = {
  'backoff-ceilings': backoffCeilings,
  'hand-back-revoked': handBackRevoked,
  'unknown-values': unknownValues,
  'fault-during-probe': faultDuringProbe,
};
checks[process.argv[2]]().then(
  (outcome) => {
    process.stdout.write(`${JSON.stringify(outcome)}\n`);
    process.exit(0);
  },
  (err) => {
    process.stdout.write(`${JSON.stringify({ error: err.message })}\n`);
    process.exit(1);
  },
);
