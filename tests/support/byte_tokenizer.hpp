#pragma once
// A byte-level tokenizer for tests: every byte is one token (GPT-2's printable spelling of it,
// as byte-level BPE vocabularies store bytes), so n characters give n tokens. with_chatml adds
// <|im_start|> and <|im_end|> as control tokens 256 and 257.
#include <string>

#include <distillcache/io/tokenizer.hpp>

namespace dc_test {

inline dc::Tokenizer byte_tokenizer(bool with_chatml = false) {
  dc::TokenizerData data;
  data.model = "gpt2";
  data.pre = "default";
  for (int b = 0; b < 256; ++b) {
    std::string s;
    dc::detail::tok::append_utf8(s, dc::detail::tok::byte_to_cp()[std::size_t(b)]);
    data.tokens.push_back(s);
    data.token_types.push_back(1);
  }
  if (with_chatml) {
    for (const char* special : {"<|im_start|>", "<|im_end|>"}) {
      data.tokens.push_back(special);
      data.token_types.push_back(3);  // control
    }
  }
  return dc::Tokenizer(data);
}

}  // namespace dc_test
