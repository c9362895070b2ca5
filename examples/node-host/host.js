#!/usr/bin/env node
// An amc host in Node.js, built from proto/ alone: the example to copy when you write a host in
// your own language.
//
// A host is sensor and hands; the cloud is the brain. This one
//   1. connects to the cloud over mTLS with a host certificate and opens the Lease stream,
//   2. says hello with the phones its adb server knows and waits for an assignment, and tells
//      the cloud whenever a phone is plugged in or out,
//   3. per step: wakes the phone and dismisses a lock screen that needs no credential, reads
//      the screen over the adb protocol (`uiautomator dump --windows`), turns it into a
//      typed amc.v1.ScreenObservation, asks PlannerService.Decide for the next action (sending
//      the outcome of the previous one), and carries the action out with `adb shell input`,
//   4. renews its lease with the latest progress at the interval the assignment gives (by the
//      lease's end when that comes first), soon after each progress report (at most once a
//      second) and as soon as it reconnects,
//   5. reports the result, and keeps it (on disk too), sending it again every 5 s, until the
//      cloud acknowledges it,
//   6. rides out a cloud restart: reconnects with backoff, naming the leases it still holds,
//      and asks again for a step whose answer was lost under the same step key,
//   7. hands its work back when stopped (SIGTERM, SIGINT): see `handBack`.
// It sends no prompt and no goal: the cloud knows the goal and the history and builds them.
//
// Settings (environment):
//   AMC_CLOUD_ADDRESS      host:port of the cloud                  (127.0.0.1:50051)
//   AMC_HOST_CERTS_DIR     folder with ca.pem, host-<id>.pem/.key   (required)
//   AMC_HOST_ID            the id in the host certificate           (required)
//   AMC_HOST_CERT_LOOK_S   the least time between two looks at the certificate files  (5)
//                          before a Decide (a certificate issued again is presented
//                          from the next Decide after a look); 0 = before each one
//   AMC_TLS_SERVER_NAME    name on the cloud's certificate          (localhost)
//   ADB_HOST / ADB_PORT    the adb server                           (127.0.0.1 / 5037)
//   AMC_TASKS              run this many tasks, refuse more, exit;  (0)
//                          0 = run on
//   AMC_HOST_DATA_DIR      where results wait for the cloud         (amc_host_data)
//   AMC_PROTO_DIR          where amc/v1/*.proto live                (../../proto)
//   AMC_HOST_KEEPALIVE_TIME_S / AMC_HOST_KEEPALIVE_TIMEOUT_S
//                          ping the cloud this often / drop a link whose ping goes
//                          unanswered this long (10 / 10, as the Python host's)
//   AMC_HOST_STOP_GRACE_S  stopped, wait this long for the cloud to answer its results (5)
//   AMC_HOST_UNHEALTHY_AFTER_ATTEMPTS
//                          attempts in a row that could not read a phone's screen before (3)
//                          it takes no work (reported OFFLINE, assignments refused)
//   AMC_HOST_UNHEALTHY_PROBE_S
//                          how often such a phone is tried with one dump; the first   (60)
//                          that parses puts it back to work
//   AMC_HOST_DATA_DIR_PROBE_S
//                          how often a data folder that refused a write is tried      (10)
//                          with one; the first that works puts the host back to work
//   AMC_HOST_DISK_WAIT_S   how long a read or write in the data folder may take   (10)
//                          before the folder counts as hanging (a dead NFS mount, a
//                          dying disk) and the host as paused, as a full folder does
//   AMC_HOST_DUMP_TIMEOUT_S / AMC_HOST_HIERARCHY_DEADLINE_S
//                          how long one screen dump may wait for the phone / a look's  (30 / 45)
//                          dumps together, as the Python host's settings of those names
//   AMC_HOST_DEVICE_POLL_INTERVAL_S
//                          how often adb's phone list is read (a phone plugged in  (2)
//                          or out is told to the cloud at the next read)
//   AMC_HOST_RECONNECT_INITIAL_S / AMC_HOST_RECONNECT_MAX_S
//                          the wait before reconnecting a lost stream: up to the     (0.5 / 30)
//                          first, doubling with each failure to at most the second,
//                          jittered (the Python host's settings of those names)
//   AMC_HOST_PLANNER_WAIT_INITIAL_S / AMC_HOST_PLANNER_WAIT_MAX_S
//                          the wait before asking Decide again: the first, doubling  (1 / 30)
//                          with each wait to at most the second, each drawn between
//                          half and all of it (the Python host's WaitPolicy)
//   AMC_HOST_PROGRESS_RENEW_MIN_INTERVAL_S
//                          at most one renewal of a lease per this many seconds   (1)
//                          for progress, a reconnect or a resume (the Python host's)
//   AMC_HOST_PHONE_LOST_GRACE_S
//                          a running attempt's phone gone from adb this long ends  (60)
//                          it "phone lost", retryable; back sooner, nothing changes
//   Every setting in seconds is a number above 0 (AMC_HOST_STOP_GRACE_S,
//   AMC_HOST_PROGRESS_RENEW_MIN_INTERVAL_S and AMC_HOST_PHONE_LOST_GRACE_S may be 0), and
//   AMC_TASKS, ADB_PORT and AMC_HOST_UNHEALTHY_AFTER_ATTEMPTS whole numbers (from 0, 1 to
//   65535, from 1): a bad value stops the host with exit 2, naming it, as a missing setting
//   does.
//
// Exit codes (`EXIT`): the ones `amc host run` exits with for the same cause, listed once for
// both hosts in docs/cli.md ("Exit codes"): 0 stopped (a signal, its AMC_TASKS done, or
// superseded by another process of the same certificate), 2 a setting missing, 4 the cloud
// refused this host (FINAL) or what answered is not an amc cloud, 5 its own certificate would
// be refused in the handshake or its key is not the certificate's, at its start (later, it
// checks them again at each connection attempt); 70 anything else.
'use strict';

const crypto = require('crypto');
const net = require('net');
const path = require('path');
const { spawn } = require('child_process');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { Adb } = require('@devicefarmer/adbkit');
const { default: Connection } = require('@devicefarmer/adbkit/dist/src/adb/connection');
const { HostDevicesWithPathsCommand } = require('@devicefarmer/adbkit/dist/src/adb/command/host');
const { XMLParser } = require('fast-xml-parser');

const env = process.env;
const CLOUD = env.AMC_CLOUD_ADDRESS || '127.0.0.1:50051';
const CERTS = env.AMC_HOST_CERTS_DIR;
const HOST_ID = env.AMC_HOST_ID;
const MAX_STEPS = 30;
const PROTO_DIR = env.AMC_PROTO_DIR || path.resolve(__dirname, '..', '..', 'proto');
// How the process ends, per cause, as `amc host run` ends (console/exit_codes.py): a
// supervisor or script tells the causes apart by the code, whichever host runs.
const EXIT = { OK: 0, USAGE: 2, CLOUD: 4, CERTIFICATE: 5, INTERNAL: 70 };
const log = (...args) => console.error('[node-host]', ...args);
if (require.main === module) {
  // An error nothing expected, also one thrown as the host loads (its contract, a module): 70,
  // as `amc host run` (Node's own 1 is the code a supervisor reads as a failed task).
  process.on('uncaughtException', (err) => {
    log(`internal error: ${err.stack || err}`);
    process.exit(EXIT.INTERNAL);
  });
}
if (!CERTS || !HOST_ID) {
  console.error('set AMC_HOST_CERTS_DIR and AMC_HOST_ID (see the top of this file)');
  process.exit(EXIT.USAGE);
}
// A setting in seconds, as milliseconds: `fallback` when unset. A value that is no number, or
// not above 0 (or below 0, with `zero`), or past Node's longest timer (which Node runs after
// 1 ms instead, with a warning) stops the host with exit 2, naming it, as `amc host run` refuses
// a bad setting: taken as it came, a typo (`2s`) became NaN and a timer that fired at once, a
// phone poll or a reconnect with no pause at all.
const MAX_TIMER_MS = 2 ** 31 - 1;
function seconds(name, fallback, { zero = false } = {}) {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback * 1000;
  const value = Number(raw);
  const millis = value * 1000;
  if (raw.trim() === '' || !Number.isFinite(value) || value < 0 || (value === 0 && !zero) || millis > MAX_TIMER_MS) {
    const range = `a number of seconds ${zero ? 'from 0' : 'above 0'} up to ${Math.floor(MAX_TIMER_MS / 1000)}`;
    console.error(`${name} must be ${range}, not '${raw}' (see the top of host.js)`);
    process.exit(EXIT.USAGE);
  }
  return millis;
}
// A setting that counts (tasks, attempts, a port): a whole number from `min` to `max`, else
// exit 2 as for `seconds`. Taken as `Number()`, a typo ran on as NaN: AMC_TASKS as 0 (run on
// for ever), AMC_HOST_UNHEALTHY_AFTER_ATTEMPTS as "after the first failure".
function whole(name, fallback, min, max = Number.MAX_SAFE_INTEGER) {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!/^\s*\d+\s*$/.test(raw) || value < min || value > max) {
    console.error(`${name} must be a whole number from ${min} to ${max}, not '${raw}' (see the top of host.js)`);
    process.exit(EXIT.USAGE);
  }
  return value;
}
const TASKS = whole('AMC_TASKS', 0, 0);
// How long to wait before reconnecting a lost stream (`backoff`): up to RECONNECT_INITIAL_MS
// after a stream the cloud welcomed, twice that after a connection that failed, doubling with
// each failure in a row to at most RECONNECT_MAX_MS, as the Python
// host's `reconnect_initial_s` and `reconnect_max_s`.
const RECONNECT_INITIAL_MS = seconds('AMC_HOST_RECONNECT_INITIAL_S', 0.5);
const RECONNECT_MAX_MS = seconds('AMC_HOST_RECONNECT_MAX_S', 30);

// --- the contract -------------------------------------------------------------------------
const definition = protoLoader.loadSync(
  ['amc/v1/lease_service.proto', 'amc/v1/planner_service.proto'].map((f) =>
    path.join(PROTO_DIR, f),
  ),
  { includeDirs: [PROTO_DIR], keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true },
);
const amc = grpc.loadPackageDefinition(definition).amc.v1;
// The certificate files, read before each connection without blocking the host: a certs
// folder on a disk that hangs (a dead NFS mount) held every phone, timer and stream with a
// synchronous read, and a signal was never handled. Read in a process of its own, as the data
// folder's calls are (`toDisk`): a read hung in the kernel holds a thread of Node's pool, and
// with it the host's exit; a process is left to its disk. One read at a time: a connection
// attempt while one hangs waits on it (the Python host's `_read_once`), at most
// WRITE_WAIT_MS each time, instead of starting another.
const CERT_FILES = { ca: 'ca.pem', key: `host-${HOST_ID}.key`, cert: `host-${HOST_ID}.pem` };
function certReader() {
  const fs = require('fs');
  const read = {};
  for (const [name, file] of JSON.parse(process.argv[1])) {
    try {
      read[name] = fs.readFileSync(file).toString('base64');
    } catch (err) {
      process.send({ error: { message: err.message, code: err.code, file } });
      return;
    }
  }
  process.send({ read });
}
let certRead = null; // the read under way, if any
let certReading = null; // its process
function readCertificates() {
  if (!certRead) {
    const names = Object.entries(CERT_FILES).map(([name, file]) => [name, path.join(CERTS, file)]);
    certRead = new Promise((resolve, reject) => {
      const child = spawn(process.execPath, ['-e', `(${certReader})()`, JSON.stringify(names)], { stdio: ['ignore', 'ignore', 'ignore', 'ipc'] });
      certReading = child;
      child.on('message', ({ read, error }) => {
        if (read) resolve(Object.fromEntries(Object.entries(read).map(([name, b64]) => [name, Buffer.from(b64, 'base64')])));
        // One that is not there is a setting to fix (exit 2, as `amc host run` says a missing one).
        else if (error.code === 'ENOENT' || error.code === 'EISDIR') {
          reject(Object.assign(new Error(`${error.file} does not exist (AMC_HOST_CERTS_DIR, AMC_HOST_ID)`), { exitCode: EXIT.USAGE, missing: error.file }));
        } else reject(Object.assign(new Error(`${error.file}: ${error.message}`), { code: error.code }));
      });
      child.on('exit', () => reject(new Error('the certificate files could not be read (their reader ended)')));
      child.on('error', reject);
      child.unref();
      child.channel?.unref(); // a read hung in the kernel holds nothing up
    }).finally(() => {
      certRead = null;
      certReading = null;
    });
  }
  let timer;
  const hung = new Promise((_, reject) => {
    timer = setTimeout(() => {
      const why = `reading the host certificate files (${CERTS}) did not return within ${WRITE_WAIT_MS / 1000} s: the disk hangs`;
      reject(Object.assign(new Error(why), { hung: true }));
    }, WRITE_WAIT_MS);
  });
  return Promise.race([certRead, hung]).finally(() => clearTimeout(timer));
}
// grpc-js retries a lost connection on its own schedule, up to 120 s apart by default: kept
// within 0.5-5 s, as the Python host's channel (and within the host's own reconnect settings
// when they are shorter), so a cloud back from a restart is found in time.
// Keepalive, as the Python host's channel has it (host/cloud_channel.py): grpc-js pings never
// by default, so a link gone silent without closing (the cloud's machine vanished, a NAT entry
// dropped) looked open for as long as TCP keeps it, the stream waiting on it for good. A ping
// every 10 s (the cloud allows no more often: AMC_CLOUD_MIN_CLIENT_PING_INTERVAL_SECONDS),
// unanswered for 10 s, drops it; the stream ends UNAVAILABLE and is reconnected.
// grpc-js takes at most 4 MB in a message by default; the cloud sends up to 16 MB
// (AMC_CLOUD_MAX_MESSAGE_BYTES) and the Python host takes as much (host/cloud_channel.py): an
// assignment or decision past 4 MB ended the stream RESOURCE_EXHAUSTED, and was never heard.
const MAX_MESSAGE_BYTES = 16 * 1024 * 1024;
const options = {
  'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
  'grpc.ssl_target_name_override': env.AMC_TLS_SERVER_NAME || 'localhost',
  'grpc.initial_reconnect_backoff_ms': Math.min(500, RECONNECT_INITIAL_MS),
  'grpc.max_reconnect_backoff_ms': Math.min(5000, RECONNECT_MAX_MS),
  'grpc.keepalive_time_ms': seconds('AMC_HOST_KEEPALIVE_TIME_S', 10),
  'grpc.keepalive_timeout_ms': seconds('AMC_HOST_KEEPALIVE_TIMEOUT_S', 10),
  'grpc.keepalive_permit_without_calls': 1,
};
// A certificate the cloud refuses in the TLS handshake (expired, not valid yet, not signed by
// the fleet CA) reaches grpc-js as "No connection established ... Failed to connect" only: the
// host reconnected for ever saying nothing of it. Checked before each connection, as the
// Python host checks its own (cloud/cert_validity.py): why it would be refused, or ''.
function certificateRefused(files) {
  const file = path.join(CERTS, CERT_FILES.cert);
  let cert;
  try {
    cert = new crypto.X509Certificate(files.cert);
  } catch (err) {
    return `host certificate ${file} cannot be read as a certificate (${err.message})`;
  }
  const ca = new crypto.X509Certificate(files.ca);
  if (!cert.checkIssued(ca) || !cert.verify(ca.publicKey)) {
    return `host certificate ${file} is not signed by the fleet CA ${path.join(CERTS, 'ca.pem')} (issued by ${cert.issuer.replace(/\n/g, ', ')})`;
  }
  if (Date.now() >= Date.parse(cert.validTo)) return `host certificate ${file} expired ${cert.validTo}`;
  if (Date.now() < Date.parse(cert.validFrom)) {
    return `host certificate ${file} is not valid before ${cert.validFrom} (this machine's clock says ${new Date().toUTCString()})`;
  }
  return '';
}
// A key that is not the certificate's: grpc-js threw "key values mismatch" as the host loaded,
// a stack trace and exit 1, where the Python host names the files and exits 5. Why the key
// cannot be used with the certificate ('' when it can), and whether it is the key of another
// certificate (`another`: what a read between the renames of `amc certs` finds). As the Python
// host (cloud/cert_validity.py), an encrypted key it cannot open is not checked: one under an
// empty passphrase is opened here with '' and checked; one under a real passphrase is left to
// the handshake.
function keyRefused(files) {
  const where = `the key ${path.join(CERTS, CERT_FILES.key)} of host certificate ${path.join(CERTS, CERT_FILES.cert)}`;
  let key;
  try {
    key = crypto.createPrivateKey({ key: files.key, passphrase: '' });
  } catch (err) {
    if (files.key.includes('ENCRYPTED')) return { why: '', another: false };
    return { why: `${where} is not a PEM private key (${err.message})`, another: false };
  }
  let cert;
  try {
    cert = new crypto.X509Certificate(files.cert);
  } catch {
    return { why: '', another: false }; // `certificateRefused` names it
  }
  if (!cert.checkPrivateKey(key)) return { why: `${where} is not the key of this certificate (it belongs to another one)`, another: true };
  return { why: '', another: false };
}
// `amc certs` renames a new key into place, then its certificate (cloud/pki.py): a read between
// the two finds the new key beside the old certificate, and host.js refused to start (exit 5)
// when one was issued while it started or reconnected. A key of another certificate is read
// once more after this long before it is refused, as `amc host run` does (PAIR_SETTLE_S).
const PAIR_SETTLE_MS = 500;
// The certificate files, read once more after PAIR_SETTLE_MS when the key is another
// certificate's (caught between the renames of a pair issued again).
async function settledCertificates() {
  const files = await readCertificates();
  if (!keyRefused(files).another) return files;
  await sleep(PAIR_SETTLE_MS);
  return readCertificates();
}
// The clients, made from the certificate files read before a connection (`connectable`), and
// made again from them when they changed: a certificate issued again (`amc certs host`,
// before the old one expires, or after it was revoked) while the host runs is presented from
// the next connection on, as the Python host reads its files anew for each
// (host/cloud_channel.py, `read_credentials`). Made once, the host presented the certificate
// it read first until it was restarted, the new files checked but never used: once the old
// one expired or was revoked, every reconnect failed ("Failed to connect") for good.
let leases = null;
let planner = null;
let madeFrom = null; // the files the clients were made from
let plannerFrom = null; // the files the planner client was made from (`freshPlanner`: newer)
// The files each planner client was made from: a Decide refused for its certificate is
// compared with the files of the client it went on (`filesReplaced`), not with the lease
// stream's, which a Decide-only rotation left older (a refused NEW certificate was asked
// again for ever, the files "replaced" against the stream's).
const clientFiles = new WeakMap();
// The files the stream the cloud last welcomed was made from (`session`): whom this process is
// for the cloud. Files naming another host are refused at every read from then on
// (`ownCertificates`), as `amc host run` refuses them (host/cloud_channel.py, `_kept`).
let connectedWith = null;
const sameFiles = (a, b) => ['ca', 'key', 'cert'].every((name) => a[name].equals(b[name]));
// The planner clients the files replaced, with Decide calls under way: each is closed when its
// last call ends (`callDecide`): closed at once, a call under way could end with its channel
// and be asked again while the cloud still planned it.
const decideCalls = new Map(); // planner client -> its Decide calls under way
const replaced = new Set();
function retire(client) {
  if (decideCalls.has(client)) replaced.add(client);
  else client.close();
}
// Whether the certificate files now hold others than `used` (the files the refused call's
// client was made from: by default the lease stream's) (false when they cannot be read): the
// cloud refused the certificate this host connected with, and the next connection would
// present another.
// A certificate naming another host (another host's files copied over these) does not count:
// the host would reconnect, silently, as that host; the refusal stands.
async function filesReplaced(used = madeFrom) {
  // `used` is taken before the read: a reconnect meanwhile makes the clients anew
  let files;
  try {
    files = await readCertificates();
  } catch {
    return false;
  }
  if (used === null || sameFiles(used, files)) return false;
  const before = hostNamed(used.cert);
  const now = hostNamed(files.cert);
  if (now !== before) {
    log(`the host certificate files now hold another host's certificate (${now || '?'}; this host connected as ${before || '?'}): the cloud's refusal stands`);
    return false;
  }
  return true;
}
// The host id a certificate names (its `amc://host/<id>` SAN: whom the cloud reads it as),
// else its subject (RFC 4514's order, as the Python host's `certificate_name` gives it);
// '' when it cannot be parsed. A certificate naming no host id was '' here, which the
// identity checks let through: files holding one (an operator's, copied over these) were
// connected with, where the Python host takes them as another host's.
const HOST_URI = 'URI:amc://host/';
function hostNamed(pem) {
  let cert;
  try {
    cert = new crypto.X509Certificate(pem);
  } catch {
    return '';
  }
  const sans = (cert.subjectAltName || '').split(', ');
  const uri = sans.find((san) => san.startsWith(HOST_URI) && san !== HOST_URI);
  return uri ? uri.slice(HOST_URI.length) : cert.subject.split('\n').reverse().join(',');
}
// The files to connect with: `files`, unless they name another host than the one this process
// connected as (another host's files copied over these). Reconnecting with whatever the files
// held, a host whose files came from the wrong folder became that host, silently, at its next
// reconnect. It keeps the certificate it has while the cloud would take it (saying so), else
// stops (exit 4) naming both hosts and the file, rather than connect as the other.
// The file and serial of each other host's certificate `ownCertificates` has said it keeps its
// own beside: said at every read (each reconnect), the same line filled the log every few
// seconds for as long as the files stayed wrong. Once each, as `amc host run` says it.
const keptSaid = new Set();
function ownCertificates(files) {
  if (connectedWith === null) return files;
  const mine = hostNamed(connectedWith.cert);
  const named = hostNamed(files.cert);
  if (!named || named === mine) return files;
  // The newest of its own files (as `amc host run`'s `before or mine`): the planner client's
  // when a Decide took a certificate issued again while the stream stayed up; the stream's
  // were older then (possibly revoked: the last step of that rotation).
  const own = plannerFrom !== null && hostNamed(plannerFrom.cert) === mine ? plannerFrom : madeFrom;
  const serial = (f) => new crypto.X509Certificate(f.cert).serialNumber;
  const file = path.join(CERTS, CERT_FILES.cert);
  const said = `the host certificate files now hold another host's certificate (${named}, serial ${serial(files)}, in ${file}; this host connected as ${mine})`;
  const unusable = certificateRefused(own);
  if (unusable) {
    const why = `${said}, and its own certificate (serial ${serial(own)}) cannot be used any more: ${unusable}. It stops rather than connect as ${named}: put the certificate and key of ${mine} back (\`amc certs host DIR ${mine}\` issues new ones) and start it again`;
    throw Object.assign(new Error(why), { exitCode: EXIT.CLOUD });
  }
  const seen = `${file}\n${serial(files)}`;
  if (!keptSaid.has(seen)) {
    keptSaid.add(seen);
    log(`${said}: it keeps presenting its own (serial ${serial(own)}); put the certificate and key of ${mine} back`);
  }
  return own;
}
// Why the host cannot connect with its certificate files as they are now, else the clients
// made from them (anew when they changed). At the first read (the host's start) files the
// cloud would refuse are an Error with `exitCode` 5, final, as `amc host run` refuses to start
// with them; once they were read and found fine, such files are an Error with `unusable` (why):
// the host checks again at its next connection attempt, as `amc host run` does, so an
// operator fixes the files without a restart (it stopped with 5, and a supervisor restarting
// it saw the same 5 until they were fixed). Files naming another host than the one it
// connected as are `ownCertificates`' (4 once its own cannot be used).
async function connectable() {
  const files = ownCertificates(
    await settledCertificates().catch((err) => {
      // A file that cannot be read (EACCES, EIO) once the host ran with its files is said and
      // tried again with backoff, as `amc host run` tries again on an OSError; it stopped
      // with 70. At the start it is 70, as `amc host run`'s; one not there is 2 (a setting).
      if (madeFrom !== null && err.code !== undefined && err.exitCode === undefined) err.unreadable = true;
      // One gone once the host ran with its files (deleted and copied in again, a folder a
      // tool replaces) is waited for, as `amc host run` waits for it; it stopped with 2.
      if (madeFrom !== null && err.missing) err.vanished = `${err.missing} is missing`;
      throw err;
    }),
  );
  const how = `install a new one (\`amc certs host DIR ${HOST_ID}\`) and start the host again`;
  const unusable = certificateRefused(files);
  const mismatch = unusable ? '' : keyRefused(files).why;
  if ((unusable || mismatch) && madeFrom !== null) {
    const why = `${unusable || mismatch} (the cloud would refuse it)`;
    throw Object.assign(new Error(why), { unusable: why });
  }
  if (unusable) {
    const why = `not connecting: ${unusable} (the cloud would refuse it); ${how}`;
    throw Object.assign(new Error(why), { exitCode: EXIT.CERTIFICATE });
  }
  if (mismatch) {
    const why = `not connecting: ${mismatch}; install the key issued with the certificate (\`amc certs host DIR ${HOST_ID}\` writes both) and start the host again`;
    throw Object.assign(new Error(why), { exitCode: EXIT.CERTIFICATE });
  }
  if (madeFrom !== null && sameFiles(madeFrom, files)) return;
  const credentials = grpc.credentials.createSsl(files.ca, files.key, files.cert);
  if (madeFrom !== null) {
    // The stream of the old lease client has ended (this is a reconnect): it goes now.
    const serial = (f) => new crypto.X509Certificate(f.cert).serialNumber;
    log(`the host certificate files changed (serial ${serial(madeFrom)} -> ${serial(files)}): connecting with the new ones`);
    leases.close();
    retire(planner);
  }
  leases = new amc.LeaseService(CLOUD, credentials, options);
  planner = new amc.PlannerService(CLOUD, credentials, options);
  clientFiles.set(planner, files);
  madeFrom = files;
  plannerFrom = files;
}
// How long a Decide waits for a new look at the certificate files (`freshPlanner`) before it
// goes on the planner client it has, as `amc host run` waits (LOOK_AGAIN_S).
const LOOK_AGAIN_MS = 2000;
// The least time between two of those looks, as `amc host run`'s LOOK_AGAIN_EVERY_S: each look
// is a process of its own (about 175 ms, 40 MB), and a certs disk slow but answering added up
// to LOOK_AGAIN_MS to every Decide; a rotation is picked up within seconds all the same.
const CERT_LOOK_MS = seconds('AMC_HOST_CERT_LOOK_S', 5, { zero: true });
let lookedAt = null; // when (`now`) `freshPlanner` last looked at the files; null: never
// The planner client made again from the certificate files before each Decide when they hold
// a new certificate of this host, as `amc host run`'s planner channel is
// (host/cloud_channel.py, `ChannelOnce._look_again`): read only at a connection, the files
// issued again while the lease stream stayed up were not presented by a Decide until the
// stream ended (the old certificate revoked). Files that hang (a read already in flight is not
// waited on), cannot be read, would be refused or name another host than the one this process
// connected as leave the client as it is: the next connection attempt says why. One look every
// CERT_LOOK_MS at most.
async function freshPlanner() {
  if (plannerFrom === null || certRead) return;
  if (lookedAt !== null && now() - lookedAt < CERT_LOOK_MS) return;
  lookedAt = now();
  let timer;
  const late = new Promise((resolve) => {
    timer = setTimeout(resolve, LOOK_AGAIN_MS, null);
  });
  const files = await Promise.race([readCertificates(), late])
    .catch(() => null)
    .finally(() => clearTimeout(timer));
  if (files === null || sameFiles(plannerFrom, files)) return;
  let fresh;
  try {
    const mine = hostNamed((connectedWith ?? plannerFrom).cert);
    if (hostNamed(files.cert) !== mine || certificateRefused(files) || keyRefused(files).why) return;
    const serial = (f) => new crypto.X509Certificate(f.cert).serialNumber;
    fresh = new amc.PlannerService(CLOUD, grpc.credentials.createSsl(files.ca, files.key, files.cert), options);
    log(`the host certificate files changed (serial ${serial(plannerFrom)} -> ${serial(files)}): new Decide calls go on a client made from them`);
  } catch {
    return; // files the checks above could not even parse: the next connection says why
  }
  retire(planner);
  planner = fresh;
  clientFiles.set(planner, files);
  plannerFrom = files;
}
// What the host says while its certificate files keep it from connecting, as `amc host run`
// says it (host/not_connecting.py): a line at every attempt (every RECONNECT_MAX_MS while they
// stayed bad) filled the log. Each problem (its file and why) once, then at most every
// REMIND_MS as a reminder ("still not connecting"); the welcome after says it connected (again).
const REMIND_MS = 600_000;
const notConnecting = {
  problem: null, // the last attempt's problem, as compared (null: it got past the files)
  saidAt: 0,
  unresolved: '', // the problem last said, until a welcome
  kind: '', // its kind: 'hung' or 'unreadable' (reading them hung or failed), '' (refused, missing)
  // "not connecting", "still not connecting", or '' (nothing to say) for an attempt `problem` stopped.
  said(problem, kind = '') {
    const key = problem.replace(/ \(this machine's clock says [^)]*\)/, '');
    if (key !== this.problem) {
      Object.assign(this, { problem: key, saidAt: now(), unresolved: problem, kind });
      return 'not connecting';
    }
    if (now() - this.saidAt < REMIND_MS) return '';
    this.saidAt = now();
    return 'still not connecting';
  },
  passed() {
    this.problem = null;
  },
  connected() {
    const said = this.unresolved;
    Object.assign(this, { problem: null, unresolved: '' });
    return said;
  },
  // The welcome's line ('' when no problem was said since the last), as `amc host run` words
  // it (host/not_connecting.py `back`): "again" only after an earlier connection (a disk that
  // hung at the first start was said as a connection regained), worded by the problem's kind.
  back(again) {
    const kind = this.kind;
    const was = this.connected();
    if (!was) return '';
    const head = again ? 'connected to the cloud again' : 'connected to the cloud';
    if (kind === 'hung') return `${head}: the certificate files could be read (reading them hung: ${was})`;
    if (kind === 'unreadable') return `${head}: the certificate files could be read (reading them failed: ${was})`;
    return `${head}: the certificate files can be used (they could not: ${was})`;
  },
};
// This run of the host (HostHello.process_id): the same on every reconnect, so the cloud tells
// a reconnect (leases kept) from a new process (the old one's unlisted leases released).
const PROCESS_ID = crypto.randomUUID();

const ADB = { host: env.ADB_HOST || '127.0.0.1', port: whole('ADB_PORT', 5037, 1, 65535) };
const adb = Adb.createClient(ADB);
// adbkit, refused a connection, runs `adb -P <port> start-server` and tries again: a server the
// operator stopped (to update adb, to hand the phones to another tool) was started again by the
// next step. This host never starts one, as the Python host never does (host/devices/
// adb_transport.py): a refused connection fails, and no server means every phone is OFFLINE
// (`refreshPhones`) and a step that failed on one ends retryable (`phoneGone`).
adb.connection = function connection() {
  const conn = new Connection(this.options);
  conn.triedStarting = true; // adbkit's own "started it once already"
  conn.on('error', (err) => this.emit('error', err));
  return conn.connect();
};

// The contract's limits on what this host sends, as the proto comments give them: UTF-8 bytes
// for what Decide reads (it refuses a step with a longer field), characters (code points) for
// the summaries (the cloud cuts longer ones). tests/node/test_node_host.py checks each against
// the cloud's own limits, so they cannot drift apart.
const LIMITS = {
  text: 4096, // UiElement.text, content_description, hint (bytes)
  name: 256, // UiElement.resource_id, class_name, package_name; foreground_package (bytes)
  activity: 512, // ScreenObservation.foreground_activity (bytes)
  error: 2048, // ActionOutcome.error (bytes)
  driver_output: 4096, // ActionOutcome.driver_output (bytes)
  summary: 200, // Progress.summary (characters)
  result_summary: 2000, // TaskResult.summary (characters)
  elements: 1000, // ScreenObservation.elements (count)
  observation: 1048576, // ScreenObservation, serialized (bytes)
  omitted: 100000, // ScreenObservation.omitted_elements
  tree_missing: 512, // ScreenObservation.ui_tree_missing, ui_tree_repaired (bytes)
};

// A JavaScript string counts UTF-16 units: cut by bytes (or by characters, for a limit in
// characters), whole characters only (half of an emoji is not UTF-8: it would arrive as U+FFFD).
// Every text this host sends goes through here, made sendable too: a NUL becomes U+FFFD, as
// the Python host's `clip` makes it (planner/observation.py). The cloud refuses any text field
// holding a NUL (INVALID_ARGUMENT), and a phone's shell output can hold one: its Decide failed,
// every time it was asked, and the attempt with it.
const characters = () => 1;
function cut(text, max, size = Buffer.byteLength) {
  const s = String(text).replaceAll('\0', '\uFFFD');
  let used = 0;
  let end = 0;
  for (const ch of s) {
    used += size(ch);
    if (used > max) break;
    end += ch.length;
  }
  return s.slice(0, end);
}

// --- the phones: which ones, and how to reach each ----------------------------------------
// Phones are plugged in and out while the host runs: the adb server's list is read every
// POLL_MS, as the Python host reads it (host/devices/registry.py), and whenever what the cloud
// should know changes the whole list goes to it in a DeviceUpdate (the next hello carries it
// when the stream is down). A phone adb no longer lists is kept, OFFLINE, so the cloud learns it
// went (for FORGET_AFTER_MS, unless a lease still names it); one adb lists as unauthorized or
// offline is reported so, and given no task.
//
// Cheap phones ship with one serial (0123456789ABCDEF). adb lists each of them but refuses the
// serial as ambiguous ("more than one device"), so such a phone gets its own id, as the Python
// host gives it: `serial@usb:<port>` where adb names the USB port, else `serial@t<transport
// id>`, kept while its transport lives, and is reached by its transport id
// (`host:transport-id:N`).
const SHARED_MARK = '@';
const POLL_MS = seconds('AMC_HOST_DEVICE_POLL_INTERVAL_S', 2);
const LIST_TIMEOUT_MS = 10000; // a wedged adb server never answers: the poll does not wait on it
const FAILED_LISTS_OFFLINE = 3; // failed lists in a row, of a server that is there, before all are gone
const FORGET_AFTER_MS = 24 * 3600 * 1000;
const MAX_REPORTED = 256; // HostHello.devices, DeviceUpdate.devices
// The cloud refuses a hello (or update) naming a phone id longer than this (characters,
// cloud/lease/validate.py): one such phone kept the whole host from ever being welcomed. It is
// left out of what the cloud is told, said once; the other phones work.
const MAX_SERIAL = 128;
const reportable = (id) => [...id].length <= MAX_SERIAL;
const STATES = { device: 'DEVICE_STATE_ONLINE', unauthorized: 'DEVICE_STATE_UNAUTHORIZED' };
// Linux without udev rules: adb lists the phone `no permissions (…); see […]`, read as the type
// "no" when the line is split at spaces. OFFLINE to the cloud (the contract has no state for it),
// with what fixes it as its reason, as the Python host says it (host/devices/adb_errors.py).
const NO_PERMISSIONS =
  "adb has no permission for this USB device: add a udev rule for the phone's USB vendor id (a line " +
  'like SUBSYSTEM=="usb", ATTR{idVendor}=="18d1", MODE="0660", GROUP="plugdev" in ' +
  "/etc/udev/rules.d/51-android.rules, or the distribution's android-sdk-platform-tools-common " +
  'package; then `sudo udevadm control --reload-rules` and replug the phone) or run adb as a user ' +
  'in the plugdev group (then `adb kill-server`)';
const withoutPermission = (type) => type === 'no' || String(type).startsWith('no permissions');
const tagged = (listed, tag) => {
  const found = Object.values(listed).find((v) => typeof v === 'string' && v.startsWith(`${tag}:`));
  return found ? found.slice(tag.length + 1) : '';
};

const phones = new Map(); // host id -> { id, serial, transportId, state, device, model, goneSince }
let failedLists = 0;
let adbDown = false; // no adb server answered the last poll

// Phones sharing a serial are reached by adb's transport id. `adb kill-server` and a new server
// number the transports afresh, in the order it finds the phones: an id read before may name
// the twin after, and the device list cannot tell (same serials, same ids). The adb server's
// own connection does tell, as the Python host reads it (host/devices/adb_restarts.py): a
// `host:track-devices` connection held open ends when that server ends. `adbRun` counts the
// servers seen so: a transport id read in one run is never used in another (`byTransportId`).
// A watch made again after a time unwatched (it could not be made) counts a new run too: a
// restart in that time went unseen.
let adbRun = 0;
let adbWatch = null; // the open track-devices connection of the current run
let adbWatchMade = false; // a watch was ever made: the first one starts run 0
let adbUnwatched = false; // a watch could not be made since the last one ended
// Why a phone addressed by transport id is OFFLINE after the adb server restarted, in the
// Python host's words (host/devices/registry.py, RENUMBERED_REASON).
const RENUMBERED_REASON =
  'the adb server restarted and numbered its phones afresh: this phone shares its serial ' +
  'with another, and adb named no USB port to tell them apart (it names none on Windows or ' +
  'over Wi-Fi), so the host cannot say which transport is this phone; it is listed again ' +
  "under a new id (give the phones their own serials to keep their ids across adb restarts)";
// A phone on a named USB port keeps its id (`serial@usb:<port>`): the Python host's
// RENUMBERED_USB_REASON.
const RENUMBERED_USB_REASON = 'the adb server restarted: the phone is found again on its USB port at the next device poll';
const RENUMBERED = 'adb server restarted: transport ids renumbered';

let adbRefusalSaid = false; // the server's refusal to be watched was said (once, as the Python host)
const adbWatches = new Set(); // every watch connection open, held or still asked for
let adbClosed = false; // the host is done (`closeAdbWatch`): no watch is made any more
const TRACK = 'host:track-devices';
const WATCH_KEEPALIVE_MS = 15000; // idle time before the kernel probes the watch (`watchAdb`)

// A `host:track-devices` connection to the adb server once it answered OKAY, or why not: it
// refused (FAIL), did not answer within LIST_TIMEOUT_MS, or could not be reached. A connection
// that did not become a watch is closed at once, as the Python host closes it
// (host/devices/adb_restarts.py, `ServerWatch._track`): adbkit's trackDevices, given up on, left
// a request a wedged server never answered open for good (one more at each poll), and it kept
// a host that was done from exiting.
function trackAdb() {
  return new Promise((resolve) => {
    const socket = net.connect(ADB);
    adbWatches.add(socket);
    let reply = Buffer.alloc(0);
    let settled = false;
    const settle = (status, why) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.removeListener('data', onData);
      if (status !== 'OKAY') {
        adbWatches.delete(socket);
        socket.destroy();
      }
      resolve({ socket: status === 'OKAY' ? socket : null, refused: status === 'FAIL', why });
    };
    const onData = (chunk) => {
      reply = Buffer.concat([reply, chunk]);
      if (reply.length >= 4) settle(reply.subarray(0, 4).toString('latin1'), 'it answered no OKAY');
    };
    const timer = setTimeout(() => settle('', 'the adb server, asked to be watched, did not answer'), LIST_TIMEOUT_MS);
    socket.on('data', onData);
    socket.once('connect', () => socket.write(`${TRACK.length.toString(16).padStart(4, '0')}${TRACK}`));
    socket.once('error', (err) => settle('', err.message));
    socket.once('close', () => settle('', 'the adb server closed the connection'));
  });
}

// Holds a watch on the adb server (see `adbRun`); a new run once the watch ended. Returns
// whether the server is watched now: while it is not, a restart would go unseen, so no phone is
// listed (`refreshPhones`), as the Python host lists none (host/devices/registry.py, `refresh`).
async function watchAdb() {
  if (adbWatch) return true;
  if (adbClosed) return false;
  const { socket, refused, why } = await trackAdb();
  if (socket === null) {
    if (refused && !adbRefusalSaid) {
      // In the Python host's words (host/devices/adb_restarts.py, `ServerWatch._track`).
      adbRefusalSaid = true;
      log(
        `the adb server at ${ADB.host}:${ADB.port} refused ${TRACK}: the host cannot see it restart, ` +
          'so it lists no phones while unwatched (phones sharing a serial would be told apart by transport ids ' +
          'a new server may have handed to their twin)',
      );
    } else if (!refused && adbWatchMade && !adbUnwatched) log(`cannot watch the adb server for restarts: ${why}`);
    if (adbWatchMade) adbUnwatched = true;
    return false;
  }
  if (adbUnwatched) adbRun += 1;
  adbUnwatched = false;
  adbWatchMade = true;
  adbWatch = socket;
  // The watch sits idle while no phone changes: a remote server's connection (ADB_HOST, an SSH
  // tunnel) whose NAT or firewall entry was silently dropped looked alive for good, the
  // server's restart then reached no one, and ids of the run before were trusted. The kernel
  // probes it after WATCH_KEEPALIVE_MS idle, as the Python host's (host/devices/adb_restarts.py,
  // `_keep_alive`: 15 s idle, 3 probes 5 s apart), and a dead one errors, which ends this run.
  // Node sets the idle time only: the probes' interval and count stay the system's (on Linux
  // 9 probes 75 s apart), so a dropped watch is known in about 11 minutes, not 30 s.
  socket.setKeepAlive(true, WATCH_KEEPALIVE_MS);
  let ended = false;
  const end = () => {
    if (ended) return;
    ended = true;
    adbRun += 1;
    adbWatches.delete(socket);
    if (adbWatch === socket) adbWatch = null;
    socket.destroy();
  };
  socket.on('data', () => {}); // the device lists it sends: only the connection's end matters
  socket.on('error', end);
  socket.once('close', end); // at once, before any later answer
  return true;
}

// The host is done: its watch and any watch still asked for are closed (they would keep the
// process up), as the Python host's registry closes its watch when the host stops.
function closeAdbWatch() {
  adbClosed = true;
  for (const socket of adbWatches) socket.destroy();
}

// What the cloud is told: online phones first, then those in another state, then the gone ones,
// cut at the contract's limit, so a long list loses gone phones, never one a task could run on.
// A phone kept out of work is OFFLINE to the cloud (it offers only ONLINE ones), with why in
// `reason`, as the Python host reports it (host/devices/registry.py, `to_proto`): one that
// cannot be read (`unhealthy`), and every phone while the data folder cannot be written
// (`dataFolder`).
function reported() {
  const why = (p) => unhealthy.get(p.id)?.words || dataFolder.why || p.adbReason;
  const state = (p) => (why(p) ? 'DEVICE_STATE_OFFLINE' : p.state);
  const rank = (p) => (state(p) === 'DEVICE_STATE_ONLINE' ? 0 : state(p) === 'DEVICE_STATE_OFFLINE' ? 2 : 1);
  return [...phones.values()]
    .filter((p) => reportable(p.id))
    .sort((a, b) => rank(a) - rank(b) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0))
    .slice(0, MAX_REPORTED)
    .map((p) => ({ serial: p.id, model: p.model, state: state(p), reason: why(p) }));
}
const listed = (devices) => JSON.stringify(devices);

// `promise`, or an error saying `what` did not answer within `millis`.
function within(promise, millis, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not answer`)), millis);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// The phone's model as it names itself (`ro.product.model`: "Pixel 8"), read once it is online,
// as the Python host reads it (host/devices/registry.py, `_model`); its serial when it cannot
// say, and it is asked again at the next poll.
async function modelOf(device, serial) {
  try {
    return (await within(shell(device, 'getprop ro.product.model'), 5000, 'getprop')).trim() || serial;
  } catch {
    return serial;
  }
}

// Whether the phone has finished booting (`sys.boot_completed` is 1), as the Python host asks
// (host/devices/registry.py, `_booted`): adb lists a phone as a device as soon as its adbd runs,
// well before its system services are up, and every attempt on it would fail. True when it
// cannot be asked, so a failed question never keeps a phone out.
async function booted(device) {
  try {
    return !['', '0'].includes((await within(shell(device, 'getprop sys.boot_completed'), 5000, 'getprop')).trim());
  } catch {
    return true;
  }
}

// adb's device list (`host:devices-l`), or an error once the server has not answered within
// LIST_TIMEOUT_MS; the connection of a list given up on is closed. adbkit's listDevicesWithPaths,
// given up on, left it open until a server whose USB thread a bad cable held answered, if ever,
// and it kept a host that was done from exiting.
async function listDevices() {
  const conn = await adb.connection();
  try {
    return await within(new HostDevicesWithPathsCommand(conn).execute(), LIST_TIMEOUT_MS, 'the adb server, asked for its device list,');
  } finally {
    conn.socket.destroy(); // the server closes an answered list's connection anyway
  }
}

// Whether an adb server listens at ADB (`server_reachable` of host/devices/adb_errors.py).
function adbReachable() {
  return new Promise((resolve) => {
    const socket = net.connect(ADB);
    socket.setTimeout(1000);
    const done = (up) => {
      socket.destroy();
      resolve(up);
    };
    socket.once('connect', () => done(true));
    socket.once('error', () => done(false));
    socket.once('timeout', () => done(false));
  });
}

// Why every phone is OFFLINE while the adb server does not answer (`serverDown`), in the Python
// host's words (host/devices/registry.py, `no_adb_server_reason`): the server, not a phone, is
// what the operator must see to.
const noAdbServerReason = () =>
  `the adb server at ${ADB.host}:${ADB.port} does not answer (start it with ${startServerHint()}, ` +
  'or mend the link to it): its phones are out of sight, not known gone';
// The command that starts the adb server at ADB, as the Python host words it
// (host/devices/adb_errors.py, `start_server_hint`): plain `adb start-server` starts one on 5037
// only, and on the machine it runs on.
function startServerHint() {
  const command = ADB.port === 5037 ? '`adb start-server`' : `\`adb -P ${ADB.port} start-server\``;
  return ['127.0.0.1', 'localhost', '::1'].includes(ADB.host) ? command : `${command} on ${ADB.host}`;
}

// Tells the operator once that the adb server stopped answering (every phone goes OFFLINE with
// it: the fault is the server's, not N phones'), and once that it is back, as the Python host
// says it (host/devices/registry.py, `_said_down`).
function saidDown(down) {
  if (!down) {
    log(`the adb server at ${ADB.host}:${ADB.port} answers again`);
    return;
  }
  const online = [...phones.values()].filter((p) => p.state === 'DEVICE_STATE_ONLINE').length;
  log(
    `the adb server at ${ADB.host}:${ADB.port} does not answer: its ${online} online phone(s) are reported ` +
      'OFFLINE, and attempts on them end (retryable, for another host) unless it answers within the ' +
      `phone-lost grace; start it with ${startServerHint()}, or mend the link to it`,
  );
}

// Reads adb's list once; returns whether what the cloud should know changed. No adb server at
// all (stopped, crashed) takes every phone OFFLINE at once, as the Python host does
// (host/devices/registry.py, `refresh`): none of them can be driven, and a step failing on one
// is the phone's condition, retryable. Only a list that fails on a server that is there (one
// restarting, a timeout) keeps the last states until FAILED_LISTS_OFFLINE have failed in a row.
async function refreshPhones() {
  const before = listed(reported());
  let listing = [];
  let answered = false; // adb gave its list: only then is a phone missing from it gone
  const reachable = await adbReachable();
  // Unwatched, which server's ids a list holds is not known: the next poll tries again.
  if (reachable && !(await watchAdb())) return false;
  const run = adbRun;
  if (reachable) {
    try {
      listing = await listDevices();
      // The server restarted while it listed: its transport ids are of neither run. The next
      // poll lists them again.
      if (adbRun !== run) return false;
      answered = true;
      failedLists = 0;
    } catch (err) {
      failedLists += 1;
      log(`adb device list failed (${failedLists} in a row): ${err.message}`);
      if (failedLists < FAILED_LISTS_OFFLINE) return false; // one glitch does not flap every phone
    }
  }
  // No list: no server listens, or one that accepts connections gave none for
  // FAILED_LISTS_OFFLINE polls (wedged, or the near end of a tunnel whose far server is down):
  // either way the server does not answer, as the Python host takes it (`refresh`).
  const down = !answered;
  if (down !== adbDown) saidDown(down);
  adbDown = down;
  const counts = new Map();
  for (const d of listing) counts.set(d.id, (counts.get(d.id) || 0) + 1);
  // A phone's transport id names it only in the adb server run it was read in.
  const current = [...phones.values()].filter((p) => p.adbRun === run);
  const byTransport = new Map(current.map((p) => [`${p.serial} ${p.transportId}`, p.id]));
  const seen = new Set();
  for (const d of listing) {
    const transportId = tagged(d, 'transport_id');
    const shared = counts.get(d.id) > 1 && transportId !== '';
    let id = byTransport.get(`${d.id} ${transportId}`);
    if (id === undefined) {
      const usb = tagged(d, 'usb');
      // A USB port names the phone across adb runs; a transport id only in its run, so the
      // ids of a later run say which (`r<run>`) and never match one of the run before.
      const numbered = `${run ? `r${run}` : ''}t${transportId}`;
      id = shared ? `${d.id}${SHARED_MARK}${usb ? `usb:${usb}` : numbered}` : d.id;
      if (shared) log(`adb lists several phones with the serial ${d.id}: this one (transport id ${transportId}) is ${id}`);
    }
    seen.add(id);
    const old = phones.get(id);
    if (!old && !reportable(id)) {
      log(`phone ${id} left out: the cloud takes phone ids of at most ${MAX_SERIAL} characters, this one has ${[...id].length}`);
    }
    const byId = shared || id !== d.id;
    const device =
      old && old.transportId === transportId && old.byId === byId && old.adbRun === run
        ? old.device
        : byId
          ? byTransportId(d.id, transportId, run)
          : adb.getDevice(d.id);
    let state = STATES[d.type] || 'DEVICE_STATE_OFFLINE';
    if (state === 'DEVICE_STATE_ONLINE' && old?.state !== state && !(await booted(device))) {
      state = 'DEVICE_STATE_OFFLINE'; // the contract's "rebooting"; asked again at each poll
    }
    let model = old?.model || d.id;
    if (state === 'DEVICE_STATE_ONLINE' && model === d.id) model = await modelOf(device, d.id);
    const adbReason = withoutPermission(d.type) ? NO_PERMISSIONS : '';
    phones.set(id, { id, serial: d.id, transportId, byId, state, device, model, adbReason, goneSince: null, adbRun: run });
  }
  const now = Date.now();
  const inUse = new Set([...held.values()].map((h) => h.device_serial));
  for (const [id, p] of phones) {
    if (seen.has(id)) continue;
    const goneSince = answered ? (p.goneSince ?? now) : p.goneSince;
    if (answered && now - goneSince >= FORGET_AFTER_MS && !inUse.has(id)) {
      // Forgotten: back after this, maybe mended, it starts with a clean slate. Not at one poll
      // that missed it (a brief USB drop), which cleared a mark the phone had earned, as the
      // Python host keeps it (host/devices/registry.py drops it with the phone).
      phones.delete(id);
      forgetHealth(id);
    } else {
      // Listed by the run before under a transport id, and that run ended: the phone is
      // listed again under a new id (one on a USB port is found under its own).
      const renumbered = answered && p.byId && p.goneSince === null && p.adbRun !== run && !p.id.includes('@usb:');
      // Out of sight while no adb server answers; said gone once one answers without it.
      const serverDown = adbDown ? p.serverDown || p.state !== 'DEVICE_STATE_OFFLINE' : false;
      let adbReason = renumbered ? RENUMBERED_REASON : p.adbReason;
      if (serverDown && !p.serverDown) adbReason = noAdbServerReason();
      else if (!serverDown && p.serverDown && !renumbered) adbReason = '';
      phones.set(id, { ...p, state: 'DEVICE_STATE_OFFLINE', goneSince, adbReason, serverDown });
    }
  }
  return listed(reported()) !== before;
}

// adbkit's device client switches each connection with `host:transport:<serial>`; this one
// switches with the transport id, and is otherwise adbkit's own. The id was read in the adb
// server run `run`: once that run ended it may name the phone's twin, so nothing is sent and
// the step fails retryable, the phone gone (the Python host's `Renumbered`).
function byTransportId(serial, transportId, run) {
  const device = adb.getDevice(serial);
  device.transport = async () => {
    if (run !== adbRun) throw Object.assign(new Error(RENUMBERED), { retryable: true });
    const conn = await device.connection();
    const request = `host:transport-id:${transportId}`;
    conn.write(Buffer.from(request.length.toString(16).padStart(4, '0') + request));
    if ((await conn.parser.readAscii(4)) !== 'OKAY') await conn.parser.readError(); // throws, closes
    return conn;
  };
  return device;
}

// --- the phone: perceive over adb ---------------------------------------------------------
// How long one adb shell call (a dump too) may wait for the phone, as the Python host waits
// (host/devices/adb_transport.py, DEFAULT_TIMEOUT_S; host/settings.py, `dump_timeout_s`): a
// dump or an adbd that never answers held the step for good, its lease renewed all along.
// The error names the program only: typed text may be a secret.
// adbd closes a request unstarted while it restarts or is out of processes: the adb server
// answers FAIL "closed" and still lists the phone. That is the phone's condition, retryable (a
// look tries its dump again), as the Python host reads it (host/devices/adb_driver.py, `_adb`);
// a phone adb no longer lists is told disconnected when the step fails (`phoneGone`).
// `signal` abandons the call (its attempt stopped): the connection is hung up and the abort's
// reason thrown. `onData` sees each chunk of output as it comes (`dumpOnce` reads a pid);
// `hangUp` ends the connection of a call that failed or was abandoned, once adb opened it (by
// default at once; `dumpOnce` first waits for the pid still on its way); `program` names the
// call in errors (the command's first word by default).
const CLOSED = "Failure: 'closed'";
const SHELL_MS = 30000;
const readAll = (stream, onData) =>
  new Promise((resolve, reject) => {
    const chunks = [];
    stream.on('data', (chunk) => {
      chunks.push(chunk);
      onData?.(chunk);
    });
    stream.on('end', () => resolve(Buffer.concat(chunks)));
    stream.on('error', reject);
  });
const hangUpNow = (stream) => stream.destroy();
async function shell(device, command, { signal, timeout = SHELL_MS, onData, hangUp = hangUpNow, program } = {}) {
  const what = `adb shell ${program || command.split(' ', 1)[0]}`;
  const opening = device.shell(command);
  let onAbort;
  const abandoned = new Promise((_, reject) => {
    onAbort = () => reject(signal.reason);
    if (signal?.aborted) onAbort();
    else signal?.addEventListener('abort', onAbort, { once: true });
  });
  abandoned.catch(() => {});
  const wait = (promise) => within(Promise.race([promise, abandoned]), timeout, what);
  try {
    return (await wait(opening.then((stream) => readAll(stream, onData)))).toString('utf8');
  } catch (err) {
    opening.then(hangUp, () => {}); // abandoned: hung up
    if (signal?.aborted) throw err;
    if (err.message === CLOSED) {
      const why = 'its adbd closes requests while it restarts or is out of processes';
      throw Object.assign(phoneError(`${what} failed: adb closed the request (${why})`, true), { closed: true });
    }
    if (!err.message.endsWith('did not answer')) throw err;
    // The phone's condition.
    throw Object.assign(phoneError(`${err.message} within ${timeout / 1000} s`, true), { timedOut: true });
  } finally {
    signal?.removeEventListener('abort', onAbort);
  }
}

const xml = new XMLParser({
  ignoreAttributes: false,
  attributeNamePrefix: '',
  isArray: (n) => ['node', 'window', 'display'].includes(n),
});
const BOUNDS = /\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]/;

// Some ROMs' and apps' dumpers write `&`, `<` and `"` in texts unescaped ("Network & internet",
// `Tap "Allow"`). The parser took a raw `"` for the value's end and dropped the rest of the
// text; it is escaped, as the Python host repairs a dump (host/perception/dump_text.py,
// `repair_dump`): only inside double-quoted values, a `"` ending one only where another
// attribute or the tag's end follows it. Returns the dump and what was repaired ('' if nothing:
// a well-formed dump, told by its quotes' count, is left as it came).
const VALUE_END = String.raw`\s+[\w:.-]+=["']|\s*[/?]?>`;
const VALUE = new RegExp(String.raw`="([^"]*(?:"(?!${VALUE_END})[^"]*)*)"(?=${VALUE_END})`, 'g');
const MARKUP_IN_VALUE = /="[^"<&]*[<&]/;
const BARE_AMP = /&(?!(?:amp|lt|gt|quot|apos|#[0-9]+|#x[0-9A-Fa-f]+);)/g;
const occurrences = (text, what) => text.split(what).length - 1;
function repairDump(text) {
  if (!MARKUP_IN_VALUE.test(text) && occurrences(text, '"') === 2 * occurrences(text, '="')) return [text, ''];
  const found = { '&': 0, '<': 0, '"': 0 };
  const repaired = text.replace(VALUE, (whole, raw) => {
    if (!/[&<"]/.test(raw)) return whole;
    const value = raw.replace(BARE_AMP, '&amp;');
    found['&'] += occurrences(value, '&amp;') - occurrences(raw, '&amp;');
    found['<'] += occurrences(value, '<');
    found['"'] += occurrences(value, '"');
    return `="${value.replaceAll('<', '&lt;').replaceAll('"', '&quot;')}"`;
  });
  const count = found['&'] + found['<'] + found['"'];
  if (!count) return [text, ''];
  const named = found['"'] ? `'&', '<' or '"'` : `'&' or '<'`;
  const chars = count === 1 ? 'character' : 'characters';
  return [repaired, `the dump was not well-formed XML: ${count} unescaped ${named} ${chars} in its texts, escaped to read it`];
}

// Nodes worth showing the model: text, a description, or something a finger can do.
function* walk(nodes) {
  for (const node of nodes || []) {
    yield node;
    yield* walk(node.node);
  }
}

// What a finger can do something with: worth showing whatever it says, and kept first when a
// busy screen has more than the contract takes. A text field counts even when it is neither
// clickable nor labelled (an empty search or address box): the model has to find it to type.
// The same rules as the Python host's (host/perception/hierarchy.py, `_is_kept`).
const EDITABLE = /EditText|AutoCompleteTextView/;
const actionable = (node) =>
  ['clickable', 'long-clickable', 'checkable', 'scrollable'].some((name) => node[name] === 'true') ||
  EDITABLE.test(node.class || '');

// A dump's `bounds="[l,t][r,b]"` as numbers; null when it has none.
function rect(raw) {
  const [, ...edges] = (raw || '').match(BOUNDS) || [];
  if (edges.length !== 4) return null;
  const [left, top, right, bottom] = edges.map(Number);
  return { left, top, right, bottom };
}

// Bounds cut to the screen, as the Python host's `_clip`: real dumps list views laid out off
// screen (a pager's next page, a list's rows scrolled away), and a tap at such a centre lands
// nowhere or on the screen's edge. Null when nothing of them is left.
function clip(r, width, height) {
  const to = (v, max) => Math.max(0, Math.min(v, max));
  const b = { left: to(r.left, width), top: to(r.top, height), right: to(r.right, width), bottom: to(r.bottom, height) };
  return b.right > b.left && b.bottom > b.top ? b : null;
}
const clipped = (raw, width, height) => rect(raw) && clip(rect(raw), width, height);

// What of `b` is left in view beside a window over it (the keyboard, a system bar): the largest
// of its parts above, below, left and right of the cover, where a tap lands on it; null when the
// cover hides all of it. The Python host's `_covered`.
function covered(b, cover) {
  if (b.right <= cover.left || b.left >= cover.right || b.bottom <= cover.top || b.top >= cover.bottom) return b;
  const parts = [
    { ...b, bottom: Math.min(b.bottom, cover.top) },
    { ...b, top: Math.max(b.top, cover.bottom) },
    { ...b, right: Math.min(b.right, cover.left) },
    { ...b, left: Math.max(b.left, cover.right) },
  ];
  const area = (p) => Math.max(0, p.right - p.left) * Math.max(0, p.bottom - p.top);
  const best = parts.reduce((a, p) => (area(p) > area(a) ? p : a));
  return area(best) > 0 ? best : null;
}

function elementOf(node, width, height, covers) {
  let bounds = clipped(node.bounds, width, height);
  for (const cover of covers) bounds = bounds && covered(bounds, cover);
  if (bounds === null) return null;
  // Some dumps list views laid out but hidden (behind another, scrolled away): a tap on one
  // lands on whatever the user sees there.
  if (node['visible-to-user'] === 'false') return null;
  const flag = (name) => node[name] === 'true';
  let text = (node.text || '').trim();
  const description = (node['content-desc'] || '').trim();
  if (!text && !description && !actionable(node)) return null;
  const hint = (node.hint || '').trim();
  // An empty field reports its hint as its text (Android 8+): sent as typed, the model would
  // take "Name" for a name already filled in.
  if (hint && text === hint && EDITABLE.test(node.class || '')) text = '';
  return {
    text: cut(text, LIMITS.text),
    hint: cut(hint, LIMITS.text),
    content_description: cut(description, LIMITS.text),
    resource_id: cut(node['resource-id'] || '', LIMITS.name),
    class_name: cut(node.class || '', LIMITS.name),
    package_name: cut(node.package || '', LIMITS.name),
    bounds,
    clickable: flag('clickable'),
    long_clickable: flag('long-clickable'),
    checkable: flag('checkable'),
    checked: flag('checked'),
    enabled: node.enabled !== 'false',
    focused: flag('focused'),
    focusable: flag('focusable'),
    scrollable: flag('scrollable'),
    selected: flag('selected'),
    password: flag('password'),
    source: 'ELEMENT_SOURCE_HIERARCHY',
  };
}

// Decide refuses an observation past LIMITS.elements elements or LIMITS.observation bytes
// serialized, so a busy screen (a long chat, a feed) is cut as the Python host cuts its scene
// (host/perception/hierarchy.py, `_budget`): what a finger can use first, then the texts in the
// dump's order, while they fit; those kept go in the dump's order, numbered e1, e2, … as sent,
// and the rest are counted in omitted_elements. Sizes are measured with the encoder grpc-js sends
// with; each element's with the longest id it could get and some framing to spare, so the sum
// never falls short of the whole.
const encodeDecide = definition['amc.v1.PlannerService'].Decide.requestSerialize;
const encodedSize = (observation) => encodeDecide({ observation }).length;

function bounded(found, rest) {
  let room = LIMITS.observation - encodedSize(rest);
  const longestId = `e${found.length}`;
  const order = found.map((_, i) => i).sort((a, b) => found[b].actionable - found[a].actionable || a - b);
  const kept = new Set();
  for (const i of order) {
    const size = encodedSize({ elements: [{ element_id: longestId, ...found[i].element }] });
    if (kept.size >= LIMITS.elements || (size > room && kept.size > 0)) continue;
    kept.add(i);
    room -= size;
  }
  const elements = found
    .filter((_, i) => kept.has(i))
    .map(({ element }, i) => ({ element_id: `e${i + 1}`, ...element }));
  return { ...rest, elements, omitted_elements: Math.min(found.length - kept.size, LIMITS.omitted) };
}

// The screen as the dump's bounds are: `wm size` gives the natural size in every rotation (a
// resolution setting's "Override size" wins over the "Physical size"), so in landscape (rotation
// 1 or 3, from the dump's root) width and height swap, as the Python host's `current_size` does.
function screenSize(wmSize, rotation) {
  const sizes = {};
  for (const [, kind, w, h] of wmSize.matchAll(/(Override|Physical) size:\s*(\d+)x(\d+)/g)) {
    sizes[kind] = [Number(w), Number(h)];
  }
  const [w, h] = sizes.Override || sizes.Physical;
  return rotation % 2 ? [h, w] : [w, h];
}

// The screen as `uiautomator dump --windows` gives it (releases before the option ignore it and
// dump the active window alone, as a plain dump does): every window of display 0 with its type
// and layer, topmost first. Null when it lists none, or the focused window came without its tree
// (its root was changing): the look is taken again.
function windowsOf(parsed) {
  if (parsed.hierarchy) return [{ hierarchy: parsed.hierarchy, bounds: parsed.hierarchy.node?.[0]?.bounds, focused: 'true' }];
  const display = (parsed.displays?.display || []).find((d) => String(d.id ?? '0') === '0');
  const windows = display?.window || [];
  const rootless = windows.some((w) => (w.focused === 'true' || w.active === 'true') && !w.hierarchy);
  return windows.length && !rootless ? windows : null;
}

// What covers the app (ScreenObservation.overlays), named as the Python host names it
// (host/perception/windows.py, `classify`) from each window's type, package, resource ids,
// texts and place: a permission prompt by its buttons, "isn't responding" by its Wait button or
// words, a crash dialog by its `aerr_` ids, the lock screen and the shade by System UI's ids,
// another dialog of the `android` package. Those take every touch, so the model is told what
// to deal with first; a keyboard is named too. Topmost first, from the topmost of them up (what
// lies under it is out of reach), as host/perception/hierarchy.py `parse_scene` lists them.
const OVERLAYS = {
  keyboard: 'OVERLAY_KEYBOARD',
  permission_prompt: 'OVERLAY_PERMISSION_PROMPT',
  app_not_responding: 'OVERLAY_APP_NOT_RESPONDING',
  app_crash: 'OVERLAY_APP_CRASH',
  system_dialog: 'OVERLAY_SYSTEM_DIALOG',
  notification_shade: 'OVERLAY_NOTIFICATION_SHADE',
  lock_screen: 'OVERLAY_LOCK_SCREEN',
};
const MAX_OVERLAYS = 8;
const SYSTEM_UI = 'com.android.systemui';
const PROMPT_PACKAGES = ['com.lbe.security.miui']; // makers' prompts known by their package alone
const ANR_TEXTS = ["isn't responding", 'isn’t responding', 'is not responding', 'antwortet nicht'];
const SHADE_IDS = ['notification_panel', 'quick_settings', 'qs_frame', 'notification_stack_scroller'];
const LOCK_IDS = ['keyguard', 'lock_icon', 'bouncer', 'lockscreen'];
// Stacking among windows on one layer: higher is nearer the user (the Python host's `_RANK`).
const RANK = {
  app: 0,
  system_ui: 1,
  bar: 2,
  keyboard: 3,
  notification_shade: 4,
  permission_prompt: 5,
  system_dialog: 6,
  app_crash: 6,
  app_not_responding: 7,
  lock_screen: 8,
};

const packageOf = (w) => w.hierarchy?.node?.[0]?.package || '';
const boundsOf = (w) => rect(w.bounds) || rect(w.hierarchy?.node?.[0]?.bounds) || { left: 0, top: 0, right: 0, bottom: 0 };

function kindOf(w, width, height) {
  if (w.type === 'TYPE_INPUT_METHOD') return 'keyboard';
  const nodes = [...walk(w.hierarchy?.node)];
  const ids = nodes.map((n) => (n['resource-id'] || '').split('/').pop().toLowerCase()).filter(Boolean);
  const texts = nodes.map((n) => String(n.text ?? '').toLowerCase());
  const pkg = packageOf(w);
  const b = boundsOf(w);
  const tall = b.bottom - b.top;
  if (ids.some((id) => id.startsWith('permission_allow') || id.startsWith('permission_deny'))) return 'permission_prompt';
  if (PROMPT_PACKAGES.includes(pkg)) return 'permission_prompt';
  if (ids.includes('aerr_wait') || texts.some((t) => ANR_TEXTS.some((a) => t.includes(a)))) return 'app_not_responding';
  if (ids.some((id) => id.startsWith('aerr_'))) return 'app_crash';
  if (pkg === SYSTEM_UI) {
    if (ids.some((id) => LOCK_IDS.some((h) => id.includes(h)))) return 'lock_screen';
    if (tall > height * 0.4 && ids.some((id) => SHADE_IDS.some((h) => id.includes(h)))) return 'notification_shade';
    return (b.top <= 0 || b.bottom >= height) && tall < height * 0.15 ? 'bar' : 'system_ui';
  }
  if (w.type === 'TYPE_SYSTEM' && tall < height * 0.15 && b.right - b.left >= width * 0.9) return 'bar';
  return pkg === 'android' ? 'system_dialog' : 'app';
}

// Each window with its kind and place, nearest the user last: by the dump's layer, then by the
// kind's usual place (`stacking` in host/perception/windows.py).
function stackOf(windows, width, height) {
  return windows
    .map((w) => ({
      w,
      kind: kindOf(w, width, height),
      pkg: packageOf(w),
      type: w.type,
      b: boundsOf(w),
      layer: Number(w.layer || 0),
      focused: w.focused === 'true' || w.active === 'true',
    }))
    .sort((a, b) => a.layer - b.layer || RANK[a.kind] - RANK[b.kind]);
}
const modal = (kind) => kind in OVERLAYS && kind !== 'keyboard';

// What a finger can reach, as the Python host picks it (`parse_scene`, `_past_app_dialog`): the
// windows from the topmost that takes every touch up (all of them when none is up), less the
// app windows under the focused one that it lies within: a dialog of the app takes every touch,
// and so does another app's activity over it (Android 13+'s share sheet, an "Open with"
// chooser); side-by-side panes and split-screen apps are both in reach. A popup that does not
// take the focus (a menu, an autocomplete list) is in reach with the window under it.
function reachable(stack) {
  const reach = stack.slice(Math.max(stack.findLastIndex((s) => modal(s.kind)), 0));
  const top = reach.findLast((s) => s.focused && s.kind === 'app');
  if (!top || top.b.right <= top.b.left || top.b.bottom <= top.b.top) return reach;
  const t = top.b;
  const under = (s) =>
    s.kind === 'app' &&
    (s.pkg === top.pkg || top.type === 'TYPE_APPLICATION') &&
    s.b.left <= t.left && s.b.top <= t.top && s.b.right >= t.right && s.b.bottom >= t.bottom;
  return reach.filter((s, i) => i >= reach.indexOf(top) || !under(s));
}

// What covers the app, topmost first (ScreenObservation.overlays), and the package of the topmost
// window that takes every touch ('' when none): the app in front as the model should read it (a
// prompt's, the shade's), as the Python host names it (`parse_scene`: the modal window's).
function overlaysOf(stack) {
  const named = reachable(stack).reverse().filter((s) => s.kind in OVERLAYS);
  const cover = named.find((s) => modal(s.kind));
  return { overlays: [...new Set(named.map((s) => OVERLAYS[s.kind]))].slice(0, MAX_OVERLAYS), cover: cover?.pkg || '' };
}

// The elements of the windows in reach, in the dump's order, as the Python host shows them
// (`parse_scene`): a docked keyboard hides what lies below its top (a form's Save button), and a
// tap there lands on a key, so what a keyboard (down to the screen's bottom; a floating one,
// ending more than DOCKED_GAP of the height above it, only itself) and the system bars cover of
// a window under them is cut to what is left in view, or left out; the keyboard is shown as one
// element, and the system bars not at all.
const KEYBOARD_LABEL = 'On-screen keyboard';
const DOCKED_GAP = 0.15; // room for a navigation bar under a docked keyboard
const keyboardCover = (b, height) => ({ ...b, bottom: b.bottom >= height * (1 - DOCKED_GAP) ? height : b.bottom });
function elementsOf(windows, stack, width, height) {
  const reach = reachable(stack);
  const level = new Map(stack.map((s, i) => [s.w, i]));
  const covers = [
    ...reach.filter((s) => s.kind === 'keyboard').map((s) => ({ ...s, b: keyboardCover(s.b, height) })),
    ...stack.filter((s) => s.kind === 'bar'),
  ].map((s) => ({ level: level.get(s.w), b: clip(s.b, width, height) }));
  const shown = new Map(reach.filter((s) => s.kind !== 'bar').map((s) => [s.w, s]));
  const found = [];
  for (const w of windows.filter((x) => shown.has(x) && x.hierarchy?.node?.length)) {
    const root = w.hierarchy.node[0];
    if (shown.get(w).kind === 'keyboard') {
      const label = { 'content-desc': KEYBOARD_LABEL, class: root.class, package: root.package, bounds: w.bounds || root.bounds };
      const keys = elementOf(label, width, height, []);
      if (keys) found.push({ element: keys, actionable: false });
      continue;
    }
    const over = covers.filter((c) => c.b && c.level > level.get(w)).map((c) => c.b);
    for (const node of walk(w.hierarchy.node)) {
      const element = elementOf(node, width, height, over);
      if (element) found.push({ element, actionable: actionable(node) });
    }
  }
  return found;
}

// What `dumpsys window` says of display 0, the one this host reads and taps: from Android 10 it
// names each display's focus in its own block (`Display: mDisplayId=N`), and a second display's
// (a cast or presentation screen, a foldable's cover screen) may come first. As the Python host
// reads it (host/devices/adb_driver.py, `parse_current_window`); the whole text without blocks.
function displayZero(dumpsys) {
  const blocks = dumpsys.split(/^\s*Display: mDisplayId=(\d+)\b.*$/m); // [before, id, block, id, block, …]
  if (blocks.length === 1) return dumpsys;
  return blocks.filter((_, i) => i > 1 && i % 2 === 0 && blocks[i - 1] === '0').join('\n');
}

// The focused activity of display 0 as `package/activity`; '' when it names none. A focused
// window that is no activity's (the shade: `Window{… NotificationShade}`, an "Application Not
// Responding: …" dialog) names none: then the activity that has the focus under it, as the
// Python host reads it (host/devices/adb_driver.py, `_FOCUS_RES`).
const FOCUS = [
  /mCurrentFocus=Window\{[^}]*\s([\w.]+\/[\w.$]+)\}/,
  /mFocusedApp=.*?\s([\w.]+\/[\w.$]+)/,
  /ResumedActivity.*?\s([\w.]+\/[\w.$]+)/,
];
// `dumpsys window` without its LAST ANR section: for two hours after an "isn't responding" dialog
// it opens with the window manager frozen at that moment (its focus, then "Last ANR continued"
// and a copy of the display contents under their own header); the live sections follow. As the
// Python host drops it (host/devices/adb_driver.py, `without_last_anr`).
function withoutLastAnr(dumpsys) {
  const start = dumpsys.indexOf('WINDOW MANAGER LAST ANR');
  if (start < 0) return dumpsys;
  const lines = dumpsys.slice(start).split('\n');
  for (let i = 1; i < lines.length; i++) {
    if (lines[i].startsWith('WINDOW MANAGER ') && lines[i - 1].trim() !== 'Last ANR continued') {
      return dumpsys.slice(0, start) + lines.slice(i).join('\n');
    }
  }
  return dumpsys.slice(0, start);
}

function focusOf(dumpsys) {
  const ours = displayZero(withoutLastAnr(dumpsys));
  return FOCUS.map((re) => ours.match(re)?.[1]).find(Boolean) || '';
}

// Real dumps fail while a window changes ("ERROR: could not get idle state.", "ERROR: null root
// node returned by UiTestAutomationBridge.", no window listed, the focused window without its
// tree): a look tries DUMP_TRIES times with a growing pause, as the Python host does
// (host/perception/perceive.py, `scene_from_dump`). A window the phone gave no tree of in any of
// them (a secure one, one that never goes idle) is looked at without one, the model told why
// (`ui_tree_missing`), rather than the task failed for it; a dump that goes unanswered (the phone
// or its adb server gone) throws. The tries together stay within LOOK_MS (host/settings.py,
// `hierarchy_deadline_s`): no try starts that could not end within it, taking as long as the
// longest so far; a look whose dumps went unanswered throws, retryable (a stuck phone).
// Where a dump's XML starts: its declaration, or its root on a dumper that writes none. Not at
// the first `<`: MIUI's runtime prints a Java stack trace (`FileInputStream.<init>`) first.
const XML_START = /<\?xml|<displays|<hierarchy/;
// What a dump that gave no tree printed, read as the Python host reads it (host/devices/
// adb_driver.py, `dump_failure`): passing, tried again, are a window changing ("ERROR: could not
// get idle state.", "… null root node …", "dumped to" with no window or a rootless one), a
// dumper a signal ended ("Killed": the low-memory killer; "Aborted": its runtime; the next is a
// fresh process), a NullPointerException or IllegalStateException trace (a node gone mid-dump,
// another UiAutomation client) and no output at all. No retry mends anything else (a native
// crash's "Segmentation fault", a build without `uiautomator`): the phone cannot show its
// screen, so the attempt ends retryable (another phone, or this one mended, can run the task)
// instead of a look without a tree the planner gives up on.
const BUSY_DUMP = [
  'could not get idle state',
  'null root node returned by',
  'dumped to',
  'Killed',
  'Aborted',
  'java.lang.NullPointerException',
  'java.lang.IllegalStateException',
];
function dumpFailure(serial, dump, tree) {
  const shown = dump.trim().slice(-300);
  const failed = `uiautomator dump failed on ${serial}: '${shown}'`;
  if (shown && !BUSY_DUMP.some((marker) => dump.includes(marker))) {
    throw phoneError(`phone ${serial} cannot show its screen: ${failed}`, true);
  }
  if (tree) return 'the focused window came without its tree';
  if (!shown || dump.includes('dumped to')) return 'no window in the dump';
  return dump.match(/ERROR: .*/)?.[0] || failed;
}

// One dump's windows ({ screen, why: '', repaired }), or why it gave none ({ screen: null, why });
// throws for a dump no retry mends (`dumpFailure`).
function readDump(serial, dump) {
  const from = dump.search(XML_START);
  const tree = from >= 0 && dump.includes('<node', from);
  const [body, repaired] = repairDump(dump.slice(from, dump.lastIndexOf('>') + 1));
  const screen = tree && windowsOf(xml.parse(body));
  if (screen) return { screen, why: '', repaired };
  return { screen: null, why: dumpFailure(serial, dump, tree), repaired: '' };
}

// A dump abandoned (timed out, or its attempt stopped: a revoke, an expired lease, the host
// stopping) leaves its dumper running on the phone: adbd does not end it when the client hangs
// up, and while it waits for an idle screen it holds the accessibility bridge, so every dump
// after it failed ("… already registered!") until it gave up by itself, minutes later on a
// screen that never goes idle. It is killed, as the Python host kills it (host/devices/
// adb_driver.py, `_stop_dumper`), and the phone's next dump waits for that to end. Only the
// dumper this host started: the shell prints its pid first (`$$`), then `exec`s the dumper
// (whose own script `exec`s app_process), which keeps that pid. Every `uiautomator` on the
// phone was killed before: another tool's dump or test run driving the same phone too. A look
// stopped before that pid reached this host waits for it (at most CLEANUP_MS) before it hangs
// up; with no pid at all it kills nothing, and says how to end the dumper by hand.
const DUMP = 'echo $$; exec uiautomator dump --windows /dev/tty'; // pid, XML, "UI hierchary dumped to…"
// Android 4.1-4.2's DumpCommand takes its first argument for the file (`new File(args[0])`): it
// tries to write `/--windows`, fails (`/` is read-only) and still says it dumped there. Such a
// phone is dumped without the option from then on, as the Python host does
// (host/devices/adb_driver.py, `PLAIN_DUMP_COMMAND`).
const PLAIN_DUMP = 'echo $$; exec uiautomator dump /dev/tty';
const TOOK_WINDOWS_FOR_FILE = /dumped to: (?:\S*\/)?--windows\s*$/;
const plainDumpers = new Set(); // phone ids whose dumper takes `--windows` for its file
const PID_LINE = /^(\d+)\r?\n/; // \r: a pty's line ends (adb before Android 7)
const DUMPER = 'uiautomator'; // the name the dumper gives itself, which `pidof` matches exactly
const CLEANUP_MS = 5000;
// How long a stopping host waits for its dumper cleanups (`handBack`), whatever its stop grace:
// the pid's wait, then `pidof`, `kill` and the dumper's exit. Bounded by the grace alone (5 s by
// default), a host stopped as a dump began exited before the kill, and the dumper ran on.
const CLEANUP_AT_STOP_MS = 2 * CLEANUP_MS;
const DUMP_MS = seconds('AMC_HOST_DUMP_TIMEOUT_S', 30);
const cleanups = new Map(); // phone id -> the stop of a dumper left running, while under way

async function dumpOnce(device, serial, signal) {
  await cleanups.get(serial);
  let head = '';
  let heard; // resolves once the pid came, or the call's connection closed without it
  const pidCame = new Promise((resolve) => (heard = resolve));
  const onData = (chunk) => {
    if (head.length < 32) head += chunk.toString('latin1');
    if (PID_LINE.test(head)) heard();
  };
  let waited; // resolves once the wait for the pid is over: the connection is hung up then
  const pidWaited = new Promise((resolve) => (waited = resolve));
  const hangUp = (stream) => {
    if (stream.destroyed) heard();
    else stream.once('close', heard);
    pidWaited.then(() => stream.destroy());
  };
  try {
    const options = { signal, onData, hangUp, program: DUMPER, timeout: DUMP_MS };
    const plain = plainDumpers.has(serial);
    const out = (await shell(device, plain ? PLAIN_DUMP : DUMP, options)).replace(PID_LINE, '');
    if (plain || !TOOK_WINDOWS_FOR_FILE.test(out)) return out;
    plainDumpers.add(serial);
    return dumpOnce(device, serial, signal);
  } catch (err) {
    if (err.timedOut !== true && !signal?.aborted) {
      waited();
      throw err;
    }
    // A look stopped before the pid came (a revoke, a stop moments after the dump began) keeps
    // the call open until the pid, already printed, reaches us (a busy adbd, a slow cable): hung
    // up without it, the dumper would run on with no pid to kill it by. A call that timed out
    // waited long enough for it: none will come.
    const cleanup = (async () => {
      if (signal?.aborted && !PID_LINE.test(head)) await within(pidCame, CLEANUP_MS, 'pid').catch(() => {});
      waited();
      await stopDumper(device, serial, head.match(PID_LINE)?.[1] || '');
    })().finally(() => {
      cleanups.delete(serial);
      wake(); // a stopping host waits for it (`handBack`)
    });
    cleanups.set(serial, cleanup);
    if (!signal?.aborted) await cleanup; // a stopped attempt does not wait; the next dump does
    throw err;
  }
}

// Ends this host's dumper `pid` while `pidof` still names it a `uiautomator` (a pid reused by
// another process is left alone), and waits (at most CLEANUP_MS) until it has exited: a killed
// dumper lets go of the bridge only then. Best effort: a failure is logged.
async function stopDumper(device, serial, pid) {
  if (!pid) {
    // The Python host says the same (`_stop_dumper`), and waits the bridge out on the next dump.
    log(
      `phone ${serial}: could not stop a stuck uiautomator dump: no pid of it came back, so none is killed; ` +
        `if its next looks fail ("… already registered!"), end it by hand (adb -s ${serial} shell pidof uiautomator, ` +
        `then adb -s ${serial} shell kill PID) or restart the phone`,
    );
    return;
  }
  const running = async () =>
    (await shell(device, `pidof ${DUMPER}`, { timeout: CLEANUP_MS })).split(/\s+/).includes(pid);
  try {
    if (!(await running())) return;
    await shell(device, `kill ${pid}`, { timeout: CLEANUP_MS });
    log(`phone ${serial}: stopped a stuck uiautomator dump (pid ${pid})`);
    const end = now() + CLEANUP_MS;
    while (now() < end && (await running())) await sleep(50);
  } catch (err) {
    log(`phone ${serial}: could not stop a stuck uiautomator dump: ${err.message}`);
  }
}

const DUMP_TRIES = 5;
const DUMP_PAUSE_MS = 500; // after the first try, one more for each try after it
const LOOK_MS = seconds('AMC_HOST_HIERARCHY_DEADLINE_S', 45);
async function dumpScreen(device, serial, signal) {
  const start = now();
  let [why, longest, answered] = ['', 0, true];
  for (let tries = 1; ; tries += 1) {
    const began = now();
    let dump = null;
    try {
      dump = await dumpOnce(device, serial, signal);
    } catch (err) {
      if (signal?.aborted) throw err;
      if (err.retryable !== true) throw err; // not a timeout or a closed request: the phone or adb gone
      // A request adbd closed is its answer (it cannot start one now), as the Python host counts
      // it (`scene_from_dump`: only a timeout is none); a dump that timed out is a stuck phone.
      why = err.message;
      answered &&= err.closed === true;
    }
    if (dump !== null) {
      const read = readDump(serial, dump);
      if (read.screen) return read;
      why = read.why;
    }
    longest = Math.max(longest, now() - began);
    const pause = DUMP_PAUSE_MS * tries;
    if (tries === DUMP_TRIES || now() + pause + longest - start > LOOK_MS) {
      const message = `uiautomator dump gave no tree in ${tries} ${tries === 1 ? 'try' : 'tries'}: ${why}`;
      if (!answered) throw phoneError(message, true);
      return { screen: null, why: message, repaired: '' };
    }
    await sleep(pause);
  }
}

// How the screen is turned (0-3) when no dump says it, as the Python host reads it
// (host/devices/screen_size.py): display 0's viewport in `dumpsys display` (a second display's
// may come first), any `orientation=` where no viewport names display 0, else `dumpsys input`'s
// SurfaceOrientation (builds whose display dump names none); upright when nothing says.
async function displayRotation(device, serial) {
  const display = await lookRead(device, serial, 'dumpsys display');
  const found =
    display.match(/DisplayViewport\{[^}]*?displayId=0\b[^}]*?\borientation=([0-3])\b/) ||
    display.match(/\borientation=([0-3])\b/) ||
    (await lookRead(device, serial, 'dumpsys input')).match(/SurfaceOrientation:\s*([0-3])\b/);
  return Number(found?.[1] || 0);
}

// The look's other reads (`wm size`, `dumpsys …`). adbd closes a request unstarted while it
// restarts or is out of processes (`shell`): such a read is tried READ_TRIES times with a growing
// pause, as a dump is, and then the look fails retryable, saying the phone did not answer it, as
// the Python host ends such an attempt (host/agent/loop.py, DeviceBusy). A read that timed out
// (30 s) is not tried again: a stuck phone.
const READ_TRIES = 3;
async function lookRead(device, serial, command) {
  for (let tries = 1; ; tries += 1) {
    try {
      return await shell(device, command);
    } catch (err) {
      if (err.closed !== true) throw err;
      if (tries === READ_TRIES) {
        throw phoneError(`phone ${serial} did not answer a look at its screen: ${err.message} in ${tries} tries`, true);
      }
      await sleep(DUMP_PAUSE_MS * tries);
    }
  }
}

// What a look can do without (the activity in front, whether the keyboard is up): `fallback`
// when the phone did not answer its read (closed on every try, or timed out), as the Python host
// goes on without the window's name (host/perception/perceive.py, `perceive`). A phone gone
// still fails the look.
async function readOr(read, fallback) {
  try {
    return await read;
  } catch (err) {
    if (err.retryable !== true) throw err;
    log(`${err.message}: the look goes on without it`);
    return fallback;
  }
}

// The app in front by the dump alone, for a phone that did not say which activity has the focus:
// the largest app window's package, as the Python host names it (host/perception/hierarchy.py,
// `_app_package`).
function appOf(stack) {
  const size = (b) => (b.right - b.left) * (b.bottom - b.top);
  const apps = stack.filter((s) => s.kind === 'app' && s.pkg);
  return apps.reduce((best, s) => (best && size(best.b) >= size(s.b) ? best : s), null)?.pkg || '';
}

// `signal` stops the look's dumps with its attempt (`dumpOnce`).
async function perceive(device, serial, signal) {
  const { screen, why, repaired } = await dumpScreen(device, serial, signal);
  const tree = screen?.find((w) => w.hierarchy)?.hierarchy;
  const rotation = tree ? Number(tree.rotation || 0) : await displayRotation(device, serial);
  const [width, height] = screenSize(await lookRead(device, serial, 'wm size'), rotation);
  const stack = stackOf(screen || [], width, height);
  const found = elementsOf(screen || [], stack, width, height);
  const { overlays, cover } = overlaysOf(stack);
  const activity = focusOf(await readOr(lookRead(device, serial, 'dumpsys window'), ''));
  // Unread, the dump says it: a keyboard window in reach (the Python host's `keyboard_shown`).
  const shownByDump = overlays.includes(OVERLAYS.keyboard) ? 'mInputShown=true' : '';
  const keyboard = /mInputShown=true/.test(await readOr(lookRead(device, serial, 'dumpsys input_method'), shownByDump));
  const pkg = cover || activity.split('/')[0] || appOf(stack);
  return bounded(found, {
    screen_width: width,
    screen_height: height,
    rotation: ['ROTATION_0', 'ROTATION_90', 'ROTATION_180', 'ROTATION_270'][rotation],
    foreground_package: cut(pkg, LIMITS.name),
    foreground_activity: cut(activity.startsWith(`${pkg}/`) ? activity : '', LIMITS.activity),
    keyboard_shown: keyboard,
    overlays,
    ui_tree_missing: cut(why, LIMITS.tree_missing),
    ui_tree_repaired: cut(repaired, LIMITS.tree_missing),
  });
}

// --- phones whose screen cannot be read ------------------------------------------------------
// An attempt that cannot read its phone (no `uiautomator`, a dumper that crashes on every try, a
// display that stays off, looks that go unanswered) ends retryable: the task is not to blame.
// On a phone that can never be read, every task sent to it used up its attempts there. As the
// Python host does (host/devices/health.py), after UNHEALTHY_AFTER such attempts in a row the
// phone takes no work: it is reported OFFLINE (`reported`), an assignment already on its way is
// refused with ASSIGNMENT_REFUSAL_PHONE_UNHEALTHY and words saying what failed and how it clears
// (`cannotRun`), and every PROBE_MS a whole look is tried (`probeUnhealthy`); the first that
// works puts it back to work. Unplugging the phone until the host forgets it, or restarting the
// host, clears the mark too.
const UNHEALTHY_AFTER = whole('AMC_HOST_UNHEALTHY_AFTER_ATTEMPTS', 3, 1);
const PROBE_MS = seconds('AMC_HOST_UNHEALTHY_PROBE_S', 60);
const streaks = new Map(); // phone id -> attempts in a row that could not read it
const unhealthy = new Map(); // phone id -> { words, probedAt }: kept out of work
const probing = new Set(); // phone ids a probe is under way on: one at a time each

function forgetHealth(serial) {
  streaks.delete(serial);
  unhealthy.delete(serial);
}

// An attempt on `serial` ended; `unreadable` says why it could not read the phone ('' when it
// ended otherwise: the streak ends). The cloud hears of a phone kept out before the attempt's
// result, so it does not hand the task straight back to it.
function attemptEnded(serial, unreadable) {
  if (!unreadable) {
    streaks.delete(serial);
    return;
  }
  const streak = (streaks.get(serial) || 0) + 1;
  streaks.set(serial, streak);
  if (streak < UNHEALTHY_AFTER || unhealthy.has(serial)) return;
  const mark = { streak, unreadable, probe: '', probedAt: now() };
  mark.words = unhealthyWords(serial, mark);
  unhealthy.set(serial, mark);
  log(mark.words);
  send({ device_update: { devices: reported() } });
}

// What an operator reads of a phone kept out (a refusal, the cloud's reason): what its last
// failed probe found first (the cloud keeps 512 characters of a reason), as the Python host
// says it (host/devices/health.py, `Unreadable.words`): a probe may find something else than
// the attempts did (no UI tree, where they found a dark display).
function unhealthyWords(serial, mark) {
  const found = mark.probe ? `its last probe failed: ${mark.probe.slice(0, 200)}; before it, ` : '';
  return (
    `phone ${serial} is unhealthy: ${found}its screen could not be read in ${mark.streak} attempts in a row ` +
    `(last: ${mark.unreadable}); it takes no work until a look at it works again, which the host tries ` +
    `every ${PROBE_MS / 1000} s with a whole look (wake, dump); mend what the last failure names ` +
    '(uiautomator, the display, adb), or restart the host to clear it'
  );
}

// A look at each unhealthy phone due for it, the look an attempt takes (`readyScreen`, then
// `perceive`), as the Python host probes (host/perception/perceive.py, `probe`). The whole look:
// an attempt counts a failure anywhere in it (a display that stays off, an unanswered `wm size`),
// and a probe of one dump, which works with the display off, put such a phone back to work to
// burn UNHEALTHY_AFTER more attempts, again and again. A look without a UI tree fails the probe
// too: its screen cannot be read, whatever else answered. HOME is pressed before the look (the
// phone awake and unlocked first): a phone left on an app that never gives a tree (a game, a
// Flutter app, a video that never idles) failed every probe there and stayed out for good. A
// failed probe's finding goes into the phone's reason (`unhealthyWords`). Not awaited by the
// device poll: a look may take LOOK_MS and more, and the poll goes on meanwhile.
function probeUnhealthy() {
  for (const [serial, mark] of unhealthy) {
    const phone = phones.get(serial);
    if (probing.has(serial) || now() - mark.probedAt < PROBE_MS || phone?.state !== 'DEVICE_STATE_ONLINE') continue;
    probing.add(serial);
    readyScreen(phone.device, serial)
      .then(() => input(phone.device, `input keyevent ${KEYS.KEY_HOME}`, 'press home'))
      .then(() => perceive(phone.device, serial))
      .then((observation) => {
        // A look whose dumps all failed still answers, without a tree (`dumpScreen`): an
        // attempt sent to such a phone plans blind, so it is no look that works.
        if (observation.ui_tree_missing) {
          throw new Error(`its look came without a UI tree, on its home screen too (${observation.ui_tree_missing})`);
        }
        if (!unhealthy.delete(serial)) return;
        streaks.delete(serial);
        log(`phone ${serial} can be read again: it takes work again`);
        send({ device_update: { devices: reported() } });
      })
      .catch((err) => {
        log(`phone ${serial} is still unreadable: ${err.message}`);
        const kept = unhealthy.get(serial);
        if (kept !== mark) return; // forgotten, or cleared, meanwhile
        const words = unhealthyWords(serial, { ...mark, probe: err.message });
        if (words === mark.words) return;
        Object.assign(mark, { probe: err.message, words });
        send({ device_update: { devices: reported() } });
      })
      .finally(() => {
        probing.delete(serial);
        if (unhealthy.has(serial)) unhealthy.get(serial).probedAt = now();
      });
  }
}

// --- the phone: `adb shell input`, and whether it worked --------------------------------------
// `input` says it failed only in what it prints (the exit code of a plain `shell:` is not seen,
// and older releases exit 0 anyway): "Exception occurred while executing 'tap':" and a Java
// stack trace (Android 11+), "Error: Unknown keycode: …". So its output is read, as the Python
// host reads it (host/devices/adb_driver.py, `_input`), and a failure is thrown with the
// exception's line, or for typed text (`quoted` false: it may be a secret) its class alone.
const INPUT_FAILED = ['Exception', 'Error:'];
const JAVA_EXCEPTION = /\b(?:[a-z]\w*\.)+[A-Z]\w*(?:Exception|Error)\b/;
const INJECTION_REFUSED =
  "; the phone refuses injected input: on Xiaomi, Redmi and POCO phones turn on Developer options > 'USB " +
  "debugging (Security settings)' (other makers: their equivalent setting)";
// `input` and `monkey` are app_process programs the low-memory killer can take, or whose runtime
// aborts: the shell then prints the signal's name ("Killed", "Aborted", "Segmentation fault") and
// nothing they printed themselves, which read as done. Whether the tap, text or launch happened
// is unknown: the step is not executed, in the Python host's words (host/devices/adb_driver.py,
// `signal_death`).
const SIGNAL_DEATHS = new Set(['Killed', 'Aborted', 'Segmentation fault']);
function signalDeath(device, what, out) {
  const died = out.split('\n').map((line) => line.trim()).find((line) => SIGNAL_DEATHS.has(line));
  if (died === undefined) return;
  throw new Error(
    `${what} on ${device.serial}: the command died ('${died}') before it said it was done, so whether it took effect is unknown`,
  );
}

async function input(device, command, what, quoted = true) {
  const out = await shell(device, command);
  signalDeath(device, what, out);
  if (!INPUT_FAILED.some((marker) => out.includes(marker))) return;
  const lines = out.split('\n');
  const line =
    lines.find((l) => JAVA_EXCEPTION.test(l)) || lines.find((l) => INPUT_FAILED.some((marker) => l.includes(marker)));
  const cause = quoted ? JSON.stringify(line.trim().slice(0, 200)) : out.match(JAVA_EXCEPTION)?.[0] || 'an error';
  const hint = out.includes('INJECT_EVENTS') ? INJECTION_REFUSED : '';
  throw new Error(`${what} failed: Android's input reported ${cause}${hint}`);
}

// --- the phone: awake and past a lock screen that needs no credential ----------------------
// Before each look, as the Python host does (host/perception/perceive.py, `ready_screen`): a
// phone whose display is off is woken, and a lock screen that needs no credential (none, or a
// swipe) is dismissed; one that needs a PIN, pattern or password is a person's to open, so the
// attempt fails saying so (amc never guesses a credential). `dumpsys power` says whether the
// display is on, `dumpsys window policy` whether a lock screen is up and whether it is secure,
// in forms that changed across releases (host/devices/screen_state.py reads the same ones).
const SCREEN_STATE = 'dumpsys power | grep -i wakefulness; dumpsys window policy';
// Android 8 (API 26) added `wm dismiss-keyguard`; before it MENU dismisses a swipe lock unless
// the maker turned that off, and a swipe up always does.
const DISMISS_KEYGUARD_MIN_SDK = 26;

// `key=value` lines of the block that starts at `header`, indented below it: the first of each.
function block(text, header) {
  const start = text.indexOf(header);
  const fields = {};
  if (start < 0) return fields;
  for (const line of text.slice(start).split(/\r?\n/).slice(1)) {
    if (line.trim() && !/^\s/.test(line)) break;
    const m = line.match(/^\s*(\w+)=(\S+)\s*$/);
    if (m && !Object.hasOwn(fields, m[1])) fields[m[1]] = m[2];
  }
  return fields;
}

// Missing lines mean awake and unlocked: a build that says nothing of a lock screen (a TV, one
// without keyguard) is taken as ready.
function screenState(text) {
  const wake = text.match(/^\s*(?:mWakefulness|getWakefulnessLocked\(\))=(\w+)/m);
  const delegate = block(text, 'KeyguardServiceDelegate');
  const monitor = block(text, 'KeyguardStateMonitor');
  let locked;
  if (Object.hasOwn(delegate, 'showingAndNotOccluded')) locked = delegate.showingAndNotOccluded === 'true';
  else if (Object.hasOwn(delegate, 'showing')) locked = delegate.showing === 'true' && delegate.occluded !== 'true';
  else if (Object.hasOwn(monitor, 'mIsShowing')) locked = monitor.mIsShowing === 'true';
  else locked = /\bm(?:Showing|Dreaming)Lockscreen=true\b/.test(text);
  const secure = (delegate.secure === 'true' || monitor.mSimSecure === 'true') && monitor.mTrusted !== 'true';
  return { awake: !wake || wake[1].toLowerCase() === 'awake', locked, secure: locked && secure };
}

// An error that ends the attempt; `retryable` when it is the phone's condition, not the task's.
const phoneError = (message, retryable) => Object.assign(new Error(message), { retryable });

const sdks = new WeakMap(); // device -> its API level (NaN when it does not say), read once
async function sdkLevel(device) {
  if (!sdks.has(device)) sdks.set(device, parseInt(await shell(device, 'getprop ro.build.version.sdk'), 10));
  return sdks.get(device);
}

async function readyScreen(device, serial) {
  const look = async () => screenState(await lookRead(device, serial, SCREEN_STATE));
  let state = await look();
  if (!state.awake) {
    await input(device, 'input keyevent KEYCODE_WAKEUP', 'wake');
    state = await look();
    if (!state.awake) {
      throw phoneError(
        `phone ${serial} cannot show its screen: its display stayed off after the wake-up key ` +
          '(a broken display or backlight, a covered proximity sensor)',
        true,
      );
    }
  }
  if (!state.locked) return;
  if (state.secure) {
    throw phoneError(
      `phone ${serial} shows a lock screen that needs a PIN, pattern or password; amc does not ` +
        'unlock it: unlock the phone by hand (or remove its screen lock) and run the task again',
      false,
    );
  }
  const sdk = await sdkLevel(device);
  if (Number.isNaN(sdk) || sdk >= DISMISS_KEYGUARD_MIN_SDK) {
    await shell(device, 'wm dismiss-keyguard');
  } else {
    await input(device, 'input keyevent KEYCODE_MENU', 'dismiss keyguard');
    if ((await look()).locked) {
      // Up the middle of the screen, from 4/5 to 1/5 of its height (as it is turned now).
      const [w, h] = screenSize(await lookRead(device, serial, 'wm size'), await displayRotation(device, serial));
      await input(device, `input swipe ${Math.floor(w / 2)} ${Math.floor((h * 4) / 5)} ${Math.floor(w / 2)} ${Math.floor(h / 5)} 300`, 'swipe');
    }
  }
  if ((await look()).locked) throw phoneError(`phone ${serial} still shows its lock screen after dismissing it`, false);
}

// --- the phone: act with `adb shell input` ------------------------------------------------
const KEYS = { KEY_BACK: 'KEYCODE_BACK', KEY_HOME: 'KEYCODE_HOME', KEY_ENTER: 'KEYCODE_ENTER', KEY_DELETE: 'KEYCODE_DEL' };
// A plain package name or nothing: what the model names goes into a shell command.
const PACKAGE = /^[A-Za-z]\w*(\.[A-Za-z_]\w*)*$/;
function packageName(name) {
  if (!PACKAGE.test(name)) throw new Error(`not a package name: '${name}'`);
  return name;
}

// adbd before Android 7 takes adb packets of at most 4096 bytes (MAX_PAYLOAD_V1), and a
// request (`shell:` + the command + a NUL) has to fit in one: for a longer one the adb server
// gives up ("destination oversized") and drops the connection unanswered. So a long text is
// typed by as many `input text` commands as it takes, each fitting one request, as the Python
// host types it (host/devices/adb_driver.py, `input_text_commands`). A cut anywhere is safe:
// each piece is quoted on its own, and a space's `%s` is never split.
//
// `input text` takes one argument and turns every `%s` in it into a space: spaces (and tabs and
// line breaks, which as keys would move the focus or submit the form) are written `%s`. It has
// no escape for a literal `%s` (`%%s` types `% `), so the text is also cut between each literal
// `%` and the `s` after it: a `%` that ends an argument has nothing to pair with.
const SHELL_MAX = 4096 - 2 - 'shell:'.length; // bytes
function inputTextCommands(text) {
  const room = SHELL_MAX - Buffer.byteLength("input text ''");
  const commands = [];
  for (const part of text.split(/(?<=%)(?=s)/)) {
    let piece = '';
    let size = 0;
    for (const ch of part) {
      const unit = ' \t\n\r'.includes(ch) ? '%s' : ch === "'" ? `'\\''` : ch;
      const bytes = Buffer.byteLength(unit);
      if (piece && size + bytes > room) {
        commands.push(`input text '${piece}'`);
        [piece, size] = ['', 0];
      }
      piece += unit;
      size += bytes;
    }
    if (piece) commands.push(`input text '${piece}'`);
  }
  return commands;
}

function center(observation, elementId) {
  const element = observation.elements.find((e) => e.element_id === elementId);
  if (!element) throw new Error(`no element ${elementId} on this screen`);
  const b = element.bounds;
  return [Math.floor((b.left + b.right) / 2), Math.floor((b.top + b.bottom) / 2)];
}

// Returns what the driver reported; throws when the action cannot run. A value this host's
// contract lacks (a newer cloud's) is refused before anything reaches the phone, as the Python
// host refuses it (host/agent/actions.py): grpc-js decodes an enum value it has no name for as
// its number, and an action of a kind it does not know as one of no kind.
async function act(device, action, observation) {
  switch (action.kind) {
    case 'tap': {
      const t = action.tap;
      if (t.target !== 'element_id' && !t.point) throw new Error('tap without a target');
      const [x, y] = t.target === 'element_id' ? center(observation, t.element_id) : [t.point.x, t.point.y];
      await input(device, t.long_press ? `input swipe ${x} ${y} ${x} ${y} 800` : `input tap ${x} ${y}`, 'tap');
      return `tapped (${x}, ${y})`;
    }
    case 'input_text': {
      const t = action.input_text;
      // `input text` types through the virtual keyboard's key map, which has no key for é, ß, CJK,
      // emoji…: it throws and types nothing of the piece. Refused up front, the text kept out.
      if (!/^\p{ASCII}*$/u.test(t.text)) {
        throw new Error(
          "input text failed: adb's 'input text' can type ASCII only and this text has other characters (nothing was typed)",
        );
      }
      if (t.element_id) await input(device, `input tap ${center(observation, t.element_id).join(' ')}`, 'tap');
      for (const command of inputTextCommands(t.text)) await input(device, command, 'input text', false);
      return t.sensitive ? 'typed •••' : `typed ${t.text.length} characters`;
    }
    case 'swipe': {
      const s = action.swipe;
      await input(device, `input swipe ${s.start.x} ${s.start.y} ${s.end.x} ${s.end.y} ${s.duration_ms || 300}`, 'swipe');
      return 'swiped';
    }
    case 'press_key': {
      const key = action.press_key.key;
      if (!Object.hasOwn(KEYS, key)) throw new Error(`unknown key ${key}: this host presses ${Object.keys(KEYS).join(', ')}`);
      await input(device, `input keyevent ${KEYS[key]}`, 'press key');
      return `pressed ${key}`;
    }
    case 'launch_app': {
      // For an app that is not installed (or has no launcher activity) monkey prints "** No
      // activities found to run, monkey aborted." and exits 0 on most builds: only its words
      // tell (the Python host's `check_launched`).
      const name = packageName(action.launch_app.package_name);
      const out = await shell(device, `monkey -p ${name} -c android.intent.category.LAUNCHER 1`);
      signalDeath(device, `launch ${name}`, out);
      if (out.includes('No activities found') || out.toLowerCase().includes('monkey aborted')) {
        throw new Error(`cannot launch ${name}: ${JSON.stringify(out.trim().slice(0, 500))}`);
      }
      return out;
    }
    case 'terminate_app':
      return shell(device, `am force-stop ${packageName(action.terminate_app.package_name)}`);
    case 'get_ui_tree':
      return 'the next observation is the tree';
    default:
      throw new Error(`unsupported action: ${action.kind ? action.kind : "none this host knows (a newer cloud's?)"}`);
  }
}

// --- reconnecting ----------------------------------------------------------------------------
// The Python host's bounds (host/lease_client.py, `backoff_delay`): full jitter up to
// 0.5 s·2^failures, at most 30 s (AMC_HOST_RECONNECT_INITIAL_S, AMC_HOST_RECONNECT_MAX_S) and
// at most half the time left on the soonest lease held (a host that had doubled its backoff
// during a restart would otherwise sleep through its lease after the cloud came back, decision
// 0074), and at least 50 ms.
const BACKOFF = { initial: RECONNECT_INITIAL_MS, cap: RECONNECT_MAX_MS, floor: 50 };
const expiries = new Map(); // lease id -> when it runs out, by this host's monotonic clock
const now = () => performance.now();
function backoff(failures) {
  let ceiling = Math.min(BACKOFF.cap, BACKOFF.initial * 2 ** Math.min(failures, 30));
  // A paused attempt's lease has run out already: it counts as a whole lease, so the backoff
  // stays under half a lease while an attempt waits for the cloud's word, which only a
  // connection brings (a cloud back after a long outage is heard within half a lease, not after
  // a backoff doubled up to its cap), as the Python host counts it (`_lease_left`).
  // Only attempts still running on a lease not revoked count, and one whose lease ran out (by
  // this host's clock, not paused yet) bounds it to the floor, as the Python host's
  // `_lease_left`: a finished attempt's lease (its result waiting for the cloud's answer) bounded
  // the backoff here, and a lease run out was left out of it.
  const left = [...running]
    .filter(([leaseId]) => expiries.has(leaseId) && !revoked.has(leaseId))
    .map(([leaseId, attempt]) => (attempt.paused ? attempt.leaseMs : Math.max(0, expiries.get(leaseId) - now())));
  if (left.length) ceiling = Math.min(ceiling, Math.min(...left) / 2);
  return Math.max(BACKOFF.floor, Math.random() * ceiling);
}
// The failed connections in a row after a stream ended, as the Python host counts them (`run`):
// 0 after a stream the cloud welcomed, else one more than before; the backoff's ceiling doubles
// with it. host.js counted one behind after a failed connection (a first one waited up to 0.5 s
// where the Python host waits up to 1 s, and so on up to the cap).
function failedInARow(state) {
  state.failures = state.welcomed ? 0 : state.failures + 1;
  state.welcomed = false;
  return state.failures;
}
const sleep = (millis) => new Promise((r) => setTimeout(r, millis));
const ms = (d) => (Number(d.seconds) + d.nanos / 1e9) * 1000;
// A Duration the message may leave unset (every proto3 field may be): `fallback` then, as the
// Python host does (host/lease_client.py, `_duration_s`).
const msOr = (d, fallback) => (d && ms(d) > 0 ? ms(d) : fallback);
const DEFAULT_LEASE_MS = 60_000; // host/lease_client.py, DEFAULT_LEASE_S
const leaseMs = (a) => msOr(a.lease_duration, DEFAULT_LEASE_MS);
// When a lease an Assignment or a Renewed gives runs out, by this host's monotonic clock, as the
// Python host reckons it (host/lease_client.py, `_mono_expiry`): from the time left the cloud
// sent (`remaining`), counted from `since` (when the message it answers left this host: the
// hello, the renewal; now when none is on record), which needs no agreement between this host's
// wall clock and the cloud's. A cloud from before `lease_remaining` (or a foreign one) sends only
// `expiresAt`: read against this host's wall clock once, here, as the Python host reads it;
// ignored, every renewal of such a cloud went unheard and the attempt paused a lease after it
// began. Neither: a whole lease (`fallbackMs`) from now.
function leaseEnd(remaining, expiresAt, fallbackMs, since) {
  if (remaining) return (since ?? now()) + ms(remaining);
  if (expiresAt && Number(expiresAt.seconds)) return now() + (ms(expiresAt) - Date.now());
  return now() + fallbackMs;
}

// --- one task -----------------------------------------------------------------------------
// `signal` cancels the call: a step whose lease ran out waits for no answer. Its listener goes
// with the call: left on the attempt's signal, every Decide of the attempt added one, and the
// eleventh made Node warn of a leak (MaxListenersExceededWarning). A signal aborted already
// fires no listener: the call is not made (made, it went out with nothing to cancel it).
const callDecide = (request, signal) =>
  new Promise((resolve, reject) => {
    if (signal.aborted) {
      reject(Object.assign(new Error('Decide not sent: the step was stopped or paused'), { code: grpc.status.CANCELLED }));
      return;
    }
    const cancel = () => call.cancel();
    const client = planner; // the certificate files may make another meanwhile (`retire`)
    decideCalls.set(client, (decideCalls.get(client) || 0) + 1);
    const call = client.Decide(request, { deadline: Date.now() + 120000 }, (err, res) => {
      signal.removeEventListener('abort', cancel);
      const left = decideCalls.get(client) - 1;
      if (left) decideCalls.set(client, left);
      else decideCalls.delete(client);
      if (!left && replaced.delete(client)) client.close();
      if (err) reject(Object.assign(err, { client }));
      else resolve(res);
    });
    signal.addEventListener('abort', cancel, { once: true });
  });

// What Decide answers when the step may simply be asked again (planner_service.proto): the cloud
// or its provider is unavailable or rate limited, or the call was cut off by a restart or a
// reset connection; ABORTED when another call continued the same conversation.
const DECIDE_AGAIN = new Set([
  grpc.status.UNAVAILABLE,
  grpc.status.RESOURCE_EXHAUSTED,
  grpc.status.CANCELLED,
  grpc.status.DEADLINE_EXCEEDED,
  grpc.status.ABORTED,
]);
// gRPC reports a stream a proxy or load balancer reset mid-call as INTERNAL with this in its
// details: the answer was lost, and the cloud answers the same step key from its log, so it is
// asked again, as the Python host asks (host/agent/planning_wait.py, `_RESET_STREAM`). Any other
// INTERNAL is the cloud's own fault, which asking again would only repeat.
const RESET_STREAM = 'RST_STREAM';
const askAgain = (err) =>
  DECIDE_AGAIN.has(err.code) || (err.code === grpc.status.INTERNAL && String(err.details ?? err.message).includes(RESET_STREAM));

// How long a step waits before asking Decide again, as the Python host's WaitPolicy
// (host/agent/planning_wait.py): AMC_HOST_PLANNER_WAIT_INITIAL_S (1 s) doubling with each wait
// up to AMC_HOST_PLANNER_WAIT_MAX_S (30 s), each drawn between half and all of that, so a fleet
// of waiting steps does not ask in step. host.js waited its reconnect backoff, from 0 failures:
// a first wait of 0.05 to 0.5 s, and neither setting was read.
const PLAN_WAIT = {
  initial: seconds('AMC_HOST_PLANNER_WAIT_INITIAL_S', 1),
  cap: seconds('AMC_HOST_PLANNER_WAIT_MAX_S', 30),
};
function planWait(waits) {
  const base = Math.min(PLAN_WAIT.cap, PLAN_WAIT.initial * 2 ** Math.min(waits, 30));
  return base / 2 + Math.random() * (base / 2);
}

// The next welcome of the lease stream (`session`): a step waiting because the cloud could not
// plan (restarting, unreachable) asks again then instead of sleeping on, as the Python host's
// does (host/agent/planning_wait.py, `CloudBack`): the wait grows to 30 s during an outage, and
// every running step idled up to that long after the cloud came back. Asking early is safe (a
// Decide names its step).
let welcomed = null; // { promise, resolve } of the next welcome, once a step waits for it
function nextWelcome() {
  if (welcomed === null) {
    let resolve;
    const promise = new Promise((r) => {
      resolve = r;
    });
    welcomed = { promise, resolve };
  }
  return welcomed.promise;
}
function saidWelcome() {
  welcomed?.resolve();
  welcomed = null;
}
// HH:MM:SS of `date` in UTC, as the Python host words a time in a summary.
const clockOf = (date) => date.toISOString().slice(11, 19);
// What the cloud names in `amc-waiting-for` when the model provider is what is unavailable
// (planner/errors.py, MODEL_PROVIDER).
const MODEL_PROVIDER = 'the model provider';
// `millis`, or less once `cut` (when given) settles; no timer is left behind either way.
const sleepUntil = (millis, cut) =>
  new Promise((resolve) => {
    const timer = setTimeout(resolve, millis);
    cut?.then(() => {
      clearTimeout(timer);
      resolve();
    });
  });

// Asks until answered, with backoff (`planWait`), for as long as the lease is this host's. Every try sends
// the same step_key, so a step whose answer was lost is answered from the cloud's log: planned,
// and billed, once.
// A step refused UNAUTHENTICATED for a certificate this host no longer holds (revoked after
// it was issued again: the last step of rotating it) is asked again too: the cloud ends the
// stream of that certificate at the same time, and the host connects again with the new one
// (`main`), its planner client with it. Refused, the attempt failed for good for a rotation.
// Whether to ask again is looked at after the wait as well as before it: a step paused (or
// stopped: a revoke, the host stopping) during the wait is over, its caller gone, and the
// Decide it still sent planned the screen from before the pause, which the step the cloud then
// confirmed got replayed. `signal` counts too: a term that paused and was confirmed during the
// wait is not `stopped()` any more, yet its step was abandoned at the pause.
async function decide(request, stopped, signal, onWait = () => {}, deadline = () => Infinity) {
  let since = null; // when the step began to wait, for what it says of its wait
  for (let waits = 0; ; waits += 1) {
    // Taken before asking: a welcome while the ask failed (likely in a rolling deploy, as the
    // stream reconnects first) ends the wait at once instead of being missed.
    const welcome = nextWelcome();
    try {
      await freshPlanner();
      return await callDecide(request, signal);
    } catch (err) {
      const rotated =
        err.code === grpc.status.UNAUTHENTICATED &&
        (err.client !== planner || (await filesReplaced(clientFiles.get(err.client) ?? madeFrom)));
      if (!(askAgain(err) || rotated) || stopped() || signal.aborted) throw err;
      const after = Number(err.metadata?.get('amc-retry-after-s')[0]) * 1000 || 0;
      const wait = Math.max(after, planWait(waits));
      log(`step ${request.step_key}: ${err.details || err.message}; asking again in ${(wait / 1000).toFixed(3)} s (wait ${waits + 1})`);
      // What the cloud names as unavailable (its database, the model provider), else the
      // cloud itself could not be reached; said in the step's progress, as the Python host says
      // it (host/agent/planning_wait.py, `temporarily_impossible`).
      const waitingFor = err.metadata?.get('amc-waiting-for')[0] || 'the cloud';
      since ??= new Date();
      if (now() + wait >= deadline()) {
        // The next wait would reach the task's deadline: the attempt ends, retryable, and the
        // task keeps its attempts, as the Python host ends it (`PlanningPostponed`). host.js
        // asked on past the deadline for as long as the cloud kept the lease.
        const words = `${waitingFor} stayed unavailable since ${clockOf(since)} UTC until the deadline came near: ${err.details || err.message}`;
        throw Object.assign(new Error(words), { pastDeadline: true });
      }
      onWait(since, waitingFor, err.details || err.message);
      // The provider's outage or rate limit is not ended by the cloud coming back.
      const cloudAway = !after && waitingFor !== MODEL_PROVIDER;
      await sleepUntil(wait, cloudAway ? welcome : null);
      if (stopped() || signal.aborted) throw err;
    }
  }
}

// A lease that runs out by this host's own clock with no renewal answered may be gone (the cloud
// swept it and may hand the task to another phone) or still live (a cloud that was down gives
// live leases a new term when it starts again, and resumes the assignments a hello names). So
// the attempt pauses there, as the Python host's does (host/agent/lease_pause.py), whether the
// stream is gone or only silent (a dead link looks open): no further action on its phone (the
// one under way ends, as a stop lets it), no look at the screen, no Decide (one under way is
// abandoned and its answer not acted on), renewals at their interval, and its lease named in
// every hello. Stopped there, every task a Node host ran started again as attempt 2 after any
// outage longer than a lease, its model turns paid again. The cloud's word ends the pause: a
// renewal answered with time left, or the hello's resume of the assignment (`confirmed`), and
// the attempt continues at its step, looking afresh; a revoke stops it, an expiry answered
// with UNREACHABLE, retryable, as the Python host answers it (host/lease_client.py,
// UNREACHABLE_SUMMARY), which is how the cloud hears this host is back.
const UNREACHABLE = 'stopped: the lease ran out while the cloud was unreachable';
// The progress of a paused attempt (after "step N: "), in the Python host's words (PAUSED_SUMMARY).
const PAUSED = 'paused: the lease ran out while the cloud was unreachable; continuing when the cloud confirms it';
// The retryable result of an attempt still paused when the task's deadline came (the Python
// host's PausedPastDeadline).
const PAUSED_PAST_DEADLINE =
  "the lease ran out while the cloud was unreachable, and the cloud had not confirmed it when the task's deadline came";
// What a wait of a step cut short by the pause rejects with: the step is looked at afresh.
class Paused extends Error {}
// The retryable result of an attempt whose Decide the cloud refused for its lease, and how a
// refusal for the task's budget begins instead (planner_service.proto).
const LEASE_NOT_LIVE = 'stopped: the cloud said the lease is no longer live';
const BUDGET_SPENT = 'budget exhausted: ';
// The retryable result of an attempt stopped because this host is stopping (`handBack`).
const HOST_STOPPED = 'stopped: the host stopped';
// At most one renewal per AMC_HOST_PROGRESS_RENEW_MIN_INTERVAL_S (1 s) for progress, a reconnect
// or a resume, read and checked as the Python host reads its `progress_renew_min_interval_s`
// (0 or more: 0 renews at each change), and how soon one that found no stream is tried again.
const PROGRESS_RENEW_MIN_MS = seconds('AMC_HOST_PROGRESS_RENEW_MIN_INTERVAL_S', 1, { zero: true });
const RENEW_RETRY_MS = 500;
// lease id -> the attempt: `stop` (the AbortController that stops it), `lease`, `leaseMs`,
// `deadline`, `paused`, `halt` (aborted when it pauses, made anew when it continues), `halted`
// (a promise rejected at that abort), `out` (when each renewal sent on this stream and not
// answered yet left, oldest first: `confirmedFor`), `watch` (arms the expiry's timer again),
// `resumed` (takes a resumed assignment's terms) and `renewSoon` (renews within the second).
const running = new Map();
// Leases the cloud took back (Revoked), the first word on each: lease id -> { reason, message }.
const revoked = new Map();

// A new `halt` for the attempt's next term, and the promise its abort rejects: one per term,
// so the steps of a term add no listener each.
function newTerm(attempt) {
  attempt.halt = new AbortController();
  attempt.halted = new Promise((_, reject) => attempt.halt.signal.addEventListener('abort', () => reject(new Paused('paused'))));
  attempt.halted.catch(() => {});
}

// The lease `leaseId` ran out by this host's clock with no renewal answered: its attempt pauses.
function pauseAttempt(leaseId) {
  const attempt = running.get(leaseId);
  if (!attempt || attempt.paused || attempt.stop.signal.aborted) return;
  const { task_id: taskId, attempt: n } = attempt.lease;
  log(`lease of ${taskId}/${n} ran out with no renewal answered: the attempt pauses until the cloud confirms it`);
  attempt.paused = true;
  attempt.halt.abort();
}

// The cloud confirmed the lease `leaseId` live: a paused attempt continues. Not on an answer
// that leaves no time on the lease (read late: the cloud may have swept it meanwhile).
function confirmed(leaseId) {
  const attempt = running.get(leaseId);
  if (!attempt?.paused || revoked.has(leaseId) || attempt.stop.signal.aborted || !(expiries.get(leaseId) > now())) return;
  const { task_id: taskId, attempt: n } = attempt.lease;
  log(`lease of ${taskId}/${n} confirmed by the cloud: the attempt continues`);
  attempt.paused = false;
  newTerm(attempt);
  attempt.watch();
  wake(); // the attempt waits at its pause (`runTask`)
}

// When the answer to the lease's oldest renewal out left this host (now when none is out): the
// cloud answers one lease's renewals in order on one stream, so a `renewed` counts its term from
// that send, not from when it is read. Read late (a link that buffers, a slow cloud send queue),
// it would otherwise carry the lease past the cloud's own expiry, and resume a paused attempt on
// a lease the cloud swept meanwhile. Early by at most the round trip (host/lease_client.py,
// `RunningTask.renewals_out`).
function confirmedFor(leaseId) {
  return running.get(leaseId)?.out.shift() ?? now();
}

// Pauses the attempt of `leaseId` when its lease runs out, waking at its end as renewals move
// it; returns what arms it again (after a pause the cloud confirmed) and what cancels it.
function watchExpiry(leaseId) {
  let timer;
  const check = () => {
    clearTimeout(timer);
    if (!expiries.has(leaseId)) return; // let go: revoked or answered
    const left = expiries.get(leaseId) - now();
    if (left > 0) timer = setTimeout(check, left);
    else pauseAttempt(leaseId);
  };
  return { check, cancel: () => clearTimeout(timer) };
}

// How long the task has left by this host's monotonic clock, from when its assignment came
// (Infinity when it says nothing of a deadline).
function deadlineOf(a) {
  if (a.deadline_remaining) return now() + ms(a.deadline_remaining);
  if (a.deadline && Number(a.deadline.seconds) > 0) return now() + (ms(a.deadline) - Date.now());
  return Infinity;
}

async function runTask(a) {
  const phone = phones.get(a.device_serial);
  const device = phone ? phone.device : adb.getDevice(a.device_serial);
  const progress = { step_index: 0, step_status: 'STEP_STATUS_PERCEIVING', summary: 'starting', max_steps: MAX_STEPS };
  const lease = { task_id: a.task_id, attempt: a.attempt, lease_id: a.lease_id };
  held.set(a.lease_id, { ...lease, device_serial: a.device_serial });
  const stop = new AbortController();
  const watch = watchExpiry(a.lease_id);
  // `deadline`: the task's, by this host's monotonic clock; a resumed assignment moves it
  // (`resumed`), as it moves `leaseMs`.
  const attempt = { stop, lease, leaseMs: leaseMs(a), deadline: deadlineOf(a), paused: false, out: [], watch: watch.check };
  newTerm(attempt);
  running.set(a.lease_id, attempt);
  watch.check();
  // The attempt's waits, every one of them, cut short when the cloud takes the lease back (an
  // operator's cancel: `session`), it ran out while paused, or the host stops.
  const ranOut = new Promise((_, reject) => stop.signal.addEventListener('abort', () => reject(stop.signal.reason)));
  ranOut.catch(() => {});
  const bounded = (promise) => Promise.race([promise, ranOut]);
  // Renewals, as the Python host sends them (host/lease_client.py, `_renew_loop`): one every
  // renew interval (the assignment's; a third of the lease when it gives none), and by the
  // lease's end when that comes first (an interval longer than the term: the lease ran out
  // between two renewals, and the attempt paused, every time its progress stood still); and
  // soon after each progress report, a reconnect (`renewSoon`) or a resume, but at most one a
  // second: before, every report sent one, a step's few reports within milliseconds a renewal
  // each. The latest progress goes out when the renewal is sent, so none is lost: the last
  // state always goes out (or with the result, the attempt ended first).
  // A lease the cloud took back is not renewed (it would only be refused again). One sent on
  // the stream waits for its answer (`confirmedFor`); one with no stream to go on is tried
  // again in RENEW_RETRY_MS (the welcome renews at once anyway).
  let renewMs = msOr(a.renew_interval, leaseMs(a) / 3);
  let lastRenewal = -Infinity;
  let renewAt = Infinity;
  let renewer;
  let renewing = true; // until the attempt ends
  const renewBy = (at) => {
    if (!renewing) return;
    clearTimeout(renewer);
    renewAt = at;
    renewer = setTimeout(renew, Math.max(0, at - now()));
  };
  const renew = () => {
    const t = now();
    let next = t + Math.max(100, renewMs);
    if (revoked.has(a.lease_id)) {
      // not renewed: stopping
    } else if (send({ renewal: { ...lease, progress } })) {
      attempt.out.push(t);
      lastRenewal = t;
    } else {
      next = t + RENEW_RETRY_MS;
    }
    // Paused, renewals go on at the interval, not faster (a cloud just back hears every paused
    // host of the fleet at once), and not at the lease's end, which has passed.
    const end = expiries.get(a.lease_id);
    if (!attempt.paused && end > t) next = Math.min(next, end);
    renewBy(next);
  };
  const renewSoon = () => renewBy(Math.min(renewAt, Math.max(now(), lastRenewal + PROGRESS_RENEW_MIN_MS)));
  attempt.renewSoon = renewSoon;
  const report = (step, status, summary) => {
    Object.assign(progress, { step_index: step, step_status: status, summary: cut(summary, LIMITS.summary, characters) });
    renewSoon();
  };
  // The pause's gate, before each step: while the lease ran out by this host's clock and the
  // cloud has not confirmed it, the attempt does nothing on its phone, asks no model and says
  // so; it ends at a stop, a revoke or the task's deadline.
  const holdWhilePaused = async (step) => {
    if (!attempt.paused || stop.signal.aborted) return;
    log(`task ${a.task_id}: step ${step} paused: the lease ran out by this host's clock`);
    report(step, 'STEP_STATUS_PERCEIVING', `step ${step}: ${PAUSED}`);
    while (attempt.paused) {
      if (now() >= attempt.deadline) throw Object.assign(new Error(PAUSED_PAST_DEADLINE), { pastDeadline: true });
      await bounded(woken(Math.min(attempt.deadline - now(), 60_000)));
    }
    log(`task ${a.task_id}: step ${step} continues: the cloud confirmed the lease`);
  };
  // A step up to its action: a look at the screen (the one under way when the lease pauses
  // ends, as an action does) and a Decide (abandoned at the pause: its answer is not acted on).
  // Null when the lease paused meanwhile: the step is looked at afresh once the cloud confirms it.
  // The Decide races the pause of the term it is asked in, read after the look: a pause and the
  // cloud's confirmation during one look end one term and begin another, and the step, raced
  // with the ended term's pause, failed the attempt "host error: paused", not retryable.
  const lookAndDecide = async (step) => {
    report(step, 'STEP_STATUS_PERCEIVING', `step ${step}: looking at the screen`);
    looking = true;
    await bounded(readyScreen(device, a.device_serial));
    const observation = await bounded(perceive(device, a.device_serial, stop.signal));
    looking = false;
    if (attempt.paused) return null;
    const { halt, halted } = attempt;
    report(step, 'STEP_STATUS_PLANNING', `step ${step}: planning`);
    const request = { ...lease, observation, previous_outcome: previous, step_key: String(step) };
    const over = () => revoked.has(a.lease_id) || stop.signal.aborted || attempt.paused;
    try {
      const asked = AbortSignal.any([stop.signal, halt.signal]);
      // A wait to plan is the step's progress, as the Python host reports it (host/agent/
      // loop.py, `waiting`): "planning" said nothing of a task standing still for an outage.
      const waiting = (since, what, why) =>
        report(step, 'STEP_STATUS_PLANNING', `step ${step}: waiting for ${what} since ${clockOf(since)} UTC (${why})`);
      const answered = await Promise.race([decide(request, over, asked, waiting, () => attempt.deadline), ranOut, halted]);
      return attempt.paused ? null : { observation, ...answered };
    } catch (err) {
      if (attempt.paused && !stop.signal.aborted && !revoked.has(a.lease_id)) return null;
      throw err;
    }
  };
  renewBy(now() + renewMs);
  // The cloud sent the assignment back after a reconnect (`session`, which took the lease's new
  // end from it): the attempt takes the rest from it too, as the Python host takes it
  // (host/lease_client.py, `_on_assignment`): the lease's length, how often to renew it, the
  // task's deadline (from this host's now), and the watch of the lease's end, moved there; and
  // it renews at once. Before, a running attempt's watch stayed at the end it had, and the
  // deadline and the interval stayed the fresh assignment's: an attempt the resume gave a
  // shorter term ran on past the cloud's end of it, renewed too seldom to keep it, and a
  // paused one waited for the task's first deadline.
  attempt.resumed = (again) => {
    attempt.leaseMs = leaseMs(again);
    attempt.deadline = deadlineOf(again);
    renewMs = msOr(again.renew_interval, leaseMs(again) / 3);
    watch.check();
    renewSoon();
    wake(); // a paused step waits until the deadline it had (`holdWhilePaused`)
  };
  let status = 'TASK_STATUS_FAILED';
  let summary = `step limit reached (${MAX_STEPS} steps)`;
  let retryable = false;
  let previous = null;
  let looking = false; // a look at the screen is under way: what fails there is `unreadable`
  let unreadable = '';
  try {
    for (let step = 1; step <= MAX_STEPS; step += 1) {
      if (revoked.has(a.lease_id)) {
        [status, summary] = ['TASK_STATUS_CANCELLED', revoked.get(a.lease_id).message];
        break;
      }
      if (stop.signal.aborted) {
        [summary, retryable] = [stop.signal.reason.message, true];
        break;
      }
      await holdWhilePaused(step);
      const planned = await lookAndDecide(step);
      if (planned === null) {
        step -= 1; // the same step again, once the cloud confirms the lease
        continue;
      }
      const { observation, decision, replayed } = planned;
      const action = decision.action ?? {}; // none: no kind, not executed (`act`)
      report(step, 'STEP_STATUS_ACTING', `step ${step}: ${decision.tool_name} — ${decision.purpose}`);
      log(`step ${step}: ${decision.tool_name} ${decision.arguments_json} — ${decision.rationale}`);
      if (action.kind === 'complete') {
        status = action.complete.success ? 'TASK_STATUS_SUCCEEDED' : 'TASK_STATUS_FAILED';
        summary = action.complete.reason;
        report(step, 'STEP_STATUS_SUCCEEDED', summary);
        break;
      }
      previous = { step_index: decision.step_index, executed: true, error: '', driver_output: '' };
      // A replayed answer carries a sensitive value as "•••" (it is never stored): not typed.
      if (replayed && action.kind === 'input_text' && action.input_text.sensitive) {
        Object.assign(previous, { executed: false, error: 'replayed decision: the sensitive text is not kept' });
        continue;
      }
      try {
        previous.driver_output = cut(await bounded(act(device, action, observation)), LIMITS.driver_output);
        report(step, 'STEP_STATUS_SUCCEEDED', `step ${step}: done`);
      } catch (err) {
        if (stop.signal.aborted) throw err;
        Object.assign(previous, { executed: false, error: cut(err.message, LIMITS.error) });
        report(step, 'STEP_STATUS_FAILED', `step ${step}: ${err.message}`);
      }
      await bounded(sleep(300)); // let the screen settle
    }
  } catch (err) {
    summary = `host error: ${err.details || err.message}`;
    if (revoked.has(a.lease_id)) [status, summary] = ['TASK_STATUS_CANCELLED', revoked.get(a.lease_id).message];
    // PERMISSION_DENIED: the model provider refused the cloud's key (or the cloud refused this
    // host the lease). Nothing the task did: the attempt ends retryable, as the Python host ends
    // it, and the task waits (held by the cloud) for a key that works instead of failing.
    // A phone that cannot show its screen is the phone's condition too (`phoneError`).
    retryable = err.code === grpc.status.PERMISSION_DENIED || err.retryable === true;
    // FAILED_PRECONDITION but a spent budget: the cloud says the lease is not live (it ran out
    // by the cloud's clock, a revoke not heard yet). Retryable, as the Python host ends it
    // (LEASE_NOT_LIVE_SUMMARY): a FAILED the cloud took late ended a task nobody failed.
    const notLive = err.code === grpc.status.FAILED_PRECONDITION && !String(err.details).startsWith(BUDGET_SPENT);
    if (notLive && !revoked.has(a.lease_id)) {
      [summary, retryable] = [LEASE_NOT_LIVE, true];
    }
    // A phone that went away is nothing the task did either: retryable, the task waits for a
    // phone that is there.
    // gRPC's codes are numbers.
    // Asking adb may take its list's whole timeout (a server whose USB thread a bad cable holds):
    // a stop does not wait for it, as it waits for no other call of the attempt.
    const fromPhone = typeof err.code !== 'number' && !revoked.has(a.lease_id) && !stop.signal.aborted && !err.pastDeadline;
    if (fromPhone) log(`task ${a.task_id}: a step failed on ${a.device_serial} (${err.message}): is the phone still there?`);
    const gone = fromPhone ? await bounded(phoneGone(a.device_serial, err)).catch(() => null) : null;
    if (gone) [summary, retryable] = [gone, true];
    // A look the phone failed, retryable, with the phone still there: counted (`attemptEnded`).
    if (fromPhone && looking && err.retryable === true && !gone) unreadable = err.message;
    // Still paused at the task's deadline, or planning impossible until it came near:
    // retryable (the Python host's PausedPastDeadline, PlanningPostponed).
    if (err.pastDeadline) [summary, retryable] = [err.message, true];
    // Stopped by its lease's expiry while paused (UNREACHABLE) or by this host stopping (HOST_STOPPED):
    // retryable, the task runs again at once.
    if (stop.signal.aborted && !revoked.has(a.lease_id)) {
      [status, summary, retryable] = ['TASK_STATUS_FAILED', stop.signal.reason.message, true];
    }
  } finally {
    renewing = false;
    clearTimeout(renewer);
    watch.cancel();
  }
  if (!running.has(a.lease_id)) return; // handed back by a stop while stuck (`handBack`)
  running.delete(a.lease_id);
  wake(); // a stopping host waits for its attempts to end (`handBack`), the cloud there or not
  attemptEnded(a.device_serial, unreadable);
  const taken = revoked.get(a.lease_id);
  if (taken && taken.reason !== 'REVOKE_REASON_CANCELLED') {
    // The cloud took the lease back for a reason of its own (it ran out, another attempt or
    // process holds it): the attempt is over and no result of it is taken, so none is sent,
    // as the Python host sends none. An operator's cancel is answered: the cloud waits for it.
    log(`task ${a.task_id}: stopped — the cloud took its lease back (${taken.reason}: ${taken.message})`);
    return;
  }
  answer(a.lease_id, { ...lease, status, summary: cut(summary, LIMITS.result_summary, characters), final_progress: progress, retryable });
  log(`task ${a.task_id}: ${status} — ${summary}`);
}

// Kept (and its lease listed in every hello) until the cloud acknowledges it: a result sent
// while the cloud was down is sent again on the next stream, or by the next process.
// Sent once kept, or once the disk refused it or did not answer within WRITE_WAIT_MS (then
// from memory, the host paused: `diskRefused`); not sent if the lease was let go meanwhile.
async function answer(leaseId, result) {
  unsent.add(leaseId);
  try {
    if (!(await keepResult(leaseId, { result })) || !results.has(leaseId)) return;
  } finally {
    unsent.delete(leaseId);
  }
  send(results.get(leaseId));
  resendUnanswered(leaseId);
}

// --- the Lease stream ---------------------------------------------------------------------
// How a stream ends when reconnecting cannot help (lease_service.proto): the certificate or
// host id was revoked, the certificate carries no host identity, the first message was not a
// hello. Any other end (UNAVAILABLE from a replica shutting down or a dropped connection,
// INTERNAL, ...) is reconnected with backoff, the work in flight kept.
const FINAL = new Set([grpc.status.UNAUTHENTICATED, grpc.status.PERMISSION_DENIED, grpc.status.FAILED_PRECONDITION]);
// A stream ending UNIMPLEMENTED: what answered serves no LeaseService (another gRPC server, an
// HTTP/2 proxy's 404), and no reconnect makes it one: the host stops at once naming the address
// and the answer, in the Python host's words (host/lease_client.py, `not_a_cloud`).
const notACloud = (details) =>
  `${CLOUD} is not an amc cloud: it answered the Lease stream UNIMPLEMENTED (${details}); check AMC_CLOUD_ADDRESS`;
const held = new Map(); // lease id -> HeldAssignment, from assignment to acknowledged result
const results = new Map(); // lease id -> the result message, until acknowledged
const unsent = new Set(); // lease ids of results being kept: not sent before (`answer`)
let current = null; // the stream, once welcomed
let opened = null; // the latest stream, welcomed or not
const inherited = new Set(); // lease ids of results a previous process kept: no task of ours
const refused = new Set(); // lease ids of assignments refused (`cannotRun`): no task run
let started = 0; // tasks this process began
const lateTried = new Set(); // lease ids whose result was sent once more after an expiry

// Results wait for the cloud's answer on disk too, as the Python host keeps them (its outbox's
// results table): a host restarted, or crashed, before the cloud heard a result still has it,
// names its lease in the hello and sends it, and the cloud does not release the attempt as a
// dead process's and run the task again. One file per result, written whole and renamed into
// place, so a crash mid-write leaves the previous state.
const DATA_DIR = env.AMC_HOST_DATA_DIR || 'amc_host_data';
const RESULTS_DIR = path.resolve(DATA_DIR, 'node-host', HOST_ID, 'results');
const resultFile = (leaseId) => path.join(RESULTS_DIR, `${encodeURIComponent(leaseId)}.json`);

// --- the data folder's reads and writes, in a process of their own ---------------------------
// A write that never returns (an NFS server gone, a dying disk) must not stop the host: on this
// thread it stopped renewals for every other phone, the answers to revocations and SIGTERM. Off
// it, on libuv's pool (fs.promises), the host runs on, but it cannot exit: Node joins the pool's
// threads at exit, the hung one never. So they run in a small process of the host's own, one at
// a time and in order (a result is dropped only after it was kept), which the host kills when
// it goes. A call waits at most WRITE_WAIT_MS where the host waits for it (`onDisk`); past
// that, the folder counts as faulty, as a full one (`diskRefused`).
const WRITE_WAIT_MS = seconds('AMC_HOST_DISK_WAIT_S', 10);
const DISK_STOP_MS = 2000; // stopping, how long calls under way may still take (the Python host's)

// What that process runs: each request with Node's synchronous calls (it does nothing else),
// answered with its value or with what the disk said.
function diskProcess() {
  const fs = require('fs');
  const path = require('path');
  // `fs.mkdirSync` with `recursive` says ENOENT where the disk said EROFS (Node 20, a read-only
  // folder): each missing level is made on its own, so what the disk said reaches `diskRefused`.
  const makeFolders = (dir) => {
    const make = (d) => {
      try {
        fs.mkdirSync(d);
      } catch (err) {
        if (err.code !== 'EEXIST') throw err;
      }
    };
    try {
      make(dir);
    } catch (err) {
      if (err.code !== 'ENOENT' || path.dirname(dir) === dir) throw err;
      makeFolders(path.dirname(dir));
      make(dir);
    }
  };
  const write = (file, data) => {
    makeFolders(path.dirname(file));
    const fd = fs.openSync(file, 'w');
    try {
      fs.writeSync(fd, data);
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
  };
  // Not `fs.rmSync`: refused (EPERM), it tries the file as a folder and throws that error
  // instead ("ENOTDIR: not a directory, scandir"), so what the disk said never reached
  // `diskRefused` and a folder refusing deletes did not pause the host.
  const remove = (file) => {
    try {
      fs.unlinkSync(file);
    } catch (err) {
      if (err.code !== 'ENOENT') throw err;
    }
  };
  const calls = {
    keep(file, partial, text) {
      write(partial, text);
      fs.renameSync(partial, file);
    },
    drop: remove,
    probe(file, bytes) {
      try {
        write(file, Buffer.alloc(bytes));
      } finally {
        remove(file);
      }
    },
    list(dir) {
      try {
        return fs.readdirSync(dir).filter((name) => name.endsWith('.json'));
      } catch (err) {
        if (err.code === 'ENOENT') return [];
        throw err;
      }
    },
    read: (file) => fs.readFileSync(file, 'utf8'),
  };
  process.on('message', ({ id, call, args }) => {
    try {
      process.send({ id, value: calls[call](...args) });
    } catch (err) {
      process.send({ id, error: { message: err.message, code: err.code } });
    }
  });
  process.on('disconnect', () => process.exit(0));
}

let disk = null; // that process, started at the first call (and again should it die)
const diskCalls = new Map(); // request id -> { resolve, reject }
let diskIds = 0;
function toDisk(call, ...args) {
  if (!disk) {
    const child = spawn(process.execPath, ['-e', `(${diskProcess})()`], { stdio: ['ignore', 'ignore', 'ignore', 'ipc'] });
    child.on('message', ({ id, value, error }) => {
      const waiting = diskCalls.get(id);
      diskCalls.delete(id);
      idle(child);
      if (error) waiting?.reject(Object.assign(new Error(error.message), { code: error.code }));
      else waiting?.resolve(value);
    });
    const gone = (err) => {
      if (disk === child) disk = null;
      for (const [id, waiting] of diskCalls) {
        if (waiting.child !== child) continue;
        diskCalls.delete(id);
        waiting.reject(new Error(`the data folder's process ended (${err?.message ?? 'exited'})`));
      }
      wake();
    };
    child.on('exit', () => gone());
    child.on('error', gone);
    child.unref(); // it keeps the host up only while a call waits for it (`idle`)
    disk = child;
  }
  const id = (diskIds += 1);
  const child = disk;
  child.channel?.ref();
  return new Promise((resolve, reject) => {
    diskCalls.set(id, { resolve, reject, child });
    child.send({ id, call, args });
  });
}

// A call answered: with none left waiting, the process's channel no longer keeps the host up.
function idle(child) {
  wake(); // a stopping host waits for the calls under way (`closeDisk`)
  if (![...diskCalls.values()].some((waiting) => waiting.child === child)) child.channel?.unref();
}

// A call to the disk that has not returned within WRITE_WAIT_MS: the disk hangs.
function onDisk(call, ...args) {
  let timer;
  const hung = new Promise((_, reject) => {
    timer = setTimeout(() => {
      const err = new Error(`a ${call} there did not return within ${WRITE_WAIT_MS / 1000} s: the disk or mount hangs`);
      reject(Object.assign(err, { hung: true }));
    }, WRITE_WAIT_MS);
  });
  return Promise.race([toDisk(call, ...args), hung]).finally(() => clearTimeout(timer));
}

// Stopping: calls still under way get DISK_STOP_MS, then the process is killed (one hung in
// the kernel ends when its call returns; the host does not wait for it).
async function closeDisk() {
  await until(() => diskCalls.size === 0, DISK_STOP_MS);
  disk?.channel?.unref(); // one the kill cannot end yet (a call hung in the kernel) holds nothing
  disk?.kill('SIGKILL');
}

// A result is kept under its lease (the cloud takes it for that lease only), with the lease as
// the hello names it while this host still holds it (`held`): none for a cancel answered after
// the revoke let the lease go, which the next hello does not name, as the Python host names none.
// Resolves with whether it was kept: one naming no lease (a cloud's assignment without one) is
// dropped, said in the log, as the cloud could take it for no lease.
async function keepResult(leaseId, message) {
  if (!leaseId) {
    log(`a result of task ${message.result.task_id} names no lease: dropped, not sent`);
    return false;
  }
  results.set(leaseId, message);
  const file = resultFile(leaseId);
  try {
    await onDisk('keep', file, `${file}.${process.pid}.partial`, JSON.stringify({ held: held.get(leaseId) ?? null, message }));
    unkept.delete(leaseId);
  } catch (err) {
    log(`could not keep the result of lease ${leaseId} on disk (sent from memory): ${err.message}`);
    unkept.add(leaseId);
    diskRefused(err);
  }
  return true;
}

function dropResult(leaseId) {
  unkept.delete(leaseId);
  onDisk('drop', resultFile(leaseId)).catch((err) => {
    log(`could not forget the result of lease ${leaseId} (the next process sends it again): ${err.message}`);
    diskRefused(err);
  });
}

// --- a data folder that cannot be written ----------------------------------------------------
// A host whose data folder is full (over quota, read-only, failing) cannot keep its results:
// one that ran on sent each from memory only, so a restart lost it and the cloud ran the task
// again. As the Python host does (host/timeline/data_folder.py), once a write there fails with
// what the disk says, or is refused permission (the folder's mode, owner or attributes changed
// under the running host: an operator mends that as one frees space), the host takes no work:
// every phone is reported OFFLINE with the words below as its `reason` (`reported`), an
// assignment already on its way is refused with ASSIGNMENT_REFUSAL_DATA_FOLDER_UNWRITABLE and
// the same words (`cannotRun`), and every DATA_PROBE_MS a file of PROBE_BYTES is written,
// synced and deleted there; the first that works puts it back to work, and the results it
// could not keep are written then.
const DISK_FAULTS = new Set(['ENOSPC', 'EDQUOT', 'EROFS', 'EIO', 'EFBIG', 'EACCES', 'EPERM']); // host/timeline/storage_faults.py
const DATA_PROBE_MS = seconds('AMC_HOST_DATA_DIR_PROBE_S', 10);
const PROBE_BYTES = 256 * 1024; // more than a result: a folder that takes it takes the next one
const PROBE_NAME = '.amc-write-probe';
// `faults` counts every disk fault told, paused already or not: a probe clears the pause only
// if none came while it ran (`probeDataFolder`), as the Python host's (DataFolder.probe).
const dataFolder = { why: '', faults: 0 }; // why: '' while writes work, else the words
const unkept = new Set(); // lease ids of results kept in memory only (the disk refused them)

// A write to the data folder failed with `err`: from a disk fault on (or one that hung:
// `onDisk`), the host takes no work.
function diskRefused(err) {
  if (!DISK_FAULTS.has(err?.code) && !err?.hung) return;
  dataFolder.faults += 1;
  if (dataFolder.why) return;
  dataFolder.why =
    `host ${HOST_ID} cannot write its data folder ${path.resolve(DATA_DIR)} (${err.message}); it ` +
    `takes no work until a write there succeeds, which it tries every ${DATA_PROBE_MS / 1000} s: ` +
    'free space or fix the folder (AMC_HOST_DATA_DIR)';
  log(`error: ${dataFolder.why}`);
  send({ device_update: { devices: reported() } });
  setTimeout(probeDataFolder, DATA_PROBE_MS).unref(); // a host done with its tasks still exits
}

// One probe write, in the data folder's process; throws what the disk said. Also at start
// (`main`, bounded there): a host whose folder is already full takes no work. Unbounded here:
// one hung holds the pause (one probe at a time), the next follows once it returns.
const probeWrite = () => toDisk('probe', path.join(RESULTS_DIR, PROBE_NAME), PROBE_BYTES);

async function probeDataFolder() {
  const faults = dataFolder.faults;
  try {
    await probeWrite();
  } catch (err) {
    log(`the data folder ${path.resolve(DATA_DIR)} still cannot be written: ${err.message}`);
    setTimeout(probeDataFolder, DATA_PROBE_MS).unref();
    return;
  }
  if (dataFolder.faults !== faults) {
    // Another write failed on the disk while the probe's worked: cleared, the host went back
    // to work on a disk that had just refused a write. The next probe follows as for a failure.
    log(`a write to the data folder ${path.resolve(DATA_DIR)} failed while it was probed: still paused`);
    setTimeout(probeDataFolder, DATA_PROBE_MS).unref();
    return;
  }
  dataFolder.why = '';
  log(`the data folder ${path.resolve(DATA_DIR)} can be written again: the host takes work again`);
  for (const leaseId of [...unkept]) if (results.has(leaseId)) keepResult(leaseId, results.get(leaseId));
  send({ device_update: { devices: reported() } }); // ONLINE, unless a write failed again
}

// Takes over what a previous process kept: listed in the first hello, sent after its Welcome.
// A read that hangs stops the taking over there (what is left stays for a later start).
async function inheritResults() {
  let names = [];
  try {
    names = await onDisk('list', RESULTS_DIR);
  } catch (err) {
    log(`could not read the results the previous process kept: ${err.message}`);
    diskRefused(err);
  }
  for (const name of names) {
    try {
      const kept = JSON.parse(await onDisk('read', path.join(RESULTS_DIR, name)));
      const leaseId = kept.message?.result?.lease_id;
      if (!leaseId) {
        const unnamed = `a result the previous process kept names no lease (${name}): not sent`;
        try {
          await onDisk('drop', path.join(RESULTS_DIR, name));
          log(`${unnamed}, dropped`);
        } catch (err) {
          // Read, but not deleted: not "cannot be read" (below); the next start drops it.
          log(`${unnamed}, and could not be deleted (${err.message}): the next start tries again`);
          diskRefused(err);
          if (err.hung) break;
        }
        continue;
      }
      if (kept.held) held.set(leaseId, kept.held);
      results.set(leaseId, kept.message);
      inherited.add(leaseId);
      resendUnanswered(leaseId);
    } catch (err) {
      log(`a result the previous process kept cannot be read (${name}: ${err.message}): skipped`);
      if (err.hung) {
        diskRefused(err);
        break;
      }
    }
  }
  if (inherited.size) log(`${inherited.size} result(s) the previous process kept for the cloud are sent now`);
}

// Whether it was written (on a stream the cloud welcomed: none is while it is down).
function send(message) {
  if (current) current.write(message);
  return current !== null;
}

// A result neither acknowledged nor refused goes again every RESULT_RESEND_MS until it is, as
// the Python host sends it (host/lease_client.py, RESULT_RESEND_S): a message lost with a
// stream not yet noticed dead, or its answer lost on the way back, is otherwise never answered,
// and the lease runs out under a finished attempt, whose task is then run again.
const RESULT_RESEND_MS = 5000;
const resends = new Map(); // lease id -> the timer of its result's next resend
function resendUnanswered(leaseId) {
  clearTimeout(resends.get(leaseId));
  const timer = setTimeout(() => {
    resends.delete(leaseId);
    if (!results.has(leaseId)) return;
    send(results.get(leaseId));
    resendUnanswered(leaseId);
  }, RESULT_RESEND_MS);
  resends.set(leaseId, timer);
}

// Lets a lease go: its result was acknowledged or refused, or the cloud said the attempt is over.
function release(leaseId, stream, state) {
  if (results.has(leaseId)) {
    if (!inherited.delete(leaseId) && !refused.delete(leaseId)) state.done += 1;
    dropResult(leaseId);
  }
  held.delete(leaseId);
  results.delete(leaseId);
  lateTried.delete(leaseId);
  clearTimeout(resends.get(leaseId));
  resends.delete(leaseId);
  expiries.delete(leaseId);
  wake();
  if (TASKS && state.done >= TASKS && !results.size) stream.end();
}

// AMC_TASKS: once its last task has begun, this process takes no more. It tells the cloud
// (HostStopping: no assignment on this stream after it), and refuses one already on its way,
// as a stopping host does (`handBack`). Run instead, such a task outlived the stream its result
// needed, and that result, resent every 5 s, kept the process from ever exiting.
const lastTaskBegun = () => TASKS && started >= TASKS;

// Why an assignment cannot start here ([its TaskResult.refusal, the result's words]), or null
// when it can: the Python host's checks, in its order and with its words (host/lease_client.py,
// `_cannot_run`). The cloud sends one only in a race (it had not yet read HostStopping, the
// phone's last DeviceUpdate, or which phones hold attempts); run, it drove a busy phone
// alongside the attempt already on it, or used one of the task's attempts on a phone that
// could not run it. A phone still running an attempt told to stop counts as busy: the Python
// host queues the new attempt behind it, this one refuses it and the cloud tries another phone.
function cannotRun(a) {
  const serial = a.device_serial;
  if (stopping || lastTaskBegun()) return ['ASSIGNMENT_REFUSAL_HOST_STOPPING', 'the host is stopping'];
  if (dataFolder.why) return ['ASSIGNMENT_REFUSAL_DATA_FOLDER_UNWRITABLE', dataFolder.why];
  const phone = phones.get(serial);
  if (!phone) return ['ASSIGNMENT_REFUSAL_PHONE_NOT_ATTACHED', `phone ${serial} is not attached to this host`];
  if (unhealthy.has(serial)) return ['ASSIGNMENT_REFUSAL_PHONE_UNHEALTHY', unhealthy.get(serial).words];
  if (phone.state !== 'DEVICE_STATE_ONLINE') return ['ASSIGNMENT_REFUSAL_PHONE_OFFLINE', `phone ${serial} is offline`];
  if ([...running.keys()].some((leaseId) => held.get(leaseId)?.device_serial === serial)) {
    return ['ASSIGNMENT_REFUSAL_PHONE_BUSY', `phone ${serial} is busy with another task`];
  }
  return null;
}

// Nothing ran, so the cloud queues the task again at once without counting the attempt
// (`retryable` for a cloud from before refusals).
function refuse(a, [refusal, why]) {
  log(`assignment ${a.task_id} on ${a.device_serial} refused: ${why}`);
  const lease = { task_id: a.task_id, attempt: a.attempt, lease_id: a.lease_id };
  held.set(a.lease_id, { ...lease, device_serial: a.device_serial });
  refused.add(a.lease_id);
  answer(a.lease_id, { ...lease, status: 'TASK_STATUS_FAILED', summary: why, retryable: true, refusal });
}

// A rejection naming `taskId` answered its attempt's oldest renewal out, when no result of that
// task waits here (it could answer that) and one attempt of it has renewals out: left there,
// every later answer would be matched with an ever older send (a cloud whose database was down
// rejects many), its lease counted too short for good. Ambiguous, it stays: an under-estimate,
// never an over-estimate (host/lease_client.py, `_renewal_refused`).
function renewalRefused(taskId) {
  if (!taskId || [...results.values()].some((m) => m.result.task_id === taskId)) return;
  const out = [...running.values()].filter((attempt) => attempt.lease.task_id === taskId && attempt.out.length);
  if (out.length === 1) out[0].out.shift();
}

// One stream, from hello to its end: resolves with how it ended ({ code, details }).
function session(state) {
  const stream = leases.Lease();
  opened = stream;
  const devices = reported();
  // A new stream: the old one's answers never come (`confirmedFor`). The hello's resume of a
  // lease it names counts its term from here.
  for (const attempt of running.values()) attempt.out.length = 0;
  // Named: the attempts running here and the results waiting for their answer, but not a
  // retryable one of this process (a refused assignment's among them: nothing of it ran here),
  // as the Python host names them (host/lease_client.py, `_hello`, `_result_phone`): there is
  // nothing to keep such a lease for, and named, the cloud kept it (or gave a lapsed one a new
  // term) until the result came, holding the task back from the next attempt that result asks
  // for. A previous process's results are all named, as the Python host names them.
  const named = [...held.keys()].filter((leaseId) => inherited.has(leaseId) || !results.get(leaseId)?.result.retryable);
  const helloSent = new Map(named.map((leaseId) => [leaseId, now()]));
  stream.write({
    hello: {
      devices,
      agent_version: 'amc-node-host/0.2.0',
      planner_transport: 'PLANNER_TRANSPORT_CLOUD',
      process_id: PROCESS_ID,
      held_assignments: named.map((leaseId) => held.get(leaseId)),
    },
  });
  stream.on('data', (msg) => {
    switch (msg.kind) {
      case 'welcome':
        log(`connected as ${msg.welcome.host_id} with ${devices.map((d) => d.serial).join(', ')}`);
        if (notConnecting.unresolved) log(notConnecting.back(connectedWith !== null));
        else notConnecting.connected();
        state.welcomed = true;
        current = stream;
        connectedWith = madeFrom; // `stream` was made from those (`connectable`)
        if (lastTaskBegun()) stream.write({ stopping: {} });
        // The phones changed between the hello and its answer: the update would have been lost.
        if (listed(reported()) !== listed(devices)) send({ device_update: { devices: reported() } });
        for (const [leaseId, result] of results) if (!unsent.has(leaseId)) stream.write(result); // `answer` sends those
        // Every lease renewed on the new stream at once (within the rate limit), as the Python
        // host renews them (`_on_welcome`): before, the next renewal waited for its interval,
        // and a lease shorter than that left to run out (a cloud that was down may have given
        // it a short new term) paused its attempt, the cloud there all along.
        for (const attempt of running.values()) attempt.renewSoon();
        saidWelcome(); // steps waiting for the cloud ask again now
        break;
      case 'assignment': {
        const a = msg.assignment;
        if (!a.lease_id) {
          // Nothing can be answered for it (renewals, results and the next hello name the
          // lease): held, it was named with an empty id in every hello after. The cloud's
          // lease, if any, runs out and the task is queued again.
          log(`assignment ${a.task_id} on ${a.device_serial} ignored: it has no lease id`);
          break;
        }
        // An assignment of a lease held here re-confirms it, whatever `resumed` says (a cloud
        // from before the field, a duplicate), as the Python host takes it (`_on_assignment`):
        // checked as a new one, an attempt running here was refused (its phone busy with that
        // very attempt) under its own lease, which ended it at the cloud while it ran on, and
        // one whose result waits for its answer (or a previous process's) was run again.
        // `resumed` alone is not enough: a resume of a lease this process never held (a cloud
        // that confused its hosts' leases, a foreign one) had its expiry set and ran nothing,
        // while the cloud counted it running here until it ran out. The Python host runs it as
        // a new assignment (it keys on the attempt it holds, not on the flag): so does host.js.
        const again = held.has(a.lease_id);
        const refusal = again ? null : cannotRun(a);
        if (refusal) {
          refuse(a, refusal);
          break;
        }
        expiries.set(a.lease_id, leaseEnd(a.lease_remaining, a.lease_expires_at, leaseMs(a), helloSent.get(a.lease_id)));
        helloSent.delete(a.lease_id);
        // resumed: a lease this process listed, confirmed; its task runs on, a paused one
        // continues (or its result, kept, was sent again above).
        if (again) {
          running.get(a.lease_id)?.resumed(a);
          confirmed(a.lease_id);
          break;
        }
        started += 1;
        if (lastTaskBegun()) stream.write({ stopping: {} });
        runTask(a);
        break;
      }
      case 'renewed': {
        const leaseId = msg.renewed.lease_id;
        const sent = confirmedFor(leaseId);
        if (held.has(leaseId)) {
          const { lease_remaining: remaining, lease_expires_at: expiresAt } = msg.renewed;
          expiries.set(leaseId, leaseEnd(remaining, expiresAt, running.get(leaseId)?.leaseMs ?? DEFAULT_LEASE_MS, sent));
          confirmed(leaseId);
        }
        break;
      }
      case 'revoked': {
        const { lease_id: leaseId, reason, message } = msg.revoked;
        const kept = results.get(leaseId);
        if (kept && reason === 'REVOKE_REASON_EXPIRED' && kept.result.status !== 'TASK_STATUS_CANCELLED' && !lateTried.has(leaseId)) {
          // The lease ran out while its result waited (the cloud or its database was away):
          // the cloud still takes it as late while no other attempt has started, so the
          // finished work is not run again. Sent once more, as the Python host sends it (by
          // `answer` once kept, if it is still being kept).
          lateTried.add(leaseId);
          if (!unsent.has(leaseId)) send(kept);
          break;
        }
        const attempt = running.get(leaseId);
        if (attempt?.paused && reason === 'REVOKE_REASON_EXPIRED' && !revoked.has(leaseId)) {
          // Paused by this host's clock, then ended by the cloud's expiry: answered with the
          // retryable UNREACHABLE (`runTask`), as the Python host answers it (`_on_revoked`):
          // that result is how the cloud hears this host is back, and the task runs again at
          // once. Without it the cloud held new work back from the host for its keepalive window.
          expiries.delete(leaseId);
          attempt.stop.abort(new Error(UNREACHABLE));
          break;
        }
        if (!revoked.has(leaseId)) revoked.set(leaseId, { reason, message: message || 'revoked' }); // the first says why
        // The step under way stops at once (every wait of the attempt ends at its stop), as the
        // Python host's does (`_on_revoked`): a cancel is answered now, not after a hung look.
        running.get(leaseId)?.stop.abort(new Error(revoked.get(leaseId).message));
        release(leaseId, stream, state);
        break;
      }
      case 'result_ack':
        release(msg.result_ack.lease_id, stream, state);
        break;
      case 'rejected': {
        // Rejected names a task, neither the attempt nor the message (lease_service.proto):
        // refused for good, every result of that task held here goes, as the Python host lets
        // each go (`_handle`); UNAVAILABLE, every result held is sent again shortly, as it
        // sends them (`_schedule_resend`).
        const { code, message, task_id: taskId } = msg.rejected;
        log(`cloud rejected a message (code ${code}): ${message}`);
        renewalRefused(taskId);
        if (code === grpc.status.UNAVAILABLE) {
          setTimeout(() => {
            for (const [leaseId, result] of results) if (!unsent.has(leaseId)) send(result);
          }, 1000);
          break;
        }
        const leaseIds = [...results.keys()].filter((id) => taskId && results.get(id).result.task_id === taskId);
        for (const leaseId of leaseIds) {
          const { attempt } = results.get(leaseId).result;
          log(`result of ${taskId}/${attempt} dropped: the cloud rejected it (code ${code}): ${message}`);
          release(leaseId, stream, state);
        }
        break;
      }
      case 'superseded':
        state.superseded = msg.superseded.message;
        break;
      default:
    }
  });
  return new Promise((resolve) => {
    const ended = (code, details) => {
      if (current === stream) current = null;
      wake();
      resolve({ code, details });
    };
    stream.on('status', (s) => ended(s.code, s.details));
    stream.on('error', (err) => ended(err.code, err.details || err.message));
  });
}

// Reads adb's list (one read at a time: a slow one is not piled on, a caller joins it) and
// tells the cloud of a change on the live stream. Every POLL_MS, and when a phone fails a task.
let polling = null;
// A running attempt's phone that adb no longer lists online is given PHONE_LOST_GRACE_MS to
// come back (a USB blip ends nothing); still gone at a poll after that, the attempt stops with
// the retryable "phone lost", so the cloud releases its lease and queues the task for a phone
// that is there, as the Python host ends it (host/lease_client.py, `_phone_seen`). An attempt
// waiting on its planner kept its lease renewed for as long as the wait lasted, the phone gone.
const PHONE_LOST_GRACE_MS = seconds('AMC_HOST_PHONE_LOST_GRACE_S', 60, { zero: true });
const lostSince = new Map(); // phone id -> when a running attempt's phone was first seen gone
const phoneLostSummary = (serial) =>
  `phone lost: ${serial} was not back in adb within ${PHONE_LOST_GRACE_MS / 1000} s of leaving it`;
// A phone out of sight because no adb server answered (`serverDown`): the fault is the server's,
// and every attempt of the host ends so, not "phone lost" N times over (`adb_down_summary`).
// `reason` says which server and what to do (`noAdbServerReason`).
const adbDownSummary = (serial, reason) =>
  `adb server unreachable: ${serial} was out of sight for ${PHONE_LOST_GRACE_MS / 1000} s: ${reason}`;
// How many times an attempt's phone may leave adb and come back within the grace before its
// next leave ends the attempt at once, as the Python host counts them (host/lease_client.py,
// MAX_PHONE_DROPS; docs/decisions/0087-phone-drops-bound.md): each blip is waited out, but a
// phone on a failing cable or hub that came back within every grace held its task for good.
const MAX_PHONE_DROPS = 3;
const phoneUnsteadySummary = (serial, drops) =>
  `phone unsteady: ${serial} left adb ${drops} times during this attempt (the host waits out ${MAX_PHONE_DROPS}); ` +
  'check its cable, hub or Wi-Fi link';
function watchLostPhones() {
  const attempts = new Map(); // phone id -> its running attempts not revoked
  for (const [leaseId, attempt] of running) {
    const serial = held.get(leaseId)?.device_serial;
    if (serial === undefined || revoked.has(leaseId) || attempt.stop.signal.aborted) continue;
    attempts.set(serial, [...(attempts.get(serial) ?? []), attempt]);
  }
  for (const serial of lostSince.keys()) if (!attempts.has(serial)) lostSince.delete(serial);
  for (const [serial, onIt] of attempts) {
    if (phones.get(serial)?.state === 'DEVICE_STATE_ONLINE') {
      if (lostSince.delete(serial)) log(`phone ${serial} is back in adb within the grace: its attempt goes on`);
      continue;
    }
    let steady = onIt;
    if (!lostSince.has(serial)) {
      // Out of sight because the adb server does not answer is no drop of the phone's: every
      // phone leaves at once, and "phone unsteady" would send the operator to a sound cable
      // (the Python host's `_phone_seen`, `server_down`). Its grace is waited out as any other.
      if (!phones.get(serial)?.serverDown) {
        for (const attempt of onIt) attempt.phoneDrops = (attempt.phoneDrops ?? 0) + 1;
      }
      for (const attempt of onIt.filter((a) => (a.phoneDrops ?? 0) > MAX_PHONE_DROPS)) {
        endLost(attempt, phoneUnsteadySummary(serial, attempt.phoneDrops));
      }
      steady = onIt.filter((a) => (a.phoneDrops ?? 0) <= MAX_PHONE_DROPS);
      if (steady.length === 0) continue;
      lostSince.set(serial, now());
      log(`phone ${serial} left adb while an attempt runs on it: the attempt ends if it is not back within ${PHONE_LOST_GRACE_MS / 1000} s`);
    }
    if (now() - lostSince.get(serial) < PHONE_LOST_GRACE_MS) continue;
    lostSince.delete(serial);
    const phone = phones.get(serial);
    const summary = phone?.serverDown ? adbDownSummary(serial, phone.adbReason) : phoneLostSummary(serial);
    for (const attempt of steady) endLost(attempt, summary);
  }
}

// An attempt whose phone is lost ends with `summary`, retryable.
function endLost(attempt, summary) {
  log(`task ${attempt.lease.task_id}/${attempt.lease.attempt}: ${summary}`);
  attempt.stop.abort(new Error(summary));
}

function pollPhones() {
  probeUnhealthy();
  polling ||= refreshPhones()
    .then((changed) => {
      watchLostPhones();
      return changed && send({ device_update: { devices: reported() } });
    })
    .catch((err) => log(`device poll failed: ${err.message}`))
    .finally(() => {
      polling = null;
    });
  return polling;
}

// A phone a task failed on that adb no longer lists as a device (unplugged, rebooted, its USB
// debugging revoked): what to tell the operator, as the Python host says it (DeviceGone,
// host/devices/adb_errors.py); null while the phone is there.
const UNAUTHORIZED =
  "USB debugging on it is not allowed for this computer: unlock the phone and accept its 'Allow USB " +
  "debugging?' prompt (tick 'Always allow from this computer'; replugging the cable brings the prompt " +
  'back), then run the task again';
// adb refuses a serial two listed phones share ("more than one device"): another phone with the
// same serial was plugged in while the attempt, which reaches its phone by serial, ran. Its phone
// is there (listed under its id still, reached by transport id from the next poll on), so
// this was read as no phone fault at all and the attempt ended FAILED for good; it ends
// retryable naming the shared serial, in the Python host's words (host/devices/adb_errors.py,
// SHARED_SERIAL).
const SHARED_SERIAL_REFUSED = 'more than one device';
const SHARED_SERIAL =
  'another phone with the same serial was plugged in, and adb refuses a serial two phones share: the host ' +
  'tells them apart by transport id (or USB port) from its next device poll; give the phones their own ' +
  'serials to avoid this';
async function phoneGone(serial, err) {
  await pollPhones();
  if (err.message.includes(SHARED_SERIAL_REFUSED)) {
    return `phone ${serial} is no longer the only phone with its serial in adb: ${SHARED_SERIAL}, then run the task again`;
  }
  const phone = phones.get(serial);
  if (phone?.state === 'DEVICE_STATE_ONLINE') {
    // Found again on its USB port under its id: the attempt ends retryable all the same.
    return err.message === RENUMBERED ? `phone ${serial}: ${RENUMBERED} (${RENUMBERED_USB_REASON})` : null;
  }
  if (phone?.state === 'DEVICE_STATE_UNAUTHORIZED') return `phone ${serial} is unauthorized in adb: ${UNAUTHORIZED}`;
  if (phone?.adbReason === NO_PERMISSIONS) return `phone ${serial} is without permission to its USB device in adb: ${phone.adbReason}, then run the task again`;
  // No adb server answers: the server, not the phone's cable, is what the operator must see to,
  // in the Python host's words (host/devices/adb_errors.py, `no_server`).
  if (adbDown) return `phone ${serial} is out of sight (${err.message}: no adb server): ${noAdbServerReason()}`;
  return `phone ${serial} disconnected (${err.message})`;
}

// --- stopping ------------------------------------------------------------------------------
// Stopped (SIGTERM, SIGINT), the host hands its work back, as the Python host does
// (host/lease_client.py, `_hand_back`): it tells the cloud it takes no new task
// (`HostStopping`; an assignment already on its way is refused), stops each attempt at once (every
// wait of an attempt ends at its stop) with a retryable result, HOST_STOPPED, so the cloud queues
// the task for another host at once instead of when its lease runs out, waits up to STOP_GRACE_MS for the cloud to answer
// its results, then closes its side of the stream and exits 0. What is left unanswered (the
// cloud unreachable) stays on disk and the next start sends it. A second signal stops at once.
const STOP_GRACE_MS = seconds('AMC_HOST_STOP_GRACE_S', 5, { zero: true });
let stopping = null; // the hand back under way, once a signal came
let hurry = false; // a second signal: wait for nothing more

// Wakes whoever waits for a result answered, an attempt ended, a stream ended or a second signal.
const waiters = new Set();
function wake() {
  for (const resolve of waiters) resolve();
  waiters.clear();
}
// Resolves at the next `wake`, or after `millis`.
function woken(millis) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, Math.max(0, millis));
    waiters.add(() => {
      clearTimeout(timer);
      resolve();
    });
  });
}
// Waits until `done()`, `millis` passed or a second signal.
async function until(done, millis) {
  const end = now() + millis;
  while (!done() && !hurry && now() < end) await woken(end - now());
}

async function handBack() {
  send({ stopping: {} });
  if (running.size) log(`stopping: handing ${running.size} attempt(s) back to the cloud (a second SIGINT/SIGTERM stops at once)`);
  for (const { stop } of running.values()) stop.abort(new Error(HOST_STOPPED));
  // Every wait of an attempt ends at its stop (`bounded` in runTask), so each ends at once. One
  // still running after the grace (a wait added without that bound: none in this file reaches
  // here now, so no test does) is handed back all the same, as the Python host hands back a
  // step stuck on its phone.
  await until(() => running.size === 0, STOP_GRACE_MS);
  // A dump an attempt's stop abandoned is killed before the host goes (`dumpOnce`): left
  // running, it would fail the looks of whatever drives the phone next.
  if (cleanups.size) log(`stopping: ending ${cleanups.size} stuck uiautomator dump(s) first (up to ${Math.max(STOP_GRACE_MS, CLEANUP_AT_STOP_MS) / 1000} s)`);
  await until(() => cleanups.size === 0, Math.max(STOP_GRACE_MS, CLEANUP_AT_STOP_MS));
  // A lease the cloud took back meanwhile is no longer `held` (`release`): its attempt is answered
  // as `runTask` would answer it (a cancel with CANCELLED, another revoke not at all).
  for (const [leaseId, { lease }] of [...running]) {
    if (hurry) break;
    running.delete(leaseId);
    const taken = revoked.get(leaseId);
    log(`task ${lease.task_id}: its step did not end within ${STOP_GRACE_MS / 1000} s; handed back without it`);
    if (taken && taken.reason !== 'REVOKE_REASON_CANCELLED') continue;
    const [status, summary] = taken ? ['TASK_STATUS_CANCELLED', taken.message] : ['TASK_STATUS_FAILED', HOST_STOPPED];
    answer(leaseId, { ...lease, status, summary, retryable: !taken });
  }
  if (results.size && current) log(`waiting up to ${STOP_GRACE_MS / 1000} s for the cloud to answer ${results.size} result(s)`);
  await until(() => results.size === 0 || !current, STOP_GRACE_MS);
  if (results.size) {
    // One whose write the disk refused, or that has not returned (`unkept`, `unsent`), is in
    // memory only: it goes with this process, as the Python host says of it (`_hand_back`).
    const lost = [...results.keys()].filter((leaseId) => unkept.has(leaseId) || unsent.has(leaseId)).length;
    const kept = `kept on disk and sent by the next start`;
    log(
      `stopping with ${results.size} result(s) the cloud has not answered: ` +
        (lost
          ? `${results.size - lost} ${kept}, ${lost} not (the data folder refused or hung its write): lost, the cloud ends those attempts when their leases run out`
          : kept),
    );
  }
  const stream = current;
  if (stream) {
    stream.end(); // our side is done: the cloud ends the stream (OK)
    await until(() => current !== stream, 1000);
  }
  opened?.cancel(); // one still opening, or one the cloud did not end
}

function onSignal(signal) {
  if (stopping) {
    log(`${signal} again: stopping at once`);
    hurry = true;
    wake();
    return;
  }
  log(`${signal}: stopping`);
  stopping = handBack();
  wake();
}
process.on('SIGTERM', onSignal);
process.on('SIGINT', onSignal);

async function main() {
  await inheritResults();
  await onDisk('probe', path.join(RESULTS_DIR, PROBE_NAME), PROBE_BYTES).catch((err) => {
    diskRefused(err);
    if (!dataFolder.why) log(`could not write the data folder ${path.resolve(DATA_DIR)}: ${err.message}`);
  });
  await refreshPhones();
  const watcher = setInterval(pollPhones, POLL_MS);
  const state = { done: 0, failures: 0, welcomed: false, superseded: '' };
  while (!stopping) {
    // The certificate files, read and checked before each connection (`connectable`): one the
    // cloud would refuse stops the host at its start (5), and later is checked again after
    // RECONNECT_MAX_MS, as `amc host run` checks it; new ones (issued again while the host
    // runs) are presented from this connection on. A read that hangs on its disk is tried
    // again, as a lost stream is; a signal meanwhile stops the host.
    let read = false;
    const ready = connectable().finally(() => {
      read = true;
      wake();
    });
    ready.catch(() => {}); // awaited below, once read
    while (!read && !stopping) await woken(WRITE_WAIT_MS);
    if (stopping) break;
    const unready = await ready.then(
      () => null,
      (err) => {
        if (!err.hung && !err.unusable && !err.unreadable && !err.vanished) throw err;
        return err;
      },
    );
    const { code, details } = unready ? {} : await session(state);
    if (stopping) break;
    if (state.superseded) {
      // Another process took this certificate's stream (a restart, a second copy): this one
      // stops, as `amc host run` does, with 0: it did nothing wrong, and a supervisor that
      // restarted it on a failure code would have the two take the stream from each other.
      log(`stopping: ${state.superseded}. Another process uses this host's certificate; this one does not reconnect`);
      break;
    }
    // The cloud refused the certificate this host connected with (revoked: the last step of
    // rotating it, once the new one is issued) while its files hold a new one, which a
    // stream that never ended had given it no connection to present: it connects with that
    // (`connectable`). A refusal of the certificate its files hold is final.
    const refusedIdentity = code === grpc.status.UNAUTHENTICATED || code === grpc.status.PERMISSION_DENIED;
    if (FINAL.has(code) && !(refusedIdentity && (await filesReplaced()))) {
      throw Object.assign(new Error(details), { code, exitCode: EXIT.CLOUD });
    }
    if (FINAL.has(code)) log(`the cloud refused the certificate this host connected with (code ${code}: ${details}); its files hold another one`);
    if (code === grpc.status.UNIMPLEMENTED) {
      throw Object.assign(new Error(notACloud(details)), { exitCode: EXIT.CLOUD });
    }
    if (TASKS && state.done >= TASKS) break;
    let delay = backoff(failedInARow(state));
    if (!unready) notConnecting.passed();
    if (unready?.unusable) {
      // As `amc host run` says it (host/lease_client.py): new files are read at the next try.
      delay = RECONNECT_MAX_MS;
      const said = notConnecting.said(unready.unusable);
      if (said) log(`${said}: ${unready.unusable}; install a new one (\`amc certs host DIR ${HOST_ID}\`). Checking again in ${(delay / 1000).toFixed(0)} s`);
    } else if (unready?.vanished) {
      const said = notConnecting.said(unready.vanished);
      if (said) log(`${said}: ${unready.vanished}; put it back (copied in under another name, then renamed into place with \`mv\`). Checking again in ${(delay / 1000).toFixed(1)} s`);
    } else if (unready) {
      // Files that hang on their disk or cannot be read: said once per problem too, as
      // `amc host run` says them (host/lease_client.py); a line at each attempt filled the log.
      const said = notConnecting.said(unready.message, unready.hung ? 'hung' : 'unreadable');
      if (said) log(`${said}: ${unready.message}; reconnecting in ${(delay / 1000).toFixed(1)} s`);
    } else {
      log(`lease stream lost (code ${code}: ${details}); reconnecting in ${(delay / 1000).toFixed(1)} s`);
    }
    const end = now() + delay;
    while (!stopping && now() < end) await woken(end - now());
  }
  await stopping;
  clearInterval(watcher);
  closeAdbWatch();
  await closeDisk();
  certReading?.kill('SIGKILL'); // a read of the certificate files still hung on its disk
  if (leases !== null) leases.close();
  if (planner !== null) planner.close();
  return state.superseded ? EXIT.OK : undefined;
}

if (require.main === module) {
  main()
    // Timers of results left unanswered would keep it up.
    .then((code) => (stopping || code !== undefined) && process.exit(code ?? EXIT.OK))
    .catch((err) => {
      log(`error: ${err.code !== undefined ? `code ${err.code}: ` : ''}${err.details || err.message}`);
      process.exit(err.exitCode ?? EXIT.INTERNAL);
    });
} else {
  // Required rather than run: what tests/node/host_parts.js checks of paths no whole run reaches.
  module.exports = {
    handBack, running, held, revoked, results, act, adb, dataFolder, diskRefused, probeDataFolder,
    backoff, failedInARow, expiries, now, PROGRESS_RENEW_MIN_MS,
  };
}
