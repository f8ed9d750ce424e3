// deploycc's runtime for the browser: a deploycc package (manifest, bytecode, WGSL kernels, safetensors
// weights, tokenizer) run with WebGPU. The same bytecode as the Python VM (runtime/vm.py), one compute pass
// and one queue submit per step; weights are fetched once, checked against the manifest's SHA-256 and kept
// in the Cache API. Nothing here evaluates code from the package: JSON, WGSL text and safetensors only.
//
//   const engine = await Engine.load(new URL("./", location.href), {onProgress});
//   for await (const piece of engine.generate([{role: "user", content: "Hi"}], {maxTokens: 64})) ...
//
// This file holds the package loading, the VM and the engine; webgpu.js the device, text.js the tokenizer, chat
// template, streaming detokenization and sampling, errors.js the errors all of them raise.
import { ContextFull, PackageError } from "./errors.js";
import { loadTokenizer, Sampler, StreamDecoder } from "./text.js";
import { WebGPU } from "./webgpu.js";

export { ContextFull, PackageError, Sampler, WebGPU };


const FORMAT = "deploycc-package";
const FORMAT_VERSIONS = [2];
const DTYPE_BYTES = { float32: 4, float16: 2, int32: 4, uint32: 4, int8: 1, uint8: 1 };
const SAFETENSORS_DTYPE = { F32: "float32", F16: "float16", I32: "int32", U32: "uint32", I8: "int8", U8: "uint8" };
const STEP_FUNCTIONS = ["prefill", "prefill_all", "decode"]; // one sequence: the batched `step` is the server's
const BUILTINS = new Set(["vm.match_shape", "vm.alloc", "vm.launch", "vm.tuple", "vm.get", "vm.move", "kv.begin",
  "kv.view"]);

const hex = (buf) => Array.from(new Uint8Array(buf), (b) => b.toString(16).padStart(2, "0")).join("");
const sha256 = async (buf) => hex(await crypto.subtle.digest("SHA-256", buf));
const mb = (n) => `${(n / 1e6).toFixed(1)} MB`;

// ---- fetching, integrity and the Cache API -------------------------------------------------------------

class Store {
  // Package files by path: from the Cache API when a checked copy is there, else fetched, checked against the
  // manifest's SHA-256 and cached. A refused cache write (quota) drops the whole cache, so no half-cached model
  // is left behind, and the run goes on from memory with `cacheError` saying why.
  constructor(base, manifest, cache, onProgress) {
    this.base = base;
    this.hashes = manifest.files;
    this.cache = cache;
    this.onProgress = onProgress;
    this.fetched = [];
    this.cached = [];
    this.cacheError = null;
  }

  static async open(base, manifest, manifestHash, onProgress) {
    let cache = null;
    if (globalThis.caches) {
      const prefix = `deploycc ${base} `;
      const name = prefix + manifestHash;
      for (const key of await caches.keys()) { // an older build of the same package: its files are stale
        if (key.startsWith(prefix) && key !== name) await caches.delete(key);
      }
      cache = await caches.open(name);
      cache.name_ = name;
    }
    return new Store(base, manifest, cache, onProgress);
  }

  async get(path) {
    const want = this.hashes[path];
    if (!want) throw new PackageError(`${path} is not listed in the package's manifest; recompile the package`);
    const url = new URL(path, this.base).href;
    if (this.cache) {
      const hit = await this.cache.match(url);
      if (hit) {
        const buf = await hit.arrayBuffer();
        if (await sha256(buf) === want) {
          this.cached.push(path);
          this.onProgress?.({ phase: "cache", file: path, loaded: buf.byteLength, total: buf.byteLength });
          return buf;
        }
        await this.cache.delete(url); // damaged in storage: fetch it again
      }
    }
    const buf = await this.fetch(url, path);
    if (await sha256(buf) !== want) {
      throw new PackageError(`${path} does not match the manifest's SHA-256 (a damaged or partial download); ` +
        `reload the page, or copy the package again`);
    }
    this.fetched.push(path);
    if (this.cache && !this.cacheError) {
      try {
        await this.cache.put(url, new Response(buf, { headers: { "content-type": "application/octet-stream" } }));
      } catch (e) {
        this.cacheError = `the browser refused to keep ${mb(buf.byteLength)} of ${path} (${e.name}: storage quota); ` +
          `the model runs from memory and is fetched again next time; free site storage to cache it`;
        await caches.delete(this.cache.name_);
        this.cache = null;
      }
    }
    return buf;
  }

  async fetch(url, path) {
    let res;
    try {
      res = await fetch(url, { cache: "no-store" });
    } catch (e) {
      throw new PackageError(`could not fetch ${path}: ${e.message}; is the bundle's server running?`);
    }
    if (!res.ok) throw new PackageError(`could not fetch ${path}: HTTP ${res.status}; the package is incomplete`);
    const total = Number(res.headers.get("content-length")) || 0;
    if (!res.body || !this.onProgress) return await res.arrayBuffer();
    const parts = [];
    let loaded = 0;
    const reader = res.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      parts.push(value);
      loaded += value.byteLength;
      this.onProgress({ phase: "fetch", file: path, loaded, total });
    }
    const out = new Uint8Array(loaded);
    let at = 0;
    for (const p of parts) { out.set(p, at); at += p.byteLength; }
    return out.buffer;
  }

  async text(path) { return new TextDecoder().decode(await this.get(path)); }
  async json(path) { return JSON.parse(await this.text(path)); }
}

function parseSafetensors(buf, path) {
  // {name: {dtype, shape, bytes: Uint8Array}} of one shard; the header is JSON, the rest raw little-endian data.
  if (buf.byteLength < 8) throw new PackageError(`${path} is not a safetensors file (too short)`);
  const n = Number(new DataView(buf).getBigUint64(0, true));
  if (n > buf.byteLength - 8) throw new PackageError(`${path}: safetensors header runs past the end of the file`);
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 8, n)));
  const out = {};
  for (const [name, t] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    const [a, b] = t.data_offsets;
    if (!(0 <= a && a <= b && 8 + n + b <= buf.byteLength)) {
      throw new PackageError(`${path}: tensor ${name} lies outside the file`);
    }
    out[name] = { dtype: SAFETENSORS_DTYPE[t.dtype], shape: t.shape, bytes: new Uint8Array(buf, 8 + n + a, b - a) };
  }
  return out;
}

// ---- symbolic shapes -------------------------------------------------------------------------------------

function compileExpr(j, slot) {
  // The bytecode's int | "name" | [op, args...] (op in + * // % min max) as a function of the shape heap.
  if (typeof j === "number" && Number.isInteger(j)) return () => j;
  if (typeof j === "string") { const i = slot(j); return (h) => h[i]; }
  if (Array.isArray(j) && j.length > 1) {
    const args = j.slice(1).map((a) => compileExpr(a, slot));
    const [a, b] = args;
    switch (j[0]) {
      case "+": return args.length === 2 ? (h) => a(h) + b(h) : (h) => args.reduce((s, f) => s + f(h), 0);
      case "*": return args.length === 2 ? (h) => a(h) * b(h) : (h) => args.reduce((s, f) => s * f(h), 1);
      case "//": return (h) => Math.floor(a(h) / b(h));
      case "%": return (h) => { const d = b(h); return ((a(h) % d) + d) % d; }; // Python's sign rule
      case "min": return (h) => Math.min(...args.map((f) => f(h)));
      case "max": return (h) => Math.max(...args.map((f) => f(h)));
    }
  }
  throw new PackageError(`bad symbolic expression ${JSON.stringify(j)} in bytecode.json; recompile the package`);
}

// ---- the VM --------------------------------------------------------------------------------------------

class DTensor {
  constructor(buf, shape, dtype) { this.buf = buf; this.shape = shape; this.dtype = dtype; }
}

class KVCache {
  // One sequence's keys and values per layer: [rows, kv_heads, head_dim], rows the context window or a
  // sliding window's ring (the bytecode's kv.begin / kv.view / kv operands, as runtime/kvcache.py).
  constructor(gpu, kv, capacity, chunk) {
    this.capacity = capacity;
    this.rows = kv.rows || new Array(kv.layers).fill(0);
    this.step = this.rows.some((r) => r) ? chunk : 0;
    this.kvHeads = kv.kv_heads;
    this.headDim = kv.head_dim;
    this.dtype = kv.dtype;
    const row = kv.kv_heads * kv.head_dim * DTYPE_BYTES[kv.dtype];
    this.k = this.rows.map((r) => gpu.alloc((r || capacity) * row));
    this.v = this.rows.map((r) => gpu.alloc((r || capacity) * row));
    this.length = 0;
  }

  begin(n) {
    if (this.step && n > this.step) throw new PackageError(`a step of ${n} tokens exceeds the ring of ${this.step}`);
    if (this.length + n > this.capacity) {
      throw new ContextFull(`${this.length} cached + ${n} new tokens exceed the context window of ${this.capacity}; ` +
        `start a new conversation`);
    }
    this.length += n;
    return [this.length];
  }

  view(which, layer) {
    return new DTensor((which === "k" ? this.k : this.v)[layer],
      [this.rows[layer] || this.length, this.kvHeads, this.headDim], this.dtype);
  }

  keeps(n) { return 0 <= n && n <= this.length && (!this.step || this.length - n <= this.step); }
}


class VM {
  constructor(bytecode, gpu, kernels, storages, cache, bounds, maxGrid) {
    this.gpu = gpu;
    this.kernels = kernels;
    this.storages = storages;
    this.cache = cache;
    this.bounds = bounds;
    this.maxGrid = maxGrid;
    this.pass = null;
    this.launches = 0;
    this.functions = {};
    let launches = 0; // the most launch instructions of a step function, the most int arguments of a launch: the
    let ints = 1; // Params ring's slots and their size
    for (const name of STEP_FUNCTIONS) {
      const spec = bytecode.functions[name];
      if (!spec) continue;
      this.functions[name] = this.prepareFunction(name, spec);
      const sites = spec.instructions.filter((ins) => ins.fn === "vm.launch");
      launches = Math.max(launches, sites.length);
      for (const ins of sites) ints = Math.max(ints, ins.args.length - 1 - ins.args.findIndex((a) => a.str === "|"));
    }
    gpu.reserveParams(launches, ints);
  }

  prepareFunction(name, spec) {
    const heapNames = [];
    const slot = (n) => { let i = heapNames.indexOf(n); if (i < 0) { i = heapNames.length; heapNames.push(n); } return i; };
    const fn = { name, numInputs: spec.num_inputs, nregs: spec.registers, heapNames, preset: new Map() };
    fn.code = spec.instructions.map((ins) => this.prepare(ins, fn, slot));
    return fn;
  }

  operand(a, slot) {
    if ("r" in a) { const r = a.r; return (regs) => regs[r]; }
    if ("s" in a) { const f = compileExpr(a.s, slot); return (regs, heap) => f(heap); }
    if ("i" in a) { const v = a.i; return () => v; }
    if ("str" in a) { const v = a.str; return () => v; }
    if ("kv" in a) {
      const [r, which, layer] = a.kv;
      return (regs) => (which === "k" ? regs[r].k : regs[r].v)[layer];
    }
    throw new PackageError(`bad operand ${JSON.stringify(a)} in bytecode.json`);
  }

  prepare(ins, fn, slot) {
    if (ins.op === "ret") { const get = this.operand(ins.args[0], slot); return { ret: get }; }
    if (ins.op !== "call" || !BUILTINS.has(ins.fn)) {
      throw new PackageError(`${fn.name}: ${ins.op} ${ins.fn || ""} is not something this runtime runs; ` +
        `recompile the package with this deploycc`);
    }
    const args = ins.args, dst = ins.dst ?? null;
    const op = (f) => ({ f, dst });
    switch (ins.fn) {
      case "vm.launch": return op(this.prepareLaunch(args, slot));
      case "vm.match_shape": return op(this.prepareMatch(args, fn, slot));
      case "vm.alloc": {
        const storage = this.storages[args[0].i], dtype = args[1].str;
        const dims = args.slice(2).map((a) => compileExpr(a.s, slot));
        return op((regs, heap) => new DTensor(storage, dims.map((d) => d(heap)), dtype));
      }
      case "kv.begin": {
        const cache = this.operand(args[0], slot), n = this.operand(args[1], slot);
        return op((regs, heap) => cache(regs, heap).begin(n(regs, heap)));
      }
      case "kv.view": {
        const [cache, which, layer] = args.map((a) => this.operand(a, slot));
        return op((regs, heap) => cache(regs, heap).view(which(regs, heap), layer(regs, heap)));
      }
      case "vm.move": return op(this.operand(args[0], slot));
      case "vm.tuple": {
        const gets = args.map((a) => this.operand(a, slot));
        return op((regs, heap) => gets.map((g) => g(regs, heap)));
      }
      case "vm.get": {
        const [t, i] = args.map((a) => this.operand(a, slot));
        return op((regs, heap) => t(regs, heap)[i(regs, heap)]);
      }
    }
    throw new PackageError(`unknown builtin ${ins.fn}`);
  }

  prepareMatch(args, fn, slot) {
    const get = this.operand(args[0], slot);
    const checks = args.slice(1).map((a, k) => ("bind" in a ? { k, bind: slot(a.bind), name: a.bind }
      : { k, f: compileExpr(a.s, slot) }));
    return (regs, heap) => {
      const v = get(regs, heap);
      const shape = v instanceof DTensor ? v.shape : v;
      if (shape.length !== checks.length) throw new PackageError(`${fn.name}: expected ${checks.length} dims, got ${shape}`);
      for (const c of checks) {
        if (c.f === undefined) {
          const hi = this.bounds[c.name];
          if (hi !== undefined && !(1 <= shape[c.k] && shape[c.k] <= hi)) {
            throw new PackageError(`${fn.name}: ${c.name} = ${shape[c.k]} is outside 1..${hi}, the range this ` +
              `package's memory plan is for`);
          }
          heap[c.bind] = shape[c.k];
        } else if (c.f(heap) !== shape[c.k]) {
          throw new PackageError(`${fn.name}: dimension ${c.k} of [${shape}] should be ${c.f(heap)}`);
        }
      }
    };
  }

  prepareLaunch(args, slot) {
    const kernel = this.kernels[args[0].k];
    if (!kernel) throw new PackageError(`bytecode launches ${args[0].k}, which the manifest does not list`);
    const groups = compileExpr(args[1].s, slot);
    const sep = args.findIndex((a) => a.str === "|");
    const bufs = args.slice(3, sep).map((a) => this.operand(a, slot));
    const scalars = args.slice(sep + 1).map((a) => compileExpr(a.s, slot));
    const maxGrid = this.maxGrid;
    return (regs, heap) => {
      const g = groups(heap);
      if (g <= 0) return;
      if (g > maxGrid * maxGrid) throw new PackageError(`${kernel.name}: ${g} work-groups exceed the grid limit`);
      const bs = bufs.map((b) => { const v = b(regs, heap); return v instanceof DTensor ? v.buf : v; });
      const ints = scalars.map((s) => s(heap));
      const offsets = kernel.hasParams ? [this.gpu.stage(ints)] : [];
      const group = this.gpu.bindGroup(kernel, bs, ints.length);
      const grid = g <= maxGrid ? [g] : [maxGrid, Math.ceil(g / maxGrid)];
      this.launches++;
      if (this.recording) { this.recording.push({ kernel, group, grid, offsets }); return; }
      this.pass.setPipeline(kernel.pipeline);
      this.pass.setBindGroup(0, group, offsets);
      this.pass.dispatchWorkgroups(...grid);
    };
  }

  run(name, inputs, encoder) {
    // Encode one function's launches into one compute pass of `encoder`; returns its result (a DTensor).
    const fn = this.functions[name];
    const regs = new Array(fn.nregs).fill(null);
    for (const [r, v] of fn.preset) regs[r] = v;
    inputs.forEach((v, i) => { regs[i] = v; });
    const heap = new Array(Math.max(fn.heapNames.length, 1)).fill(0);
    this.gpu.used = 0; // the step's Params from the ring's first slot (a step that threw left its own)
    this.pass = encoder.beginComputePass();
    try {
      for (const ins of fn.code) {
        if (ins.ret) return ins.ret(regs, heap);
        const v = ins.f(regs, heap);
        if (ins.dst !== null) regs[ins.dst] = v;
      }
    } finally {
      this.pass.end();
      this.pass = null;
    }
    throw new PackageError(`${name}: fell off the end without ret`);
  }
}

// ---- the engine ----------------------------------------------------------------------------------------

export class Engine {
  static async load(base, { onProgress, forcePacked = false, featureLevel = "core" } = {}) {
    base = new URL(base, location.href).href;
    const t0 = performance.now();
    const res = await fetch(new URL("manifest.json", base), { cache: "no-store" }).catch((e) => {
      throw new PackageError(`could not fetch manifest.json: ${e.message}`);
    });
    if (!res.ok) throw new PackageError(`could not fetch manifest.json: HTTP ${res.status}; is this a deploycc package?`);
    const manifestBytes = await res.arrayBuffer();
    const manifestHash = await sha256(manifestBytes);
    const seal = await fetch(new URL("manifest.sha256", base), { cache: "no-store" }).then((r) => (r.ok ? r.text() : ""));
    if (seal.split(/\s+/)[0] !== manifestHash) {
      throw new PackageError("manifest.json does not match manifest.sha256 (damaged or edited); copy the package again");
    }
    const manifest = JSON.parse(new TextDecoder().decode(manifestBytes));
    if (manifest.format !== FORMAT || !FORMAT_VERSIONS.includes(manifest.format_version)) {
      throw new PackageError(`not a deploycc package of a format this runtime reads (format ${manifest.format} ` +
        `version ${manifest.format_version}); recompile it`);
    }
    if (manifest.target.kind !== "webgpu") {
      throw new PackageError(`this package has ${manifest.target.kind} kernels; compile it with --device chrome-webgpu`);
    }
    const gpu = await WebGPU.open(manifest, { forcePacked, featureLevel });
    const store = await Store.open(base, manifest, manifestHash, onProgress);
    const bytecode = await store.json("bytecode.json");
    const files = {};
    // each kernel's WGSL file: the f16-packed variant where it has one and the adapter needs it, and of that the
    // variant with subgroup operations where the adapter has them (runtime/loaders.py variant)
    const entries = {};
    // only the kernels this page's functions launch (STEP_FUNCTIONS): the server's steps' own (step, step_all and
    // step_one: their page-pool attention, appends and rope tables) are never fetched or compiled here
    const launched = new Set(STEP_FUNCTIONS.flatMap((f) => (bytecode.functions[f]?.instructions || [])
      .filter((ins) => ins.fn === "vm.launch").map((ins) => ins.args[0].k)));
    for (const [name, e] of Object.entries(manifest.kernels.entries)) {
      if (!launched.has(name)) continue;
      const key = gpu.f16 === "packed" && e.file_no_f16 ? "file_no_f16" : "file";
      const file = (gpu.subgroups && e[`${key}_subgroups`]) || e[key];
      entries[name] = { ...e, file };
      files[file] ??= store.text(file);
    }
    const sources = {};
    for (const [f, p] of Object.entries(files)) sources[f] = await p;
    // the pipelines compile while the weights are fetched, checked and uploaded: a load takes the longer of the
    // two, not their sum (a damaged shard is reported without waiting for the compiles)
    const t1 = performance.now();
    let buildMs = 0;
    const building = gpu.build(sources, entries).then((k) => { buildMs = performance.now() - t1; return k; });
    building.catch(() => {}); // awaited below; a weight error first leaves it unobserved
    const weights = {};
    let weightBytes = 0;
    for (const shard of [...new Set(manifest.params.map((p) => p.file))]) {
      const tensors = parseSafetensors(await store.get(shard), shard);
      for (const p of manifest.params.filter((q) => q.file === shard)) {
        const t = tensors[p.name];
        if (!t || t.dtype !== p.dtype || JSON.stringify(t.shape) !== JSON.stringify(p.shape)) {
          throw new PackageError(`${shard}: tensor ${p.name} is missing or not ${p.dtype} [${p.shape}]; recompile`);
        }
        weights[p.name] = new DTensor(gpu.upload(t.bytes), p.shape, p.dtype);
        weightBytes += t.bytes.byteLength;
      }
    }
    const tokenizer = await loadTokenizer(store, manifest);
    const kernels = await building;
    const engine = new Engine(manifest, bytecode, gpu, kernels, weights, tokenizer);
    engine.load = { seconds: (performance.now() - t0) / 1000, buildSeconds: buildMs / 1000, weightBytes,
      fetched: store.fetched, cached: store.cached, cacheError: store.cacheError };
    return engine;
  }

  constructor(manifest, bytecode, gpu, kernels, weights, tokenizer) {
    this.manifest = manifest;
    this.gpu = gpu;
    this.tokenizer = tokenizer;
    this.contextWindow = manifest.bounds.context_window;
    this.prefillChunk = manifest.bounds.prefill_chunk;
    this.vocabSize = manifest.vocab_size;
    const storages = manifest.storages.map((s) => gpu.alloc(Number(s.bytes)));
    this.cache = new KVCache(gpu, manifest.kv_cache, this.contextWindow, this.prefillChunk);
    const bounds = { seq_len: this.prefillChunk, total_len: this.contextWindow };
    this.vm = new VM(bytecode, gpu, kernels, storages, this.cache, bounds, manifest.target.max_grid || 65535);
    for (const [name, fn] of Object.entries(this.vm.functions)) {
      const spec = bytecode.functions[name];
      spec.params.slice(spec.num_inputs).forEach((p, i) => fn.preset.set(spec.num_inputs + i, weights[p]));
      for (const [key, r] of spec.constants) fn.preset.set(r, weights[key]);
    }
    this.ids = gpu.alloc(this.prefillChunk * 4);
    this.readback = null; // sized for the largest result read so far: one row of logits, or a prefill_all chunk's
    this.stats = { prefillTokens: 0, prefillSeconds: 0, decodeTokens: 0, decodeSeconds: 0 };
    this.cachedIds = []; // the token ids whose keys and values the cache holds (a chat turn prefills only its new part)
  }

  async step(name, ids) {
    // One graph function on `ids` (Int32Array): one compute pass, one submit, one read of the logits.
    if (this.gpu.lost) throw new Error(this.gpu.lost);
    for (const id of ids) {
      if (!(id >= 0 && id < this.vocabSize)) throw new RangeError(`token id ${id} is outside the vocabulary of ${this.vocabSize}`);
    }
    const { device } = this.gpu;
    device.queue.writeBuffer(this.ids.handle, 0, ids);
    const encoder = device.createCommandEncoder();
    const out = this.vm.run(name, [new DTensor(this.ids, [1, ids.length], "int32"), this.cache], encoder);
    const n = out.shape.reduce((a, b) => a * b, 1);
    if (!this.readback || this.readback.size < n * 4) {
      this.readback?.destroy();
      this.readback = device.createBuffer({ size: n * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    }
    encoder.copyBufferToBuffer(out.buf.handle, 0, this.readback, 0, n * 4);
    this.gpu.writeParams();
    device.queue.submit([encoder.finish()]);
    await this.readback.mapAsync(GPUMapMode.READ, 0, n * 4);
    const logits = new Float32Array(this.readback.getMappedRange(0, n * 4).slice(0));
    this.readback.unmap();
    if (this.gpu.errors.length) throw new Error(`WebGPU error: ${this.gpu.errors.shift()}`);
    return { data: logits, shape: out.shape };
  }

  async profile(name, ids) {
    // Milliseconds per kernel of one run of `name` (prefill, prefill_all or decode) on `ids`: each launch is
    // submitted alone and waited for, so the sum is slower than a real step; the KV cache is left as it was.
    const { device } = this.gpu;
    const length = this.cache.length;
    device.queue.writeBuffer(this.ids.handle, 0, Int32Array.from(ids));
    this.vm.recording = [];
    try {
      this.vm.run(name, [new DTensor(this.ids, [1, ids.length], "int32"), this.cache], device.createCommandEncoder());
    } finally {
      this.cache.length = length;
    }
    const launches = this.vm.recording;
    this.vm.recording = null;
    this.gpu.writeParams(); // every recorded launch's Params, at the offsets they were given
    const ms = {};
    for (const { kernel, group, grid, offsets } of launches) {
      const encoder = device.createCommandEncoder();
      const pass = encoder.beginComputePass();
      pass.setPipeline(kernel.pipeline);
      pass.setBindGroup(0, group, offsets);
      pass.dispatchWorkgroups(...grid);
      pass.end();
      const t0 = performance.now();
      device.queue.submit([encoder.finish()]);
      await device.queue.onSubmittedWorkDone();
      ms[kernel.name] = (ms[kernel.name] || 0) + performance.now() - t0;
    }
    return ms;
  }

  async prefill(ids, { allLogits = false } = {}) {
    // Logits of the last token [vocab], or of every token [n, vocab] with allLogits, after appending `ids`.
    ids = Int32Array.from(ids);
    if (!ids.length) throw new RangeError("prefill needs at least one token");
    if (this.cache.length + ids.length > this.contextWindow) {
      throw new ContextFull(`${this.cache.length} cached + ${ids.length} new tokens exceed the context window of ` +
        `${this.contextWindow}`);
    }
    const t0 = performance.now();
    const outs = [];
    let last;
    for (let s = 0; s < ids.length; s += this.prefillChunk) {
      const r = await this.step(allLogits ? "prefill_all" : "prefill", ids.subarray(s, s + this.prefillChunk));
      if (allLogits) outs.push(r.data);
      last = r.data;
    }
    this.stats.prefillTokens += ids.length;
    this.stats.prefillSeconds += (performance.now() - t0) / 1000;
    if (!allLogits) return last.subarray(last.length - this.vocabSize);
    const all = new Float32Array(outs.reduce((a, o) => a + o.length, 0));
    let at = 0;
    for (const o of outs) { all.set(o, at); at += o.length; }
    return all;
  }

  async decode(id) {
    const t0 = performance.now();
    const r = await this.step("decode", Int32Array.of(id));
    this.stats.decodeTokens += 1;
    this.stats.decodeSeconds += (performance.now() - t0) / 1000;
    return r.data.subarray(r.data.length - this.vocabSize);
  }

  reset() { this.cache.length = 0; this.cachedIds = []; }

  encode(prompt, { chat = true } = {}) {
    // As runtime/generate.py's encode_prompt: messages (or a string, when the model has a chat template) go
    // through the template, whose text already holds the special tokens.
    const tok = this.tokenizer;
    if (!tok) throw new PackageError("this package has no tokenizer.json; give token ids");
    if (typeof prompt === "string" && !(chat && tok.template)) return tok.encode(prompt, { add_special_tokens: true }).ids;
    const messages = typeof prompt === "string" ? [{ role: "user", content: prompt }] : prompt;
    return tok.encode(tok.applyChatTemplate(messages), { add_special_tokens: false }).ids;
  }

  async *generate(prompt, { maxTokens = 256, chat = true, signal, stats = {}, ...sampling } = {}) {
    // Stream the reply as text pieces; ends at an eos token, maxTokens, a full context window or `signal`.
    const sampler = new Sampler(sampling);
    const ids = Array.isArray(prompt) && typeof prompt[0] === "number" ? prompt : this.encode(prompt, { chat });
    if (ids.length + 1 > this.contextWindow) {
      throw new ContextFull(`the prompt is ${ids.length} tokens, but the context window is ${this.contextWindow} and ` +
        `must also hold a generated token; shorten the conversation`);
    }
    let keep = 0; // the cached prefix this prompt shares (a chat's earlier turns)
    while (keep < this.cachedIds.length && keep < ids.length - 1 && this.cachedIds[keep] === ids[keep]) keep++;
    if (!this.cache.keeps(keep)) keep = 0;
    this.cache.length = keep;
    this.cachedIds = ids.slice(0, keep);
    const budget = Math.min(maxTokens, this.contextWindow - ids.length);
    const eos = new Set(this.tokenizer?.eosIds ?? []);
    const history = [...ids];
    const generated = [];
    const detok = new StreamDecoder(this.tokenizer);
    Object.assign(stats, { promptTokens: ids.length, prefilledTokens: ids.length - keep, generated, finishReason: null });
    let t0 = performance.now();
    let logits = await this.prefill(ids.slice(keep));
    this.cachedIds = [...ids];
    stats.prefillSeconds = (performance.now() - t0) / 1000;
    t0 = performance.now();
    for (;;) {
      const token = sampler.sample(logits, history);
      generated.push(token);
      history.push(token);
      if (eos.has(token)) { stats.finishReason = "eos"; break; }
      const piece = detok.put(token);
      if (piece) yield piece;
      if (generated.length >= budget) { stats.finishReason = budget === maxTokens ? "length" : "context"; break; }
      if (signal?.aborted) { stats.finishReason = "cancelled"; break; }
      logits = await this.decode(token);
      this.cachedIds.push(token);
    }
    const rest = detok.flush();
    if (rest) yield rest;
    stats.decodeSeconds = (performance.now() - t0) / 1000;
    stats.prefillTokS = stats.prefilledTokens / stats.prefillSeconds;
    stats.decodeTokS = generated.length > 1 ? (generated.length - 1) / stats.decodeSeconds : 0; // the first came from prefill
  }
}
