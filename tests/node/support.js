// What gpuexec.test.js drives the daemon with: the service loaded from the
// .proto at run time, a daemon of the test's own, calls as promises,
// status checks, test data, and a TLS fixture made with the openssl
// command.
'use strict';

const assert = require('node:assert/strict');
const { execFileSync, spawn } = require('node:child_process');
const { createHash, randomBytes } = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const MiB = 1024 * 1024;
const STARTUP_DEADLINE_MS = 20000;
const CALL_DEADLINE_MS = 60000;

const PROTO = process.env.GPUEXEC_PROTO ||
    path.join(__dirname, '..', '..', 'proto', 'gpuexec', 'v1', 'gpuexec.proto');

// Field names as in the .proto (snake_case); 64-bit integers as decimal
// strings both ways, so a handle above 2^53 survives intact.
const packageDefinition = protoLoader.loadSync(PROTO, {
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});
const GpuExec = grpc.loadPackageDefinition(packageDefinition).gpuexec.v1.GpuExec;

function requireEnv(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (see tests/node/README.md)`);
  return value;
}

// ------------------------------------------------------------------ daemon

// Starts gpuexecd with `args` (which listen on a free loopback port);
// resolves with the process, the port and a function returning everything
// it has logged so far.
function startDaemon(daemon, driver, args) {
  return new Promise((resolve, reject) => {
    const child = spawn(daemon, [`--driver=${driver}`, ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let log = '';
    let settled = false;
    const settle = (fn, value) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      fn(value);
    };
    const timer = setTimeout(() => {
      settle(reject, new Error(
          `gpuexecd did not report serving within ${STARTUP_DEADLINE_MS} ms; its log:\n${log}`));
    }, STARTUP_DEADLINE_MS);
    const onOutput = (data) => {
      log += data.toString();
      const m = /gpuexecd serving gpuexec\.v1 on 127\.0\.0\.1:(\d+)/.exec(log);
      if (m) settle(resolve, { child, port: Number(m[1]), log: () => log });
    };
    child.stdout.on('data', onOutput);
    child.stderr.on('data', onOutput);
    child.on('error', (err) => settle(reject, new Error(`cannot run ${daemon}: ${err.message}`)));
    child.on('exit', (code, signal) => settle(reject, new Error(
        `gpuexecd exited (code ${code}, signal ${signal}) before serving; its log:\n${log}`)));
  });
}

// SIGTERM, then SIGKILL if it has not exited within the grace period.
function stopDaemon(child, graceMs = 10000) {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
    child.once('exit', () => {
      clearTimeout(timer);
      resolve();
    });
    child.kill('SIGTERM');
  });
}

// ------------------------------------------------------------- RPC helpers

function deadline() {
  return Date.now() + CALL_DEADLINE_MS;
}

function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: deadline() }, (err, response) => {
      if (err) reject(err);
      else resolve(response);
    });
  });
}

// A client stream: sends `messages` in order, honouring flow control, and
// resolves with the single response.
function clientStream(client, method, messages) {
  return new Promise((resolve, reject) => {
    const call = client[method]({ deadline: deadline() }, (err, response) => {
      if (err) reject(err);
      else resolve(response);
    });
    (async () => {
      for (const message of messages) {
        if (!call.write(message)) await new Promise((r) => call.once('drain', r));
      }
      call.end();
    })().catch(reject);
  });
}

// A server stream: resolves with every response message in order.
function serverStream(client, method, request) {
  return new Promise((resolve, reject) => {
    const messages = [];
    const call = client[method](request, { deadline: deadline() });
    call.on('data', (m) => messages.push(m));
    call.on('error', reject);
    call.on('end', () => resolve(messages));
  });
}

// Asserts that `promise` fails with gRPC status `code` and a message that
// matches every regular expression in `patterns`.
async function assertStatus(promise, code, patterns) {
  const name = Object.keys(grpc.status).find((k) => grpc.status[k] === code);
  await assert.rejects(promise, (err) => {
    assert.equal(err.code, code,
        `expected ${name}, got code ${err.code} (${err.details})`);
    for (const p of patterns) assert.match(err.details, p);
    return true;
  });
}

// -------------------------------------------------------------------- data

// saxpy inputs chosen so that a * x[i] + y[i] is exact in float32: the
// result is the same whether the kernel fuses the multiply-add or not, and
// every element can be compared for equality. Neighbouring elements differ,
// so a chunk landing at the wrong offset shows.
const A = 2.5;
function xAt(i) { return ((i * 7919) % 4096) / 16 - 128; }
function yAt(i) { return ((i * 104729) % 8191) / 8 - 512; }

function floatsToBuffer(n, f) {
  const buf = Buffer.alloc(n * 4);
  for (let i = 0; i < n; ++i) buf.writeFloatLE(f(i), i * 4);
  return buf;
}

function chunksOf(buf, size) {
  const chunks = [];
  for (let at = 0; at < buf.length; at += size) chunks.push(buf.subarray(at, at + size));
  return chunks;
}

// ------------------------------------------------------------ TLS, tenants

// Runs `openssl` with `args` in `cwd`; throws with its stderr if it fails.
function openssl(cwd, args) {
  try {
    execFileSync('openssl', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (err) {
    throw new Error(`openssl ${args.join(' ')} failed: ${err.stderr || err.message}`);
  }
}

function haveOpenssl() {
  try {
    execFileSync('openssl', ['version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

const EC_KEY = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];

// A CA, a certificate for the daemon on 127.0.0.1 and localhost signed by
// it, and a tenants file of two tenants with a bearer token each. Returns
// the daemon's flags for them, the CA's PEM and the tokens.
function makeTlsFixture(dir) {
  fs.writeFileSync(path.join(dir, 'openssl.cnf'), [
    '[req]', 'distinguished_name = dn', 'prompt = no', '[dn]', 'CN = gpuexec test CA',
    '[ca]', 'basicConstraints = critical, CA:TRUE', 'keyUsage = critical, keyCertSign, cRLSign',
    'subjectKeyIdentifier = hash', ''].join('\n'));
  openssl(dir, ['req', '-x509', '-new', ...EC_KEY, '-keyout', 'ca.key', '-out', 'ca.crt',
    '-days', '2', '-config', 'openssl.cnf', '-extensions', 'ca', '-subj', '/CN=gpuexec test CA']);
  openssl(dir, ['req', '-new', ...EC_KEY, '-keyout', 'server.key', '-out', 'server.csr',
    '-config', 'openssl.cnf', '-subj', '/CN=localhost']);
  fs.writeFileSync(path.join(dir, 'server.ext'), [
    'basicConstraints = CA:FALSE', 'authorityKeyIdentifier = keyid',
    'subjectAltName = IP:127.0.0.1, DNS:localhost', 'keyUsage = critical, digitalSignature',
    'extendedKeyUsage = serverAuth', ''].join('\n'));
  openssl(dir, ['x509', '-req', '-in', 'server.csr', '-CA', 'ca.crt', '-CAkey', 'ca.key',
    '-set_serial', '2', '-days', '2', '-out', 'server.crt', '-extfile', 'server.ext']);

  const newToken = () => randomBytes(24).toString('base64url');
  const tokens = { a: newToken(), b: newToken() };
  const digest = (t) => createHash('sha256').update(t).digest('hex');
  const tenants = path.join(dir, 'tenants.textproto');
  fs.writeFileSync(tenants,
      `tenant { name: "team-a" token_sha256: "${digest(tokens.a)}" }\n` +
      `tenant { name: "team-b" token_sha256: "${digest(tokens.b)}" }\n`);
  return {
    caPem: fs.readFileSync(path.join(dir, 'ca.crt')),
    flags: [
      `--tls_cert=${path.join(dir, 'server.crt')}`,
      `--tls_key=${path.join(dir, 'server.key')}`,
      `--tenants=${tenants}`,
    ],
    tokens,
  };
}

// TLS trusting `caPem`, and when `token` is given, call credentials that
// send it as `authorization: Bearer <token>` with every call (gRPC sends
// call credentials over TLS only). Each client gets a connection of its own.
function tlsClient(port, caPem, token) {
  let credentials = grpc.credentials.createSsl(caPem);
  if (token !== undefined) {
    credentials = grpc.credentials.combineChannelCredentials(credentials,
        grpc.credentials.createFromMetadataGenerator((_params, callback) => {
          const metadata = new grpc.Metadata();
          metadata.set('authorization', `Bearer ${token}`);
          callback(null, metadata);
        }));
  }
  return new GpuExec(`127.0.0.1:${port}`, credentials, {
    'grpc.use_local_subchannel_pool': 1,
    // The name checked against the certificate, and sent as SNI (which
    // takes no IP address); the certificate has both.
    'grpc.ssl_target_name_override': 'localhost',
  });
}

function waitForReady(client) {
  return new Promise((resolve, reject) => {
    client.waitForReady(Date.now() + STARTUP_DEADLINE_MS, (err) => (err ? reject(err) : resolve()));
  });
}

// grpc.health.v1 Check of the whole server, as raw bytes (no .proto for
// it here): 08 01 is SERVING.
function healthCheck(client) {
  return new Promise((resolve, reject) => {
    client.makeUnaryRequest('/grpc.health.v1.Health/Check', (b) => b, (b) => b, Buffer.alloc(0),
        { deadline: deadline() }, (err, response) => (err ? reject(err) : resolve(response)));
  });
}

module.exports = {
  MiB,
  GpuExec,
  requireEnv,
  startDaemon,
  stopDaemon,
  unary,
  clientStream,
  serverStream,
  assertStatus,
  A,
  xAt,
  yAt,
  floatsToBuffer,
  chunksOf,
  openssl,
  haveOpenssl,
  makeTlsFixture,
  tlsClient,
  waitForReady,
  healthCheck,
};
