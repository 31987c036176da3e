#pragma once
// The tokenizer a GGUF file describes: tokenizer.ggml.* metadata -> dc::TokenizerData.
//
//   dc::GgufFile file(path);
//   dc::Tokenizer tok(dc::tokenizer_data_from_gguf(file));
//
// Defaults for absent keys follow Hugging Face's GGUF loader (and llama.cpp): a "llama"
// (SentencePiece) vocabulary adds BOS and a space prefix unless the file says otherwise; a "gpt2"
// one adds neither. Errors name the file and the key.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "gguf.hpp"
#include "tokenizer.hpp"

namespace dc {

inline TokenizerData tokenizer_data_from_gguf(const GgufFile& file) {
  const std::string where = "gguf '" + file.path().string() + "': ";
  DC_CHECK(file.has("tokenizer.ggml.model"), where, "no tokenizer (tokenizer.ggml.model missing)");
  DC_CHECK(file.has("tokenizer.ggml.tokens"), where, "tokenizer.ggml.tokens missing");

  TokenizerData d;
  d.model = file.get_string("tokenizer.ggml.model");
  if (file.has("tokenizer.ggml.pre")) d.pre = file.get_string("tokenizer.ggml.pre");
  d.tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (file.has("tokenizer.ggml.scores")) d.scores = file.get_float_array("tokenizer.ggml.scores");
  if (file.has("tokenizer.ggml.token_type")) {
    const std::vector<std::int64_t> types = file.get_int_array("tokenizer.ggml.token_type");
    d.token_types.reserve(types.size());
    for (std::size_t i = 0; i < types.size(); ++i) {
      DC_CHECK(types[i] >= 0 && types[i] <= 6, where, "tokenizer.ggml.token_type[", i, "] = ",
               types[i], " is not a token type (0..6)");
      d.token_types.push_back(static_cast<std::int32_t>(types[i]));
    }
  }
  if (file.has("tokenizer.ggml.merges")) d.merges = file.get_string_array("tokenizer.ggml.merges");

  auto id = [&](std::string_view key) -> std::int32_t {
    if (!file.has(key)) return -1;
    const std::int64_t v = file.get_int(key);
    // Out-of-range ids are reported by the Tokenizer, which knows the vocabulary size.
    DC_CHECK(v >= -1 && v <= INT32_MAX, where, key, " = ", v, " is not a token id");
    return static_cast<std::int32_t>(v);
  };
  d.bos = id("tokenizer.ggml.bos_token_id");
  d.eos = id("tokenizer.ggml.eos_token_id");
  d.unk = id("tokenizer.ggml.unknown_token_id");
  d.pad = id("tokenizer.ggml.padding_token_id");

  const bool spm = d.model == "llama";
  auto flag = [&](std::string_view key, bool fallback) {
    return file.has(key) ? file.get_bool(key) : fallback;
  };
  d.add_bos = flag("tokenizer.ggml.add_bos_token", spm);
  d.add_eos = flag("tokenizer.ggml.add_eos_token", false);
  d.add_space_prefix = flag("tokenizer.ggml.add_space_prefix", spm);
  return d;
}

}  // namespace dc
