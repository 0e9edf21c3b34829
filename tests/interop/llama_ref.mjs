#!/usr/bin/env node
// llama.cpp as a reference: raw logits (and tokenizations) of a GGUF model, computed by the CPU prebuilt of
// llama.cpp that npm's node-llama-cpp ships. q4tune's agreement tests compare against what this writes.
//
//   node llama_ref.mjs --model M.gguf --ids-file ids.json --out out.json [--lora A.gguf [--lora-scale S]]...
//                      [--tokenize-file strings.json --tokens-out tokens.json] [--node-llama DIR]
//                      [--and --model M2.gguf ...]...
//
// --and starts another job (its own model, files and adapters) run by the same process: node-llama-cpp's start
// (node, the module, and the child process it tests its binary in) takes seconds, a job on a test model a second.
//
// ids.json: a JSON array of token ids, or {"ids": [...]}. out.json: {"logits": [[n_vocab floats] per position]},
// position p holding the logits that predict token p+1 (llama.cpp evaluates exactly the ids given; no BOS is added).
// strings.json: a JSON array of strings. tokens.json: {"tokens": [[ids] per string], "bos_token_id", "add_bos_token"}.
// Tokenization parses special-token text ("<s>" becomes the BOS id), as llama.cpp's own tools (llama-cli,
// llama-server, llama-tokenize) do by default, and adds no BOS: llama.cpp adds it only when
// tokenizer.ggml.add_bos_token says so, which tokens.json reports as add_bos_token for the caller to apply.
// --node-llama DIR: where install_node_llama.sh put node-llama-cpp (DIR/node_modules/node-llama-cpp); the default
// is the install script's default.
// Everything goes to files, never stdout: a large stdout through a pipe is cut when node exits.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {pathToFileURL} from "node:url";

const usage = "usage: node llama_ref.mjs --model M.gguf [--ids-file ids.json --out out.json] " +
  "[--lora A.gguf [--lora-scale S]]... [--tokenize-file strings.json --tokens-out tokens.json] [--node-llama DIR] " +
  "[--and --model M2.gguf ...]...";

class UsageError extends Error {}

function defaultNodeLlamaDir() {
  if (process.env.Q4T_NODE_CACHE) return process.env.Q4T_NODE_CACHE;
  const cache = process.env.XDG_CACHE_HOME || path.join(os.homedir(), ".cache");
  return path.join(cache, "q4tune", "node-llama-cpp-3.22.1");
}

function parseArgs(argv) {
  const args = {model: null, idsFile: null, out: null, loras: [], tokenizeFile: null, tokensOut: null,
                nodeLlama: defaultNodeLlamaDir()};
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new UsageError(`${flag} needs a value`);
      return argv[++i];
    };
    switch (flag) {
      case "--model": args.model = value(); break;
      case "--ids-file": args.idsFile = value(); break;
      case "--out": args.out = value(); break;
      case "--lora": args.loras.push({filePath: path.resolve(value()), scale: 1}); break;
      case "--lora-scale": {
        if (args.loras.length === 0) throw new UsageError("--lora-scale must follow the --lora it scales");
        const scale = Number(value());
        if (!Number.isFinite(scale)) throw new UsageError(`--lora-scale '${argv[i]}' is not a number`);
        args.loras[args.loras.length - 1].scale = scale;
        break;
      }
      case "--tokenize-file": args.tokenizeFile = value(); break;
      case "--tokens-out": args.tokensOut = value(); break;
      case "--node-llama": args.nodeLlama = value(); break;
      default: throw new UsageError(`unknown argument '${flag}'`);
    }
  }
  if (!args.model) throw new UsageError("--model is required");
  if (!!args.idsFile !== !!args.out) throw new UsageError("--ids-file and --out go together");
  if (!!args.tokenizeFile !== !!args.tokensOut) throw new UsageError("--tokenize-file and --tokens-out go together");
  if (!args.idsFile && !args.tokenizeFile) throw new UsageError("nothing to do: give --ids-file or --tokenize-file");
  return args;
}

function readJson(file, what) {
  let text;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch (e) {
    throw new Error(`cannot read ${what} '${file}': ${e.message}`);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`${what} '${file}' is not valid JSON: ${e.message}`);
  }
}

function readIds(file) {
  const json = readJson(file, "ids file");
  const ids = Array.isArray(json) ? json : json?.ids;
  if (!Array.isArray(ids) || ids.length === 0 || !ids.every(Number.isInteger))
    throw new Error(`ids file '${file}' must hold a non-empty array of integer token ids (or {"ids": [...]})`);
  return ids;
}

function readStrings(file) {
  const strings = readJson(file, "tokenize file");
  if (!Array.isArray(strings) || !strings.every(s => typeof s === "string"))
    throw new Error(`tokenize file '${file}' must hold a JSON array of strings`);
  return strings;
}

// node-llama-cpp is ESM-only, and ESM ignores NODE_PATH: import its entry point by file URL.
async function importNodeLlama(dir) {
  const pkgDir = path.join(dir, "node_modules", "node-llama-cpp");
  const pkgFile = path.join(pkgDir, "package.json");
  if (!fs.existsSync(pkgFile))
    throw new Error(`node-llama-cpp is not installed under '${dir}' (no ${pkgFile}); ` +
                    "run tests/interop/install_node_llama.sh first, or pass --node-llama DIR");
  const pkg = JSON.parse(fs.readFileSync(pkgFile, "utf8"));
  const entry = pkg.exports?.["."]?.import ?? pkg.main ?? "./dist/index.js";
  return import(pathToFileURL(path.join(pkgDir, entry)).href);
}

// One position's logits come back as a Map token -> logit sorted by value; lay them out by token id.
function denseLogits(map, nVocab, position) {
  if (!(map instanceof Map) || map.size !== nVocab)
    throw new Error(`llama.cpp returned ${map?.size ?? "no"} logits at position ${position}, expected ${nVocab}`);
  const row = new Array(nVocab);
  for (const [token, logit] of map) {
    if (!(token >= 0 && token < nVocab)) throw new Error(`llama.cpp returned a logit for token ${token} >= ${nVocab}`);
    row[token] = logit;
  }
  return row;
}

async function evaluateLogits(model, ids, loras) {
  const nVocab = model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length;
  if (!Number.isInteger(nVocab)) throw new Error("the model has no tokenizer.ggml.tokens array");
  const bad = ids.find(t => t < 0 || t >= nVocab);
  if (bad !== undefined) throw new Error(`token id ${bad} is outside the vocabulary [0, ${nVocab})`);

  const context = await model.createContext({
    // node-llama-cpp keeps one cell free and would shift the context (drop its start) to evaluate the last id
    // of a full context: ask for one more cell than there are ids.
    contextSize: ids.length + 1,
    batchSize: ids.length,  // one batch: every position goes through the same kernels
    sequences: 1,
    flashAttention: false,
    // f32 KV cache: llama.cpp's default f16 cache would round K and V, which is llama.cpp's choice, not the model.
    experimentalKvCacheKeyType: "F32",
    experimentalKvCacheValueType: "F32",
    ...(loras.length > 0 ? {lora: {adapters: loras}} : {}),
  });
  try {
    const sequence = context.getSequence();
    const results = await sequence.controlledEvaluate(ids.map(t => [t, {generateNext: {logits: true}}]));
    const evaluated = sequence.contextTokens;
    if (results.length !== ids.length || evaluated.length !== ids.length || evaluated.some((t, i) => t !== ids[i]))
      throw new Error(`llama.cpp's context does not hold exactly the ${ids.length} ids given (context size ` +
                      `${context.contextSize}): the context was shifted or cut`);
    return results.map((r, p) => denseLogits(r?.next?.logits, nVocab, p));
  } finally {
    await context.dispose();
  }
}

function tokenizeAll(model, strings) {
  return {
    // specialTokens = true: llama.cpp's default parse_special for prompts (see the header comment).
    tokens: strings.map(s => Array.from(model.tokenize(s, true))),
    bos_token_id: model.tokens.bos,
    add_bos_token: model.tokens.shouldPrependBosToken,
  };
}

// The jobs of argv: its parts between --and.
function parseJobs(argv) {
  const jobs = [];
  for (let start = 0; start <= argv.length;) {
    let end = argv.indexOf("--and", start);
    if (end < 0) end = argv.length;
    jobs.push(parseArgs(argv.slice(start, end)));
    start = end + 1;
  }
  return jobs;
}

async function runJob(llama, args) {
  const ids = args.idsFile ? readIds(args.idsFile) : null;
  const strings = args.tokenizeFile ? readStrings(args.tokenizeFile) : null;
  const model = await llama.loadModel({modelPath: path.resolve(args.model), gpuLayers: 0});
  try {
    if (strings) fs.writeFileSync(args.tokensOut, JSON.stringify(tokenizeAll(model, strings)));
    if (ids) fs.writeFileSync(args.out, JSON.stringify({logits: await evaluateLogits(model, ids, args.loras)}));
  } finally {
    await model.dispose();
  }
}

async function main() {
  const jobs = parseJobs(process.argv.slice(2));
  for (const args of jobs) {
    if (!fs.existsSync(args.model)) throw new Error(`model '${args.model}' does not exist`);
    for (const lora of args.loras)
      if (!fs.existsSync(lora.filePath)) throw new Error(`LoRA adapter '${lora.filePath}' does not exist`);
  }
  const {getLlama, LlamaLogLevel} = await importNodeLlama(jobs[0].nodeLlama);
  // The CPU prebuilt only: never compile llama.cpp, never download anything.
  const llama = await getLlama({gpu: false, build: "never", skipDownload: true, usePrebuiltBinaries: true,
                                progressLogs: false, logLevel: LlamaLogLevel.error});
  try {
    for (const args of jobs) await runJob(llama, args);
  } finally {
    await llama.dispose();
  }
}

try {
  await main();
  process.exit(0);
} catch (e) {
  process.stderr.write(`llama_ref.mjs: ${e?.message ?? e}\n`);
  if (e instanceof UsageError) process.stderr.write(`${usage}\n`);
  process.exit(e instanceof UsageError ? 2 : 1);
}
