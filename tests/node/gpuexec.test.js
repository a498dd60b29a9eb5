// gpuexec.v1 from Node.js with nothing but the .proto: no generated code, no
// gpuexec library. Starts a real gpuexecd, then drives the whole API through
// @grpc/grpc-js with the service description loaded at run time.
//
// Environment:
//   GPUEXEC_DAEMON          the gpuexecd executable
//   GPUEXEC_TEST_DRIVER     the CUDA driver library it opens (the libcuda test
//                           double, or libcuda.so.1)
//   GPUEXEC_TEST_KERNELS    a directory holding gx_kernels.cubin
//   GPUEXEC_PROTO           gpuexec.proto (default: ../../proto/gpuexec/v1/)
//   GPUEXEC_TEST_ALLOW_SKIP 1: a host with no usable device, or without the
//                           kernel image, skips the suite instead of failing
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const { createHash } = require('node:crypto');
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

// Starts gpuexecd on a free loopback port; resolves with the process, the
// port and a function returning everything it has logged so far.
function startDaemon(daemon, driver) {
  return new Promise((resolve, reject) => {
    const child = spawn(daemon, [`--driver=${driver}`, '--listen=127.0.0.1:0'], {
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

// --------------------------------------------------------------- the suite

describe('gpuexec.v1 from Node.js', () => {
  let daemon = null;
  let client = null;
  let image = null;
  let skip = null;
  let failed = false;

  const N = (3 * MiB) / 4;  // floats per buffer: 3 MiB
  const SHA256 = () => createHash('sha256').update(image).digest('hex');
  // State carried from one step to the next.
  const s = {};

  before(async () => {
    const allowSkip = process.env.GPUEXEC_TEST_ALLOW_SKIP === '1';
    const kernels = requireEnv('GPUEXEC_TEST_KERNELS');
    const cubin = path.join(kernels, 'gx_kernels.cubin');
    if (!fs.existsSync(cubin)) {
      const reason = `kernel image ${cubin} is missing`;
      if (!allowSkip) throw new Error(reason);
      skip = reason;
      return;
    }
    image = fs.readFileSync(cubin);

    const driver = requireEnv('GPUEXEC_TEST_DRIVER');
    daemon = await startDaemon(requireEnv('GPUEXEC_DAEMON'), driver);
    // Backstop: never leave the daemon behind, whatever ends this process.
    process.once('exit', () => daemon.child.kill('SIGKILL'));

    client = new GpuExec(`127.0.0.1:${daemon.port}`, grpc.credentials.createInsecure());
    await new Promise((resolve, reject) => {
      client.waitForReady(Date.now() + STARTUP_DEADLINE_MS, (err) => (err ? reject(err) : resolve()));
    });

    const { devices } = await unary(client, 'ListDevices', {});
    if (devices.length === 0) {
      const reason = `driver ${driver} has no usable device`;
      if (!allowSkip) throw new Error(reason);
      skip = reason;
    }
  });

  after(async () => {
    if (client) client.close();
    if (daemon) {
      await stopDaemon(daemon.child);
      if (failed) console.error(`gpuexecd log:\n${daemon.log()}`);
    }
    if (skip) {
      // The marker ctest's SKIP_REGULAR_EXPRESSION looks for: printed only
      // when the whole suite was skipped.
      console.log(`GPUEXEC NODE CLIENT SKIPPED: ${skip}`);
    }
  });

  // Each step builds on the one before; a skipped suite skips them all.
  const step = (name, fn) => it(name, async (t) => {
    if (skip) return t.skip(skip);
    try {
      return await fn(t);
    } catch (err) {
      failed = true;
      throw err;
    }
  });

  step('lists the devices', async () => {
    const { devices } = await unary(client, 'ListDevices', {});
    assert.ok(devices.length >= 1);
    const d = devices[0];
    assert.equal(d.index, 0);
    assert.ok(d.name.length > 0, 'device name is empty');
    assert.equal(d.healthy, true);
    assert.ok(d.compute_capability_major >= 1);
    assert.ok(d.multiprocessor_count >= 1);
    assert.ok(BigInt(d.memory_total_bytes) > 0n);
    assert.ok(BigInt(d.memory_free_bytes) <= BigInt(d.memory_total_bytes));
    assert.equal(d.sessions, 0);
  });

  step('opens a session', async () => {
    const r = await unary(client, 'OpenSession', { lease_ms: 60000 });
    assert.match(r.session, /^[0-9a-f]{32}$/);
    assert.equal(r.lease_ms, '60000');
    s.session = r.session;
    s.device = r.device;
    const { devices } = await unary(client, 'ListDevices', {});
    const d = devices.find((x) => x.index === r.device);
    assert.equal(d.sessions, 1);
    s.moduleLoadsBefore = BigInt(d.module_loads_total);
  });

  step('uploads the module: header alone first, then header and chunks', async () => {
    const sha256 = SHA256();
    const header = { session: s.session, sha256, size: String(image.length), kind: 'MODULE_KIND_CUBIN' };
    // The cheap way first: a fresh daemon does not hold the image.
    await assertStatus(clientStream(client, 'LoadModule', [{ header }]),
        grpc.status.NOT_FOUND, [new RegExp(sha256.slice(0, 12))]);
    // Then the bytes, in chunks small enough that there are several.
    const chunkSize = Math.max(1, Math.ceil(image.length / 3));
    const messages = [{ header }, ...chunksOf(image, chunkSize).map((chunk) => ({ chunk }))];
    assert.ok(messages.length >= 3);
    const r = await clientStream(client, 'LoadModule', messages);
    assert.equal(r.sha256, sha256);
    assert.equal(r.uploaded, true);
    assert.notEqual(r.module, '0');
    s.module = r.module;
  });

  step('gets gx_saxpy and its parameter layout', async () => {
    const r = await unary(client, 'GetFunction', { session: s.session, module: s.module, name: 'gx_saxpy' });
    // gx_saxpy(float a, const float* x, float* y, uint64_t n)
    assert.deepEqual(r.params, [
      { offset: '0', size: '4' },
      { offset: '8', size: '8' },
      { offset: '16', size: '8' },
      { offset: '24', size: '8' },
    ]);
    assert.ok(r.attributes.max_threads_per_block >= 256);
    assert.notEqual(r.function, '0');
    s.saxpy = r.function;

    await assertStatus(
        unary(client, 'GetFunction', { session: s.session, module: s.module, name: 'gx_no_such_kernel' }),
        grpc.status.NOT_FOUND, [/gx_no_such_kernel/]);
  });

  step('allocates two 3 MiB buffers and writes them in chunks', async () => {
    const bytes = N * 4;
    for (const name of ['x', 'y']) {
      const r = await unary(client, 'Allocate', { session: s.session, size: String(bytes) });
      assert.equal(r.size, String(bytes));
      s[name] = r.buffer;
    }
    assert.notEqual(s.x, s.y);

    // x: three 1 MiB messages, the first naming the buffer and carrying data.
    const x = floatsToBuffer(N, xAt);
    const xChunks = chunksOf(x, MiB);
    assert.equal(xChunks.length, 3);
    const wx = await clientStream(client, 'Write', xChunks.map((data, k) =>
        (k === 0 ? { session: s.session, buffer: s.x, offset: '0', data } : { data })));
    assert.equal(wx.bytes_written, String(bytes));

    // y: a first message with no data, then 768 KiB chunks.
    const y = floatsToBuffer(N, yAt);
    const wy = await clientStream(client, 'Write', [
      { session: s.session, buffer: s.y, offset: '0' },
      ...chunksOf(y, 768 * 1024).map((data) => ({ data })),
    ]);
    assert.equal(wy.bytes_written, String(bytes));
  });

  step('launches gx_saxpy with typed arguments and synchronizes', async () => {
    const r = await unary(client, 'Launch', {
      session: s.session,
      function: s.saxpy,
      grid: { x: Math.ceil(N / 256) },
      block: { x: 256 },
      args: [
        { f32: A },
        { buffer: { buffer: s.x, offset: '0' } },
        { buffer: { buffer: s.y } },
        { u64: String(N) },
      ],
    });
    assert.equal(r.gpu_time_ns, '0');  // Not asked to synchronize.
    const sync = await unary(client, 'Synchronize', { session: s.session });
    assert.match(sync.gpu_time_ns, /^\d+$/);
  });

  step('reads y back as a stream and checks every element', async () => {
    const parts = await serverStream(client, 'Read', { session: s.session, buffer: s.y });
    // The default chunk: 1 MiB, in offset order.
    assert.deepEqual(parts.map((p) => p.offset), ['0', String(MiB), String(2 * MiB)]);
    const y = Buffer.concat(parts.map((p) => p.data));
    assert.equal(y.length, N * 4);
    let mismatches = 0;
    let first = null;
    for (let i = 0; i < N; ++i) {
      const want = Math.fround(A * xAt(i) + yAt(i));
      const got = y.readFloatLE(i * 4);
      if (got !== want) {
        if (first === null) first = `y[${i}] = ${got}, want ${want}`;
        ++mismatches;
      }
    }
    assert.equal(mismatches, 0, `${mismatches} of ${N} elements differ; first: ${first}`);
  });

  step('reads x back in uneven chunks from an offset: unchanged by the kernel', async () => {
    const offset = 4 * 1000;
    const parts = await serverStream(client, 'Read',
        { session: s.session, buffer: s.x, offset: String(offset), chunk_size: 1000000 });
    let at = offset;
    for (const p of parts) {
      assert.equal(p.offset, String(at));
      at += p.data.length;
    }
    assert.equal(at, N * 4);
    assert.equal(parts.length, Math.ceil((N * 4 - offset) / 1000000));
    const x = Buffer.concat(parts.map((p) => p.data));
    for (let i = 1000; i < N; ++i) {
      const got = x.readFloatLE((i - 1000) * 4);
      if (got !== xAt(i)) assert.fail(`x[${i}] = ${got}, want ${xAt(i)}`);
    }
  });

  step('rejects bad requests with the documented status codes', async () => {
    const launch = (args) => unary(client, 'Launch', {
      session: s.session, function: s.saxpy, grid: { x: 1 }, block: { x: 1 }, args,
    });
    const x = { buffer: { buffer: s.x } };
    const y = { buffer: { buffer: s.y } };
    // Wrong count: names the kernel and both counts.
    await assertStatus(launch([{ f32: A }, x, y]), grpc.status.INVALID_ARGUMENT,
        [/gx_saxpy/, /takes 4 parameters/, /passed 3 arguments/]);
    // Wrong size: names the parameter, its size and offset.
    await assertStatus(launch([{ f32: A }, x, y, { u32: N }]), grpc.status.INVALID_ARGUMENT,
        [/parameter 3 of kernel 'gx_saxpy'/, /8 bytes at offset 24/, /u32/]);
    // A buffer argument whose handle names nothing (above 2^53: the id must
    // travel as a 64-bit integer, not a double).
    const nothing = '18446744073709551615';
    await assertStatus(launch([{ f32: A }, x, { buffer: { buffer: nothing } }, { u64: '1' }]),
        grpc.status.NOT_FOUND, [/parameter 2/]);
    await assertStatus(unary(client, 'Free', { session: s.session, buffer: nothing }),
        grpc.status.NOT_FOUND, [/buffer/]);
    await assertStatus(unary(client, 'GetFunction', { session: s.session, module: nothing, name: 'gx_saxpy' }),
        grpc.status.NOT_FOUND, [/module/]);
    // Past the end of a buffer.
    await assertStatus(serverStream(client, 'Read',
        { session: s.session, buffer: s.y, offset: String(N * 4), size: '4' }),
        grpc.status.OUT_OF_RANGE, []);
    // A session that does not exist.
    await assertStatus(unary(client, 'KeepAlive', { session: '0'.repeat(32) }),
        grpc.status.NOT_FOUND, [/session/]);
    // The session still works after all of that.
    const k = await unary(client, 'KeepAlive', { session: s.session });
    assert.equal(k.lease_ms, '60000');
  });

  step('frees the buffers and closes the session', async () => {
    await unary(client, 'Free', { session: s.session, buffer: s.x });
    await unary(client, 'Free', { session: s.session, buffer: s.y });
    // A freed handle names nothing.
    await assertStatus(unary(client, 'Free', { session: s.session, buffer: s.x }),
        grpc.status.NOT_FOUND, [/buffer/]);
    await unary(client, 'CloseSession', { session: s.session });
    await assertStatus(unary(client, 'Allocate', { session: s.session, size: '4' }),
        grpc.status.NOT_FOUND, [/session/]);
    const { devices } = await unary(client, 'ListDevices', {});
    assert.equal(devices.find((d) => d.index === s.device).sessions, 0);
  });

  step('a second session gets the module from the cache with the header alone', async () => {
    const opened = await unary(client, 'OpenSession', { device: s.device });
    assert.notEqual(opened.session, s.session);
    const sha256 = SHA256();
    const r = await clientStream(client, 'LoadModule', [{
      header: { session: opened.session, sha256, size: String(image.length), kind: 'MODULE_KIND_CUBIN' },
    }]);
    assert.equal(r.sha256, sha256);
    assert.equal(r.uploaded, false);
    const f = await unary(client, 'GetFunction', { session: opened.session, module: r.module, name: 'gx_saxpy' });
    assert.equal(f.params.length, 4);
    // One image on the device, loaded by the driver once for both sessions.
    const { devices } = await unary(client, 'ListDevices', {});
    const d = devices.find((x) => x.index === s.device);
    assert.equal(d.modules_loaded, 1);
    assert.equal(BigInt(d.module_loads_total) - s.moduleLoadsBefore, 1n);
    await unary(client, 'CloseSession', { session: opened.session });
  });
});
