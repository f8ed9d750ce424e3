// The device of deploycc's browser runtime: a WebGPU adapter held to the package's limits, its WGSL kernels as
// compute pipelines with explicit bind group layouts, storage buffers and the bind groups of each launch.
//
// A launch's Params (its int arguments) go into a ring of uniform memory at an offset of its own (a dynamic offset,
// aligned to minUniformBufferOffsetAlignment), written by one queue.writeBuffer just before the step's submit, so a
// kernel's bind group depends on its buffers alone and is made once (before 2026-11-29 a decode step, whose lengths
// change every step, made a uniform buffer and a bind group for most of its launches).
import { PackageError } from "./errors.js";

const GROUP_CACHE = 4096; // bind groups kept across steps
const paramsBytes = (ints) => Math.max(16, Math.ceil(ints / 4) * 16); // a launch's Params: i32s padded to 16 bytes

const BINDING = /((?:@\s*\w+\s*\(\s*\d+\s*\)\s*)+)var\s*<\s*(\w+)\s*(?:,\s*(\w+)\s*)?>/g;

function parseBindings(source) {
  // [[binding, layout type]] of a WGSL module's group-0 declarations (the package's ABI: storage 0..N-1, then
  // one uniform Params at N); the layout is explicit because "auto" drops bindings an entry point does not use.
  const found = new Map();
  for (const m of source.replace(/\/\/[^\n]*/g, "").matchAll(BINDING)) {
    const b = /@\s*binding\s*\(\s*(\d+)\s*\)/.exec(m[1]);
    if (!b) continue;
    const type = m[2] === "uniform" ? "uniform" : m[3] === "read_write" ? "storage" : "read-only-storage";
    found.set(Number(b[1]), type);
  }
  return [...found.entries()].sort((x, y) => x[0] - y[0]);
}

class Buffer {
  constructor(handle, nbytes) { this.handle = handle; this.nbytes = nbytes; this.id = Buffer.next++; }
}
Buffer.next = 0;

export class WebGPU {
  static async open(manifest, { forcePacked = false, featureLevel = "core" } = {}) {
    if (!navigator.gpu) {
      throw new PackageError("this browser has no WebGPU (navigator.gpu); use Chrome or Edge 113+, or Chromium with " +
        "--enable-unsafe-webgpu where the GPU is blocklisted");
    }
    const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance", featureLevel });
    if (!adapter) {
      throw new PackageError("WebGPU found no adapter; on a machine without a supported GPU start Chromium with " +
        "--enable-unsafe-webgpu (SwiftShader) and check chrome://gpu");
    }
    const info = adapter.info || {};
    const name = [info.vendor, info.architecture, info.description].filter(Boolean).join(" ") ||
      `WebGPU adapter (${adapter.featureLevel || featureLevel})`;
    const requires = manifest.kernels.requires || {};
    const requiredLimits = {};
    for (const [limit, need] of Object.entries(requires)) {
      const has = adapter.limits[limit];
      if (has === undefined) continue;
      if (need > has) {
        throw new PackageError(`this package needs ${limit} ${need}, but ${name} allows ${has}; ` +
          `compile it for the chrome-webgpu preset (it keeps within WebGPU's default limits)`);
      }
      requiredLimits[limit] = Math.max(need, 0);
    }
    const entries = Object.values(manifest.kernels.entries);
    const usesF16 = entries.some((e) => e.file_no_f16);
    const f16 = usesF16 && adapter.features.has("shader-f16") && !forcePacked;
    // kernels whose warp-level reductions use subgroup operations (file_subgroups), where the adapter has them
    const subgroups = entries.some((e) => e.file_subgroups) && adapter.features.has("subgroups");
    const requiredFeatures = [...(f16 ? ["shader-f16"] : []), ...(subgroups ? ["subgroups"] : [])];
    const device = await adapter.requestDevice({ requiredFeatures, requiredLimits });
    return new WebGPU(adapter, device, name, usesF16 ? (f16 ? "native" : "packed") : "none", subgroups);
  }

  constructor(adapter, device, name, f16, subgroups = false) {
    this.adapter = adapter;
    this.device = device;
    this.name = name;
    this.f16 = f16; // how f16 weights are read: "native" (shader-f16), "packed" (two per u32), "none"
    this.subgroups = subgroups; // whether the kernels' reductions use subgroup operations
    this.isFallback = Boolean(adapter.info?.isFallbackAdapter);
    this.errors = [];
    device.addEventListener("uncapturederror", (e) => this.errors.push(e.error.message));
    this.lost = null;
    device.lost.then((i) => { this.lost = `the WebGPU device was lost (${i.reason}: ${i.message})`; });
    this.groups = new Map();
    this.ring = null; // the Params ring (reserveParams), its staged bytes and how many of them this step used
    this.staged = null;
    this.used = 0;
    this.STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
  }

  alloc(nbytes) {
    const size = Math.max(4, Math.ceil(nbytes / 4) * 4);
    return new Buffer(this.device.createBuffer({ size, usage: this.STORAGE }), nbytes); // zero-filled
  }

  upload(bytes) {
    const size = Math.max(4, Math.ceil(bytes.byteLength / 4) * 4);
    const handle = this.device.createBuffer({ size, usage: this.STORAGE, mappedAtCreation: true });
    new Uint8Array(handle.getMappedRange()).set(bytes);
    handle.unmap();
    return new Buffer(handle, bytes.byteLength);
  }

  async build(sources, entries) {
    // {kernel name: kernel} from {file: WGSL text} and the manifest's entries (each names its file and entry point).
    const modules = {};
    for (const [file, code] of Object.entries(sources)) {
      if (/\benable\s+f16\s*;/.test(code) && this.f16 !== "native") {
        throw new PackageError(`${file} needs shader-f16, which ${this.name} lacks, and the package has no packed ` +
          `variant; recompile it with this deploycc`);
      }
      const module = this.device.createShaderModule({ code, label: file });
      const info = await module.getCompilationInfo();
      const err = info.messages.find((m) => m.type === "error");
      if (err) throw new PackageError(`${file}:${err.lineNum}:${err.linePos}: WGSL error: ${err.message}`);
      const bindings = parseBindings(code);
      const layout = this.device.createBindGroupLayout({
        entries: bindings.map(([binding, type]) => ({ binding, visibility: GPUShaderStage.COMPUTE,
          buffer: { type, hasDynamicOffset: type === "uniform" } })),
      });
      modules[file] = { module, layout, bindings,
        pipelineLayout: this.device.createPipelineLayout({ bindGroupLayouts: [layout] }) };
    }
    const kernels = {};
    await Promise.all(Object.entries(entries).map(async ([name, e]) => {
      const m = modules[e.file];
      this.device.pushErrorScope("validation");
      const pipeline = await this.device.createComputePipelineAsync({ layout: m.pipelineLayout,
        compute: { module: m.module, entryPoint: e.entry }, label: name }).catch((err) => err);
      const scoped = await this.device.popErrorScope();
      if (pipeline instanceof Error || scoped) {
        throw new PackageError(`${e.file}: entry point ${e.entry} failed: ${(scoped || pipeline).message}`);
      }
      const storage = m.bindings.filter(([, t]) => t !== "uniform").length;
      kernels[name] = { name, pipeline, layout: m.layout, nBuffers: storage,
        hasParams: m.bindings.length > storage, split: e.split || {} };
    }));
    return kernels;
  }

  reserveParams(launches, ints) {
    // The Params ring: a slot for each launch of the step function with the most launch instructions, each slot
    // the largest launch's Params (`ints` of them) rounded up to minUniformBufferOffsetAlignment.
    const align = this.device.limits.minUniformBufferOffsetAlignment || 256;
    this.slot = Math.ceil(paramsBytes(ints) / align) * align;
    const size = Math.max(1, launches) * this.slot;
    this.ring?.destroy();
    this.ring = this.device.createBuffer({ size, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST, label: "params" });
    this.staged = new ArrayBuffer(size);
    this.used = 0;
  }

  stage(ints) {
    // This launch's Params (little-endian i32, padded to 16 bytes) at the next slot of the step; its offset.
    const at = this.used;
    if (at + this.slot > this.staged.byteLength) {
      throw new PackageError(`a step launched more than the ${this.staged.byteLength / this.slot} kernels its bytecode lists`);
    }
    new Int32Array(this.staged, at, ints.length).set(ints);
    this.used = at + this.slot;
    return at;
  }

  writeParams() {
    // The step's staged Params into the ring; the queue runs the write before the step's submit that follows it.
    if (this.used) this.device.queue.writeBuffer(this.ring, 0, this.staged, 0, this.used);
    this.used = 0;
  }

  bindGroup(kernel, bufs, nInts) {
    const key = kernel.name + "|" + bufs.map((b) => b.id).join(",");
    const hit = this.groups.get(key);
    if (hit) { this.groups.delete(key); this.groups.set(key, hit); return hit; } // most recent last
    const entries = [];
    let binding = 0;
    bufs.forEach((b, i) => {
      const split = kernel.split[i];
      if (!split) {
        entries.push({ binding: binding++, resource: { buffer: b.handle } });
        return;
      }
      const [chunk, parts] = split; // a weight larger than one binding, bound as ranges
      for (let p = 0; p < parts; p++) {
        const size = Math.min(chunk, b.handle.size - p * chunk);
        entries.push({ binding: binding++, resource: { buffer: b.handle, offset: p * chunk, size } });
      }
    });
    if (kernel.hasParams) {
      entries.push({ binding: binding++, resource: { buffer: this.ring, offset: 0, size: paramsBytes(nInts) } });
    }
    const group = this.device.createBindGroup({ layout: kernel.layout, entries, label: kernel.name });
    this.groups.set(key, group);
    if (this.groups.size > GROUP_CACHE) this.groups.delete(this.groups.keys().next().value); // least recently used
    return group;
  }
}
