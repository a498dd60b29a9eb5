// gpuexec.v1 from Node.js with nothing but the .proto: no generated code, no
// gpuexec library. Starts a real gpuexecd, then drives the whole API through
// @grpc/grpc-js with the service description loaded at run time; then does
// it all again over TLS against a daemon with tenants, with a bearer token
// (certificates made with the openssl command), and checks what it refuses.
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
const { createHash } = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const {
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
} = require('./support');

// --------------------------------------------------------------- the suite

// The whole API, step by step, against a daemon of its own. `connect`
// starts that daemon and returns { daemon, client, ...anything the extra
// steps need }, or { skip: reason } to skip this suite alone. `extraSteps`
// (step, ctx) adds steps that run after the common ones; ctx.client,
// ctx.daemon, ctx.extra (what `connect` returned), ctx.s (the state the
// steps share), ctx.image and ctx.sha256() are set once the suite has
// started, and the clients in ctx.clients are closed at its end.
function apiSuite(title, connect, extraSteps) {
  describe(title, () => {
    let daemon = null;
    let client = null;
    let image = null;
    let skip = null;
    let skipWhole = false;  // the run as a whole is skipped: print the marker
    let failed = false;
    const ctx = { clients: [] };

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
        skipWhole = true;
        return;
      }
      image = fs.readFileSync(cubin);

      const driver = requireEnv('GPUEXEC_TEST_DRIVER');
      const opened = await connect(requireEnv('GPUEXEC_DAEMON'), driver);
      if (opened.skip) {
        skip = opened.skip;
        return;
      }
      ({ daemon, client } = opened);
      // Backstop: never leave the daemon behind, whatever ends this process.
      process.once('exit', () => daemon.child.kill('SIGKILL'));
      Object.assign(ctx, { daemon, client, extra: opened, s, image, sha256: SHA256 });
      await waitForReady(client);

      const { devices } = await unary(client, 'ListDevices', {});
      if (devices.length === 0) {
        const reason = `driver ${driver} has no usable device`;
        if (!allowSkip) throw new Error(reason);
        skip = reason;
        skipWhole = true;
      }
    });

    after(async () => {
      for (const c of ctx.clients) c.close();
      if (client) client.close();
      if (daemon) {
        await stopDaemon(daemon.child);
        if (failed) console.error(`gpuexecd log:\n${daemon.log()}`);
      }
      if (ctx.extra && ctx.extra.cleanup) ctx.extra.cleanup();
      if (skip && skipWhole) {
        // The marker ctest's SKIP_REGULAR_EXPRESSION looks for: printed only
        // when the whole run is skipped (no device or no kernel image).
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

    if (extraSteps) extraSteps(step, ctx);
  });
}

// Kernels from source: CUDA C++ the daemon compiles (NVRTC, or the NVRTC
// double that GPUEXEC_TEST_NVRTC names in CI). The extern "C" kernel has
// the name and layout of the driver double's model, so it runs there too.
const NODE_CU = `
extern "C" __global__ void gx_fill_u32(unsigned int* out, unsigned int value,
                                       unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}
template <typename T>
__global__ void gx_axpy(T a, const T* x, T* y, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
// compiled from Node.js
`;

function compileSteps(step, ctx) {
  step('compiles CUDA C++ from source, runs it, and answers the same source from the cache',
      async (t) => {
        const { compile_unavailable: off } = await unary(ctx.client, 'ListDevices', {});
        if (off) return t.skip(`the daemon does not compile: ${off}`);
        const { session } = await unary(ctx.client, 'OpenSession', {});
        const request = {
          session,
          source: NODE_CU,
          source_name: 'node.cu',
          options: ['-std=c++17'],
          name_expressions: ['gx_axpy<double>'],
        };
        const r = await unary(ctx.client, 'CompileModule', request);
        assert.equal(r.cached, false);
        assert.match(r.arch, /^sm_\d+/);
        assert.match(r.nvrtc_version, /^\d+\.\d+$/);
        assert.deepEqual(r.lowered_names, [
          { name_expression: 'gx_axpy<double>', lowered_name: '_Z7gx_axpyIdEvT_PKS0_PS0_y' }]);
        assert.ok(r.kernels.includes('gx_fill_u32'), `kernels: ${r.kernels}`);
        assert.equal(r.image.length, 0);  // not asked for

        const f = await unary(ctx.client, 'GetFunction',
            { session, module: r.module, name: 'gx_fill_u32' });
        const n = 1000;
        const out = await unary(ctx.client, 'Allocate', { session, size: String(n * 4) });
        await unary(ctx.client, 'Launch', {
          session,
          function: f.function,
          grid: { x: Math.ceil(n / 256) },
          block: { x: 256 },
          args: [{ buffer: { buffer: out.buffer } }, { u32: 0xC0DE }, { u64: String(n) }],
        });
        await unary(ctx.client, 'Synchronize', { session });
        const parts = await serverStream(ctx.client, 'Read', { session, buffer: out.buffer });
        const data = Buffer.concat(parts.map((p) => p.data));
        for (let i = 0; i < n; ++i) assert.equal(data.readUInt32LE(i * 4), 0xC0DE, `out[${i}]`);

        // The same request again: the daemon's cache, and the image when asked.
        const again = await unary(ctx.client, 'CompileModule', { ...request, return_image: true });
        assert.equal(again.cached, true);
        assert.equal(again.sha256, r.sha256);
        assert.equal(createHash('sha256').update(again.image).digest('hex'), r.sha256);

        // Source that does not compile: INVALID_ARGUMENT with NVRTC's log.
        await assertStatus(unary(ctx.client, 'CompileModule',
            { session, source: 'extern "C" __global__ void k(no_such_type x) {}', source_name: 'bad.cu' }),
        grpc.status.INVALID_ARGUMENT, [/the compile of 'bad\.cu' failed; NVRTC's log/, /no_such_type/]);
        await unary(ctx.client, 'CloseSession', { session });
      });
}

apiSuite('gpuexec.v1 from Node.js', async (daemonPath, driver) => {
  const nvrtc = process.env.GPUEXEC_TEST_NVRTC;
  const daemon = await startDaemon(daemonPath, driver,
      ['--listen=127.0.0.1:0', ...(nvrtc ? [`--nvrtc=${nvrtc}`] : [])]);
  const client = new GpuExec(`127.0.0.1:${daemon.port}`, grpc.credentials.createInsecure());
  return { daemon, client };
}, compileSteps);

// The same API over TLS, as tenant team-a with a bearer token in call
// credentials; then what the daemon refuses.
apiSuite('gpuexec.v1 from Node.js over TLS with a bearer token', async (daemonPath, driver) => {
  if (!haveOpenssl()) return { skip: 'openssl not found: no certificates for the TLS run' };
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gpuexec-node-tls-'));
  const cleanup = () => fs.rmSync(dir, { recursive: true, force: true });
  try {
    const tls = makeTlsFixture(dir);
    const daemon = await startDaemon(daemonPath, driver, ['--listen=127.0.0.1:0', ...tls.flags]);
    const connect = (token) => tlsClient(daemon.port, tls.caPem, token);
    return { daemon, client: connect(tls.tokens.a), connect, tokens: tls.tokens, cleanup };
  } catch (err) {
    cleanup();
    throw err;
  }
}, (step, ctx) => {
  const other = async (token) => {
    const c = ctx.extra.connect(token);
    ctx.clients.push(c);
    await waitForReady(c);
    return c;
  };

  step('opens a session of team-a for the checks that follow', async () => {
    const r = await unary(ctx.client, 'OpenSession', {});
    ctx.s.mine = r.session;
    const a = await unary(ctx.client, 'Allocate', { session: r.session, size: '4096' });
    ctx.s.mineBuffer = a.buffer;
    await clientStream(ctx.client, 'Write',
        [{ session: r.session, buffer: a.buffer, data: Buffer.alloc(4096, 0xab) }]);
  });

  step('refuses a wrong token with UNAUTHENTICATED, streams included', async () => {
    const wrong = await other(`not-${ctx.extra.tokens.a}`);
    const revoked = [/unknown or revoked bearer token/];
    await assertStatus(unary(wrong, 'ListDevices', {}), grpc.status.UNAUTHENTICATED, revoked);
    await assertStatus(unary(wrong, 'OpenSession', {}), grpc.status.UNAUTHENTICATED, revoked);
    await assertStatus(unary(wrong, 'KeepAlive', { session: ctx.s.mine }),
        grpc.status.UNAUTHENTICATED, revoked);
    await assertStatus(clientStream(wrong, 'Write', [
      { session: ctx.s.mine, buffer: ctx.s.mineBuffer, offset: '0', data: Buffer.alloc(16) }]),
    grpc.status.UNAUTHENTICATED, revoked);
    const read = { session: ctx.s.mine, buffer: ctx.s.mineBuffer };
    await assertStatus(serverStream(wrong, 'Read', read), grpc.status.UNAUTHENTICATED, revoked);
    const header = { session: ctx.s.mine, sha256: ctx.sha256(), size: String(ctx.image.length),
      kind: 'MODULE_KIND_CUBIN' };
    await assertStatus(clientStream(wrong, 'LoadModule', [{ header }]),
        grpc.status.UNAUTHENTICATED, revoked);
  });

  step('refuses a call without credentials; health answers anyone', async () => {
    const none = await other(undefined);
    await assertStatus(unary(none, 'OpenSession', {}), grpc.status.UNAUTHENTICATED,
        [/no credentials/]);
    const read = { session: ctx.s.mine, buffer: ctx.s.mineBuffer };
    await assertStatus(serverStream(none, 'Read', read), grpc.status.UNAUTHENTICATED,
        [/no credentials/]);
    assert.deepEqual([...await healthCheck(none)], [0x08, 0x01]);
  });

  step("team-b finds none of team-a's session (NOT_FOUND), which goes on working", async () => {
    const b = await other(ctx.extra.tokens.b);
    const opened = await unary(b, 'OpenSession', {});
    assert.notEqual(opened.session, ctx.s.mine);
    for (const call of [
      () => unary(b, 'KeepAlive', { session: ctx.s.mine }),
      () => unary(b, 'Allocate', { session: ctx.s.mine, size: '4' }),
      () => serverStream(b, 'Read', { session: ctx.s.mine, buffer: ctx.s.mineBuffer }),
      () => clientStream(b, 'Write',
          [{ session: ctx.s.mine, buffer: ctx.s.mineBuffer, data: Buffer.alloc(4) }]),
      () => unary(b, 'CloseSession', { session: ctx.s.mine }),
    ]) {
      await assertStatus(call(), grpc.status.NOT_FOUND, [/session/]);
    }
    await unary(b, 'CloseSession', { session: opened.session });
    // Team-a's session and buffer are as they were.
    await unary(ctx.client, 'KeepAlive', { session: ctx.s.mine });
    const parts = await serverStream(ctx.client, 'Read',
        { session: ctx.s.mine, buffer: ctx.s.mineBuffer });
    assert.deepEqual(Buffer.concat(parts.map((p) => p.data)), Buffer.alloc(4096, 0xab));
    await unary(ctx.client, 'Free', { session: ctx.s.mine, buffer: ctx.s.mineBuffer });
    await unary(ctx.client, 'CloseSession', { session: ctx.s.mine });
  });
});
