// Text in deploycc's browser runtime: the package's tokenizer and chat template, streaming detokenization, and
// the sampler.
import { PackageError } from "./errors.js";
import { Template } from "./jinja.mjs";
import { Tokenizer } from "./tokenizers.mjs";

// ---- sampling -----------------------------------------------------------------------------------------

function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export class Sampler {
  // The logit processors of Hugging Face generate, in its order: repetition penalty, temperature, top-k, top-p;
  // temperature 0 is greedy. Seeded (mulberry32), so a seed repeats a reply in this runtime (not numpy's stream).
  constructor({ temperature = 0, topP = 1, topK = 0, repetitionPenalty = 1, seed = 0 } = {}) {
    if (!(temperature >= 0 && Number.isFinite(temperature))) throw new RangeError("temperature must be >= 0");
    if (!(topP > 0 && topP <= 1)) throw new RangeError("top_p must be in (0, 1]");
    if (!(Number.isInteger(topK) && topK >= 0)) throw new RangeError("top_k must be an integer >= 0");
    if (!(repetitionPenalty > 0)) throw new RangeError("repetition_penalty must be > 0");
    Object.assign(this, { temperature, topP, topK, repetitionPenalty });
    this.random = mulberry32(seed);
  }

  sample(logits, history) {
    let x = logits;
    if (this.repetitionPenalty !== 1 && history.length) {
      x = Float64Array.from(logits);
      for (const id of new Set(history)) x[id] = x[id] < 0 ? x[id] * this.repetitionPenalty : x[id] / this.repetitionPenalty;
    }
    if (this.temperature === 0) {
      let best = 0;
      for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i; // first maximum, as numpy's argmax
      if (Number.isNaN(x[best])) throw new Error("logits contain NaN; the model produced invalid output");
      return best;
    }
    let cand = Array.from(x.keys()).sort((a, b) => x[b] - x[a] || a - b);
    if (this.topK > 0 && this.topK < cand.length) cand = cand.slice(0, this.topK);
    const top = x[cand[0]] / this.temperature;
    let p = cand.map((i) => Math.exp(x[i] / this.temperature - top));
    let sum = p.reduce((s, v) => s + v, 0);
    if (this.topP < 1) {
      let acc = 0, keep = 0;
      while (keep < p.length && acc < this.topP * sum) acc += p[keep++];
      cand = cand.slice(0, Math.max(keep, 1));
      p = p.slice(0, cand.length);
      sum = p.reduce((s, v) => s + v, 0);
    }
    let r = this.random() * sum;
    for (let i = 0; i < p.length; i++) { r -= p[i]; if (r < 0) return cand[i]; }
    return cand[cand.length - 1];
  }
}

// ---- tokenizer, chat template, streaming detokenization ------------------------------------------------

export async function loadTokenizer(store, manifest) {
  // @huggingface/tokenizers over the package's tokenizer.json; the chat template (tokenizer_config.json,
  // chat_template.jinja or .json) rendered by @huggingface/jinja; eos ids from generation_config.json too.
  const has = (f) => f in manifest.files;
  if (!has("tokenizer.json")) return null;
  const json = await store.json("tokenizer.json");
  const config = has("tokenizer_config.json") ? await store.json("tokenizer_config.json") : {};
  if (has("special_tokens_map.json")) {
    for (const [k, v] of Object.entries(await store.json("special_tokens_map.json"))) config[k] ??= v;
  }
  const tok = new Tokenizer(json, config);
  let template = config.chat_template;
  if (Array.isArray(template)) template = (template.find((t) => t.name === "default") || {}).template;
  if (!template && has("chat_template.jinja")) template = await store.text("chat_template.jinja");
  if (!template && has("chat_template.json")) template = (await store.json("chat_template.json")).chat_template;
  const text = (v) => (typeof v === "string" ? v : v && typeof v.content === "string" ? v.content : null);
  const special = {};
  for (const [k, v] of Object.entries(config)) if (k.endsWith("_token") && text(v)) special[k] = text(v);
  const eos = [];
  if (has("generation_config.json")) {
    const e = (await store.json("generation_config.json")).eos_token_id;
    eos.push(...(e === undefined || e === null ? [] : Array.isArray(e) ? e : [e]));
  }
  if (special.eos_token) { const id = tok.token_to_id(special.eos_token); if (id !== undefined) eos.push(id); }
  const compiled = template ? new Template(template) : null;
  return {
    template, eosIds: [...new Set(eos)], special,
    encode: (text, opts) => tok.encode(text, opts),
    decode: (ids, opts) => tok.decode(ids, opts),
    applyChatTemplate(messages) {
      if (!compiled) throw new PackageError("this model has no chat template; pass plain text with chat: false");
      return compiled.render({ ...special, messages, add_generation_prompt: true, tools: null, documents: null });
    },
  };
}

export class StreamDecoder {
  // Text pieces that add up to decode(all ids): each step decodes a window from a few tokens back and holds
  // text ending in U+FFFD (a split UTF-8 character) back, as runtime/tokenizer.py's StreamDecoder.
  constructor(tok) { this.tok = tok; this.ids = []; this.prefix = 0; this.read = 0; }
  text(ids) { return this.tok && ids.length ? this.tok.decode(ids, { skip_special_tokens: true }) : ""; }
  put(id) {
    this.ids.push(id);
    const done = this.text(this.ids.slice(this.prefix, this.read));
    const text = this.text(this.ids.slice(this.prefix));
    if (text.length > done.length && !text.endsWith("\ufffd")) {
      this.prefix = this.read;
      this.read = this.ids.length;
      return text.slice(done.length);
    }
    return "";
  }
  flush() {
    const done = this.text(this.ids.slice(this.prefix, this.read));
    const text = this.text(this.ids.slice(this.prefix));
    this.prefix = this.read = this.ids.length;
    return text.length > done.length ? text.slice(done.length) : "";
  }
}
