// The reference ids for dtrain's HuggingFace tokenizers: HF tokenizers.js (@huggingface/tokenizers, pinned in
// package.json) encoding each document of a JSONL corpus with add_special_tokens false, as Python's
// tokenizer.encode(text, add_special_tokens=False) does.
//
//   node hf_encode.mjs TOKENIZER CORPUS.jsonl          per document, one line: {"ids": [...], "decoded": "..."}
//                                                      (decoded: the ids decoded again, special tokens kept, no
//                                                      clean-up of spaces)
//   node hf_encode.mjs --speed TOKENIZER TEXT_FILE N   encodes the file's lines N times, prints MB/s (bench/)
//
// TOKENIZER is a tokenizer.json or a directory holding one; a tokenizer_config.json next to it is read too.
//
// Where tokenizers.js is known to differ from the Rust tokenizers (Python's), this script corrects it, so that the
// ids it prints are the Rust library's:
//   - tokenizers.js's ByteLevel pre-tokenizer (GPT-2) matches its pattern with JavaScript's \s, which counts U+FEFF
//     as a space and U+0085 not; Rust compiles the same pattern with Oniguruma, whose \s is Unicode White_Space
//     (U+0085 yes, U+FEFF no). tokenizers.js's own Split pre-tokenizer already translates \s so; the ByteLevel
//     pattern gets the same translation here.
// Known differences it does not correct (the tests take them into account where they say so):
//   - the Metaspace decoder: tokenizers.js drops one leading space of the first token, Rust every ▁ in it;
//   - the Metaspace pre-tokenizer ignores "split" (Rust splits before each ▁ when it is true);
//   - added tokens' single_word is ignored (Rust matches such a token only as a word of its own);
//   - the ByteFallback decoder decodes invalid byte runs with TextDecoder (one U+FFFD per maximal subpart), Rust
//     gives one U+FFFD per byte.
import fs from "node:fs";
import path from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";

const kByteLevelPattern =
  /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\p{White_Space}\p{L}\p{N}]+|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+/gu;

function load_tokenizer(where) {
  const json_path = fs.statSync(where).isDirectory() ? path.join(where, "tokenizer.json") : where;
  const config_path = path.join(path.dirname(json_path), "tokenizer_config.json");
  const config = fs.existsSync(config_path) ? JSON.parse(fs.readFileSync(config_path, "utf8")) : {};
  const tokenizer = new Tokenizer(JSON.parse(fs.readFileSync(json_path, "utf8")), config);
  fix_byte_level_pattern(tokenizer.pre_tokenizer);
  return tokenizer;
}

// Replaces the pattern of every ByteLevel pre-tokenizer (alone or inside a Sequence) with kByteLevelPattern.
function fix_byte_level_pattern(pre_tokenizer) {
  if (!pre_tokenizer) return;
  if (pre_tokenizer.constructor.name.startsWith("ByteLevel") && pre_tokenizer.pattern) {
    pre_tokenizer.pattern = kByteLevelPattern;
  }
  for (const inner of pre_tokenizer.tokenizers ?? []) fix_byte_level_pattern(inner);
}

function encode(tokenizer, text) {
  return tokenizer.encode(text, { add_special_tokens: false }).ids;
}

const args = process.argv.slice(2);
if (args[0] === "--speed") {
  const [, where, text_file, reps] = args;
  const tokenizer = load_tokenizer(where);
  const lines = fs.readFileSync(text_file, "utf8").split("\n");
  const bytes = Buffer.byteLength(lines.join("\n"), "utf8");
  const start = process.hrtime.bigint();
  let ids = 0;
  for (let r = 0; r < Number(reps); ++r) {
    for (const line of lines) ids += encode(tokenizer, line).length;
  }
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  const mb_per_s = (bytes * Number(reps)) / 1e6 / seconds;
  console.log(JSON.stringify({ mb_per_s, ids, seconds, peak_rss_mb: process.resourceUsage().maxRSS / 1024 }));
} else if (args.length === 2) {
  const tokenizer = load_tokenizer(args[0]);
  const out = [];
  for (const line of fs.readFileSync(args[1], "utf8").split("\n")) {
    if (line.trim() === "") continue;
    const ids = encode(tokenizer, JSON.parse(line).text);
    const decoded =
      ids.length === 0 ? "" : tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
    out.push(JSON.stringify({ ids, decoded }));
  }
  process.stdout.write(out.join("\n") + "\n");
} else {
  console.error("usage: hf_encode.mjs TOKENIZER CORPUS.jsonl | hf_encode.mjs --speed TOKENIZER TEXT_FILE N");
  process.exit(2);
}
