#pragma once
// dc::Tokenizer: the tokenizer a GGUF model describes, encode and decode, with the ids Hugging Face
// gives for the same file.
//
// Two algorithms, chosen by TokenizerData::model (tokenizer.ggml.model):
//
//  "gpt2"   byte-level BPE. Text is cut into pieces by the GPT-2 split
//             's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//           (matched by hand over UTF-8 code points, with generated Unicode class tables); each
//           piece's bytes become the 256 "byte characters" of GPT-2 and are merged by the rank of
//           the merge rules, lowest rank first, leftmost first on ties (Hugging Face's BPE).
//           Every byte string round-trips, invalid UTF-8 included (a byte that does not start a
//           valid UTF-8 sequence counts as one "other", punctuation-like, character) -- except
//           bytes the vocabulary has no token for, which are dropped as Hugging Face drops them.
//  "llama"  SentencePiece BPE as llama.cpp runs it: spaces become U+2581, a space is prefixed
//           (add_space_prefix) to the text and after every special token, adjacent pieces merge
//           greedily by the highest score (leftmost on ties), characters without a piece fall
//           back to <0xNN> byte tokens, or to unk when there are none.
//
// In both, tokens typed control (3) or user-defined (4) -- and unknown (2) for "llama", as in
// llama.cpp -- are matched verbatim in the input before anything else (leftmost, longest first,
// as Hugging Face's added-token matcher does) unless encode() is told not to parse them.
//
// Pre-tokenizer of "gpt2" vocabularies: Hugging Face builds a GGUF's byte-level tokenizer as
// GPT2Tokenizer and only swaps the split for the pre values it lists (llama3, qwen2, ...), none of
// which is supported here. So for pre "smollm" it applies the plain GPT-2 split above. llama.cpp
// (and SmolLM2's own tokenizer.json) first isolates every \p{N} character; that variant is
// TokenizerData::split_digits. The two differ only where whitespace or another character meets a
// number (HF: "a  1" -> a,Ġ,Ġ,1; llama.cpp: a,ĠĠ,1).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "detail/unicode_tables.hpp"

namespace dc {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : std::int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

// Everything a tokenizer needs, as a GGUF stores it (see io/tokenizer_gguf.hpp).
struct TokenizerData {
  std::string model;                      // "gpt2" (byte-level BPE) or "llama" (SentencePiece)
  std::string pre;                        // tokenizer.ggml.pre, e.g. "smollm"; "gpt2" only
  std::vector<std::string> tokens;        // id -> text, as stored (GPT-2 byte characters, U+2581...)
  std::vector<float> scores;              // "llama": one per token; "gpt2": empty or one per token
  std::vector<std::int32_t> token_types;  // TokenType values; empty = all normal
  std::vector<std::string> merges;        // "gpt2": "left right", best (rank 0) first
  std::int32_t bos = -1, eos = -1, unk = -1, pad = -1;
  bool add_bos = false;           // encode(..., add_special = true) prepends bos
  bool add_eos = false;           // encode(..., add_special = true) appends eos
  bool add_space_prefix = true;   // "llama" only: prefix text fragments with a space
  bool split_digits = false;      // "gpt2" only: isolate each \p{N} first (llama.cpp's smollm)
};

namespace detail::tok {

// ---- UTF-8 ---------------------------------------------------------------------------------

struct Utf8Char {
  std::uint32_t cp;  // the code point; for an invalid byte, 0xFFFFFFFF
  std::uint32_t len;  // bytes consumed (1 for an invalid byte)
};
inline constexpr std::uint32_t kInvalidCp = 0xFFFFFFFFu;

// Strict decoder: overlong forms, surrogates, values past U+10FFFF and truncated sequences are
// invalid, and then only their first byte is consumed.
inline Utf8Char decode_utf8(const unsigned char* p, std::size_t n) {
  const unsigned b0 = p[0];
  if (b0 < 0x80) return {b0, 1};
  std::uint32_t len, cp, min;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return {kInvalidCp, 1};
  }
  if (n < len) return {kInvalidCp, 1};
  for (std::uint32_t i = 1; i < len; ++i) {
    if ((p[i] & 0xC0) != 0x80) return {kInvalidCp, 1};
    cp = (cp << 6) | (p[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return {kInvalidCp, 1};
  return {cp, len};
}

inline void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// ---- Unicode classes -------------------------------------------------------------------------

enum CpClass : std::uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

inline CpClass class_from_table(std::uint32_t cp) {
  constexpr std::span<const std::uint32_t> runs(unicode::kClassRuns);
  // The last run whose first code point is <= cp.
  const auto it = std::upper_bound(runs.begin(), runs.end(), cp, [](std::uint32_t v, std::uint32_t e) {
    return v < (e & 0xFFFFFFu);
  });
  return static_cast<CpClass>(*(it - 1) >> 24);
}

inline const std::array<CpClass, 128>& ascii_classes() {
  static const std::array<CpClass, 128> table = [] {
    std::array<CpClass, 128> t{};
    for (std::uint32_t c = 0; c < 128; ++c) t[c] = class_from_table(c);
    return t;
  }();
  return table;
}

inline CpClass cp_class(std::uint32_t cp) {
  if (cp < 128) return ascii_classes()[cp];
  if (cp == kInvalidCp) return kOther;
  return class_from_table(cp);
}

// ---- GPT-2 split -----------------------------------------------------------------------------

// Cuts `s` the way  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// does (the alternatives are tried in that order at each position; every character is matched
// by one of them, so the pieces tile the input). Calls emit(begin, end) for each piece.
template <class Emit>
void gpt2_split(std::string_view s, Emit&& emit) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  auto at = [&](std::size_t i) { return decode_utf8(p + i, n - i); };
  // End of the run of characters of class k starting at i.
  auto run_end = [&](std::size_t i, CpClass k) {
    while (i < n) {
      const Utf8Char c = at(i);
      if (cp_class(c.cp) != k) break;
      i += c.len;
    }
    return i;
  };
  std::size_t i = 0;
  while (i < n) {
    const std::size_t start = i;
    // Contractions (case-sensitive, as in the GPT-2 pattern).
    if (p[i] == '\'' && i + 1 < n) {
      const char a = char(p[i + 1]);
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        i += 2;
        emit(start, i);
        continue;
      }
      if (i + 2 < n) {
        const char b = char(p[i + 2]);
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
          i += 3;
          emit(start, i);
          continue;
        }
      }
    }
    // ' ?' then a letter, number or "other" run.
    std::size_t j = (p[i] == ' ' && i + 1 < n) ? i + 1 : i;
    const Utf8Char c = at(j);
    const CpClass k = cp_class(c.cp);
    if (k != kSpace) {
      i = run_end(j + c.len, k);
      emit(start, i);
      continue;
    }
    // Whitespace: the run, less its last character when a non-space follows and the run has
    // more than one character (\s+(?!\S) backtracks by one; that last one then joins the next
    // piece if it is ' ', or stands alone via \s+).
    std::size_t last = i;
    j = i;
    while (j < n) {
      const Utf8Char w = at(j);
      if (cp_class(w.cp) != kSpace) break;
      last = j;
      j += w.len;
    }
    i = (j < n && last > start) ? last : j;
    emit(start, i);
  }
}

// ---- GPT-2 byte characters -------------------------------------------------------------------

// Byte b -> the code point GPT-2 writes it as: printable Latin-1 stays, the rest move to 256+.
inline const std::array<std::uint32_t, 256>& byte_to_cp() {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    std::uint32_t next = 256;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

// ---- A flat hash map from a token pair to its merge ------------------------------------------

struct MergeInfo {
  std::int32_t rank;
  std::int32_t merged;
};

class PairMap {
 public:
  void reserve(std::size_t n) {
    std::size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots_.assign(cap, Slot{kEmpty, {0, 0}});
    mask_ = cap - 1;
  }
  // Keeps the first value inserted for a key. Returns false if the key was present.
  bool insert(std::int32_t a, std::int32_t b, MergeInfo v) {
    const std::uint64_t key = make_key(a, b);
    for (std::size_t i = hash(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty) {
        slots_[i] = Slot{key, v};
        return true;
      }
      if (slots_[i].key == key) return false;
    }
  }
  const MergeInfo* find(std::int32_t a, std::int32_t b) const {
    if (slots_.empty()) return nullptr;
    const std::uint64_t key = make_key(a, b);
    for (std::size_t i = hash(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};  // ids are never negative
  struct Slot {
    std::uint64_t key;
    MergeInfo value;
  };
  static std::uint64_t make_key(std::int32_t a, std::int32_t b) {
    return (std::uint64_t(std::uint32_t(a)) << 32) | std::uint32_t(b);
  }
  std::size_t hash(std::uint64_t key) const {
    return std::size_t((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
  }
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
};

// Transparent hashing so vocabulary lookups take a string_view without allocating.
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

}  // namespace detail::tok

// `text` with every byte that is not part of a valid UTF-8 character replaced by U+FFFD. Generated
// text is the model's bytes: a byte-level tokenizer can stop inside a character (a generation cut
// at its token limit) or emit a lone continuation byte, and a file other tools read as text (an
// answers CSV, JSON) must hold valid UTF-8. Valid text comes back unchanged.
inline std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (std::size_t i = 0; i < text.size();) {
    const detail::tok::Utf8Char c = detail::tok::decode_utf8(p + i, text.size() - i);
    if (c.cp == detail::tok::kInvalidCp)
      detail::tok::append_utf8(out, 0xFFFD);
    else
      out.append(text.substr(i, c.len));
    i += c.len;
  }
  return out;
}

class Tokenizer {
 public:
  explicit Tokenizer(TokenizerData data) : d_(std::move(data)) { build(); }

  // Token ids of `text`. add_special: prepend bos / append eos as add_bos / add_eos say.
  // parse_special: match control/user-defined token text verbatim (false: treat it as text).
  std::vector<std::int32_t> encode(std::string_view text, bool add_special = false,
                                   bool parse_special = true) const {
    std::vector<std::int32_t> out;
    if (add_special && d_.add_bos && d_.bos >= 0) out.push_back(d_.bos);
    Scratch scratch;
    bool after_special = true;  // the start counts as "after a special token" (llama.cpp)
    auto text_fragment = [&](std::string_view frag) {
      if (byte_level_) encode_gpt2(frag, out, scratch);
      else encode_spm(frag, after_special, out, scratch);
      after_special = false;
    };
    std::size_t start = 0;
    if (parse_special && !special_by_first_byte_.empty()) {
      for (std::size_t i = 0; i < text.size();) {
        const std::int32_t id = match_special(text, i);
        if (id < 0) {
          ++i;
          continue;
        }
        if (start < i) text_fragment(text.substr(start, i - start));
        out.push_back(id);
        after_special = true;
        i += d_.tokens[std::size_t(id)].size();
        start = i;
      }
    }
    if (start < text.size()) text_fragment(text.substr(start));
    if (add_special && d_.add_eos && d_.eos >= 0) out.push_back(d_.eos);
    return out;
  }

  // The bytes the ids stand for. Not always valid UTF-8 (a sequence may end mid-character, and
  // byte-level BPE can encode any bytes). Special tokens are written as their text. For
  // "llama" vocabularies, the space that encode() prefixes to the text and after each special
  // token is removed again, so decode(encode(s)) == s.
  std::string decode(std::span<const std::int32_t> ids) const {
    std::string out;
    if (byte_level_) {
      for (const std::int32_t id : ids) out += pieces_[check_id(id)];
      return out;
    }
    // SentencePiece: U+2581 -> ' ' over each run of text tokens (after the byte tokens are
    // joined, as Hugging Face's ByteFallback+Fuse+Replace decoder does), then drop the prefix
    // space of a run that starts the output or follows a special token.
    std::string run;
    bool after_special = true;
    auto flush = [&] {
      const std::size_t before = out.size();
      append_unescaped(out, run);
      if (d_.add_space_prefix && after_special && out.size() > before && out[before] == ' ')
        out.erase(before, 1);
      run.clear();
      after_special = false;
    };
    for (const std::int32_t id : ids) {
      const std::size_t i = check_id(id);
      if (is_special_[i]) {
        flush();
        out += d_.tokens[i];
        after_special = true;
      } else {
        run += pieces_[i];
      }
    }
    flush();
    return out;
  }

  // The token's text as the vocabulary stores it.
  std::string token_text(std::int32_t id) const { return d_.tokens[check_id(id)]; }
  // The bytes one token decodes to on its own (no prefix-space removal): for streaming output.
  std::string token_bytes(std::int32_t id) const {
    const std::size_t i = check_id(id);
    if (byte_level_ || is_special_[i]) return pieces_[i];
    std::string out;
    append_unescaped(out, pieces_[i]);
    return out;
  }
  // The id whose stored text is exactly `text`, or -1.
  std::int32_t token_id(std::string_view text) const {
    const auto it = vocab_.find(text);
    return it == vocab_.end() ? -1 : it->second;
  }
  TokenType token_type(std::int32_t id) const { return type_of(check_id(id)); }
  // Control, user-defined (and for "llama" unknown) tokens: matched verbatim by encode().
  bool is_special(std::int32_t id) const { return is_special_[check_id(id)] != 0; }

  int vocab_size() const { return int(d_.tokens.size()); }
  bool byte_level() const { return byte_level_; }
  std::int32_t bos() const { return d_.bos; }
  std::int32_t eos() const { return d_.eos; }
  std::int32_t unk() const { return d_.unk; }
  std::int32_t pad() const { return d_.pad; }
  const TokenizerData& data() const { return d_; }

 private:
  // Buffers reused across the pieces of one encode() call.
  // A symbol of the word being merged, in a doubly linked list; len 0 = merged into its left.
  struct Sym {
    std::int32_t id;      // gpt2: current token id; spm: unused
    std::uint32_t start;  // spm: byte offset in the text
    std::uint32_t len;    // spm: byte length; gpt2: 1 while alive
    std::int32_t prev, next;
  };
  // A candidate merge of symbol `left` with its right neighbour; stale ones are skipped on pop.
  struct Cand {
    float score;           // spm: the merged piece's score (higher first)
    std::int32_t rank;     // gpt2: merge rank (lower first)
    std::int32_t left;     // left symbol index (lower first on ties)
    std::int32_t right;    // spm: right symbol index; gpt2: right symbol's id when pushed
    std::int32_t left_id;  // gpt2: left symbol's id when pushed; spm: the merged piece's id
    std::uint32_t size;    // spm: byte length of the merged piece
  };
  struct Scratch {
    std::vector<Sym> syms;
    std::vector<Cand> heap;
    std::string text;
  };

  static constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581

  // SentencePiece text with each U+2581 turned back into a space.
  static void append_unescaped(std::string& out, std::string_view piece) {
    for (std::size_t k = 0; k < piece.size();) {
      if (piece.compare(k, kSpaceMark.size(), kSpaceMark) == 0) {
        out += ' ';
        k += kSpaceMark.size();
      } else {
        out += piece[k++];
      }
    }
  }

  std::size_t check_id(std::int32_t id) const {
    DC_CHECK(id >= 0 && std::size_t(id) < d_.tokens.size(), "token id ", id,
             " is out of range for a vocabulary of ", d_.tokens.size(), " tokens");
    return std::size_t(id);
  }
  TokenType type_of(std::size_t i) const {
    return d_.token_types.empty() ? TokenType::normal : TokenType(d_.token_types[i]);
  }

  // The longest special token starting at text[i], or -1.
  std::int32_t match_special(std::string_view text, std::size_t i) const {
    const auto& bucket = special_by_first_byte_[static_cast<unsigned char>(text[i])];
    for (const std::int32_t id : bucket) {  // longest first
      const std::string& t = d_.tokens[std::size_t(id)];
      if (text.compare(i, t.size(), t) == 0) return id;
    }
    return -1;
  }

  // ---- construction ----

  void build() {
    DC_CHECK(d_.model == "gpt2" || d_.model == "llama", "tokenizer model '", d_.model,
             "' is not supported (expected \"gpt2\" or \"llama\")");
    byte_level_ = d_.model == "gpt2";
    const std::size_t n = d_.tokens.size();
    DC_CHECK(n > 0, "tokenizer vocabulary is empty");
    DC_CHECK(n < std::size_t(INT32_MAX), "tokenizer vocabulary of ", n, " tokens is too large");
    DC_CHECK(d_.token_types.empty() || d_.token_types.size() == n, "tokenizer has ",
             d_.token_types.size(), " token types for ", n, " tokens");
    if (byte_level_) {
      DC_CHECK(d_.scores.empty() || d_.scores.size() == n, "tokenizer has ", d_.scores.size(),
               " scores for ", n, " tokens");
    } else {
      DC_CHECK(d_.scores.size() == n, "SentencePiece tokenizer has ", d_.scores.size(),
               " scores for ", n, " tokens");
    }
    for (std::size_t i = 0; i < d_.token_types.size(); ++i)
      DC_CHECK(d_.token_types[i] >= 0 && d_.token_types[i] <= 6, "token ", i, " has invalid type ",
               d_.token_types[i]);
    for (const auto& [name, id] : {std::pair{"bos", d_.bos}, std::pair{"eos", d_.eos},
                                   std::pair{"unk", d_.unk}, std::pair{"pad", d_.pad}})
      DC_CHECK(id >= -1 && id < std::int32_t(n), "tokenizer ", name, " id ", id,
               " is out of range for a vocabulary of ", n, " tokens");

    vocab_.reserve(n);
    is_special_.assign(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      vocab_[d_.tokens[i]] = std::int32_t(i);  // a duplicate text maps to its last id, as in HF
      const TokenType t = type_of(i);
      const bool special = t == TokenType::control || t == TokenType::user_defined ||
                           (!byte_level_ && t == TokenType::unknown);
      if (special && !d_.tokens[i].empty()) {
        is_special_[i] = 1;
        if (special_by_first_byte_.empty()) special_by_first_byte_.resize(256);
        special_by_first_byte_[static_cast<unsigned char>(d_.tokens[i][0])].push_back(std::int32_t(i));
      }
    }
    for (auto& bucket : special_by_first_byte_)
      std::stable_sort(bucket.begin(), bucket.end(), [&](std::int32_t a, std::int32_t b) {
        return d_.tokens[std::size_t(a)].size() > d_.tokens[std::size_t(b)].size();
      });
    if (byte_level_) build_gpt2();
    else build_spm();
  }

  void build_gpt2() {
    static constexpr std::string_view kSupportedPre[] = {
        "", "default", "gpt2", "smollm", "starcoder", "refact", "command-r", "codeshell",
        "exaone", "minerva", "mpt", "olmo", "jais", "trillion", "granite-docling"};
    DC_CHECK(std::find(std::begin(kSupportedPre), std::end(kSupportedPre), d_.pre) != std::end(kSupportedPre),
             "byte-level pre-tokenizer '", d_.pre,
             "' is not supported (supported: the GPT-2 split, e.g. \"gpt2\", \"smollm\", \"starcoder\")");
    const auto& b2c = detail::tok::byte_to_cp();
    std::array<std::int32_t, 0x200> cp_to_byte{};
    cp_to_byte.fill(-1);
    for (std::size_t b = 0; b < 256; ++b) {
      std::string ch;
      detail::tok::append_utf8(ch, b2c[b]);
      // A byte without a token is dropped from the text, as Hugging Face's BPE (no unk) and
      // llama.cpp do: SmolLM2 has none for 21 bytes (0x04, 0xC0, 0xF5..0xFF, ...).
      byte_token_[b] = token_id(ch);
      cp_to_byte[b2c[b]] = std::int32_t(b);
    }
    merges_.reserve(d_.merges.size());
    for (std::size_t r = 0; r < d_.merges.size(); ++r) {
      const std::string& m = d_.merges[r];
      const std::size_t sp = m.find(' ');
      DC_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < m.size() &&
                   m.find(' ', sp + 1) == std::string::npos,
               "merge ", r, " '", m, "' is not two tokens separated by one space");
      const std::string_view left(m.data(), sp), right(m.data() + sp + 1, m.size() - sp - 1);
      const std::int32_t a = token_id(left), b = token_id(right);
      DC_CHECK(a >= 0, "merge ", r, " '", m, "' names unknown token '", left, "'");
      DC_CHECK(b >= 0, "merge ", r, " '", m, "' names unknown token '", right, "'");
      std::string joined(left);
      joined += right;
      const std::int32_t ab = token_id(joined);
      DC_CHECK(ab >= 0, "merge ", r, " '", m, "' makes '", joined, "', which is not a token");
      merges_.insert(a, b, {std::int32_t(r), ab});  // a repeated merge keeps its first rank (llama.cpp)
    }
    // What each token decodes to: GPT-2 byte characters back to bytes; special tokens and any
    // character outside that alphabet as they are written.
    pieces_.resize(d_.tokens.size());
    for (std::size_t i = 0; i < d_.tokens.size(); ++i) {
      const std::string& t = d_.tokens[i];
      if (is_special_[i]) {
        pieces_[i] = t;
        continue;
      }
      std::string& out = pieces_[i];
      const auto* p = reinterpret_cast<const unsigned char*>(t.data());
      for (std::size_t k = 0; k < t.size();) {
        const auto c = detail::tok::decode_utf8(p + k, t.size() - k);
        if (c.cp < cp_to_byte.size() && cp_to_byte[c.cp] >= 0) out += char(cp_to_byte[c.cp]);
        else out.append(t, k, c.len);
        k += c.len;
      }
    }
  }

  void build_spm() {
    byte_piece_.fill(-1);
    pieces_.resize(d_.tokens.size());
    for (std::size_t i = 0; i < d_.tokens.size(); ++i) {
      const std::string& t = d_.tokens[i];
      if (type_of(i) == TokenType::byte) {
        DC_CHECK(t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && hex_value(t[3]) >= 0 &&
                     hex_value(t[4]) >= 0,
                 "byte token ", i, " '", t, "' is not of the form <0xNN>");
        const int b = hex_value(t[3]) * 16 + hex_value(t[4]);
        byte_piece_[std::size_t(b)] = std::int32_t(i);
        pieces_[i] = std::string(1, char(b));
      } else {
        pieces_[i] = t;
      }
    }
  }

  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }

  // ---- byte-level BPE ----

  void encode_gpt2(std::string_view frag, std::vector<std::int32_t>& out, Scratch& s) const {
    auto piece = [&](std::size_t b, std::size_t e) { bpe(frag.substr(b, e - b), out, s); };
    if (!d_.split_digits) {
      detail::tok::gpt2_split(frag, piece);
      return;
    }
    // llama.cpp's two-stage split: every \p{N} character alone, the GPT-2 split in between.
    const auto* p = reinterpret_cast<const unsigned char*>(frag.data());
    std::size_t seg = 0;
    for (std::size_t i = 0; i < frag.size();) {
      const auto c = detail::tok::decode_utf8(p + i, frag.size() - i);
      if (detail::tok::cp_class(c.cp) == detail::tok::kNumber) {
        if (seg < i)
          detail::tok::gpt2_split(frag.substr(seg, i - seg),
                                  [&](std::size_t b, std::size_t e) { piece(seg + b, seg + e); });
        piece(i, i + c.len);
        seg = i + c.len;
      }
      i += c.len;
    }
    if (seg < frag.size())
      detail::tok::gpt2_split(frag.substr(seg),
                              [&](std::size_t b, std::size_t e) { piece(seg + b, seg + e); });
  }

  // Merges one piece's byte tokens: repeatedly the lowest-ranked adjacent pair, leftmost first,
  // via a heap of candidate pairs over a linked list of symbols (stale entries are skipped).
  void bpe(std::string_view word, std::vector<std::int32_t>& out, Scratch& s) const {
    auto& sym = s.syms;
    auto& heap = s.heap;
    sym.clear();
    heap.clear();
    for (const char ch : word) {
      const std::int32_t id = byte_token_[static_cast<unsigned char>(ch)];
      if (id < 0) continue;  // no token for this byte: dropped
      const auto k = std::int32_t(sym.size());
      sym.push_back({id, 0, 1, k - 1, -1});
      if (k > 0) sym[std::size_t(k) - 1].next = k;
    }
    const std::size_t n = sym.size();
    if (n <= 1) {
      if (n == 1) out.push_back(sym[0].id);
      return;
    }
    auto worse = [](const Cand& a, const Cand& b) {  // heap top = lowest rank, then leftmost
      return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
    };
    auto consider = [&](std::int32_t l) {
      if (l < 0) return;
      const std::int32_t r = sym[std::size_t(l)].next;
      if (r < 0) return;
      const auto* m = merges_.find(sym[std::size_t(l)].id, sym[std::size_t(r)].id);
      if (!m) return;
      heap.push_back({0.0f, m->rank, l, sym[std::size_t(r)].id, sym[std::size_t(l)].id, 0});
      std::push_heap(heap.begin(), heap.end(), worse);
    };
    for (std::size_t i = 0; i + 1 < n; ++i) consider(std::int32_t(i));
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), worse);
      const Cand c = heap.back();
      heap.pop_back();
      Sym& L = sym[std::size_t(c.left)];
      // Stale: the left symbol was merged away or changed, or its right neighbour changed.
      if (L.len == 0 || L.id != c.left_id || L.next < 0) continue;
      Sym& R = sym[std::size_t(L.next)];
      if (R.id != c.right) continue;
      L.id = merges_.find(L.id, R.id)->merged;
      R.len = 0;
      L.next = R.next;
      if (R.next >= 0) sym[std::size_t(R.next)].prev = c.left;
      consider(L.prev);
      consider(c.left);
    }
    for (std::int32_t i = 0; i >= 0; i = sym[std::size_t(i)].next) out.push_back(sym[std::size_t(i)].id);
  }

  // ---- SentencePiece ----

  // The id of a piece the SentencePiece merge may produce (normal or user-defined), or -1.
  std::int32_t spm_piece(std::string_view text) const {
    const auto it = vocab_.find(text);
    if (it == vocab_.end()) return -1;
    const TokenType t = type_of(std::size_t(it->second));
    return (t == TokenType::normal || t == TokenType::user_defined || t == TokenType::undefined)
               ? it->second
               : -1;
  }

  void encode_spm(std::string_view frag, bool after_special, std::vector<std::int32_t>& out,
                  Scratch& s) const {
    std::string& text = s.text;
    text.clear();
    if (d_.add_space_prefix && after_special) text += kSpaceMark;
    for (const char ch : frag) {
      if (ch == ' ') text += kSpaceMark;
      else text += ch;
    }
    DC_CHECK(text.size() < std::size_t(INT32_MAX), "text fragment of ", text.size(),
             " bytes is too long to tokenize");
    auto& sym = s.syms;
    auto& heap = s.heap;
    sym.clear();
    heap.clear();
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    for (std::size_t i = 0; i < text.size();) {
      const auto c = detail::tok::decode_utf8(p + i, text.size() - i);
      const auto k = std::int32_t(sym.size());
      sym.push_back({0, std::uint32_t(i), c.len, k - 1, -1});
      if (k > 0) sym[std::size_t(k) - 1].next = k;
      i += c.len;
    }
    auto worse = [](const Cand& a, const Cand& b) {  // heap top = highest score, then leftmost
      return a.score != b.score ? a.score < b.score : a.left > b.left;
    };
    auto consider = [&](std::int32_t l, std::int32_t r) {
      if (l < 0 || r < 0) return;
      const Sym& L = sym[std::size_t(l)];
      const Sym& R = sym[std::size_t(r)];
      const std::int32_t id = spm_piece(std::string_view(text).substr(L.start, L.len + R.len));
      if (id < 0) return;
      heap.push_back({d_.scores[std::size_t(id)], 0, l, r, id, L.len + R.len});
      std::push_heap(heap.begin(), heap.end(), worse);
    };
    for (std::size_t i = 1; i < sym.size(); ++i) consider(std::int32_t(i) - 1, std::int32_t(i));
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), worse);
      const Cand c = heap.back();
      heap.pop_back();
      Sym& L = sym[std::size_t(c.left)];
      Sym& R = sym[std::size_t(c.right)];
      if (L.len == 0 || R.len == 0 || L.len + R.len != c.size || L.next != c.right) continue;
      L.len += R.len;
      R.len = 0;
      L.next = R.next;
      if (R.next >= 0) sym[std::size_t(R.next)].prev = c.left;
      consider(L.prev, c.left);
      consider(c.left, L.next);
    }
    for (std::int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[std::size_t(i)].next) {
      const Sym& x = sym[std::size_t(i)];
      const std::string_view piece = std::string_view(text).substr(x.start, x.len);
      const std::int32_t id = spm_piece(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      // No piece: its bytes as <0xNN> tokens, else one unk.
      const bool bytes = std::all_of(piece.begin(), piece.end(), [&](char b) {
        return byte_piece_[static_cast<unsigned char>(b)] >= 0;
      });
      if (bytes) {
        for (const char b : piece) out.push_back(byte_piece_[static_cast<unsigned char>(b)]);
      } else {
        DC_CHECK(d_.unk >= 0, "cannot encode '", piece,
                 "': no piece, no byte tokens and no unknown token");
        out.push_back(d_.unk);
      }
    }
  }

  TokenizerData d_;
  bool byte_level_ = false;
  std::unordered_map<std::string, std::int32_t, detail::tok::StringHash, std::equal_to<>> vocab_;
  std::vector<std::string> pieces_;  // id -> the bytes it decodes to (llama: U+2581 kept; special: text)
  std::vector<std::uint8_t> is_special_;     // id -> matched verbatim by encode()
  std::vector<std::vector<std::int32_t>> special_by_first_byte_;  // empty when there are none
  std::array<std::int32_t, 256> byte_token_{};  // gpt2: byte -> its byte-character token, or -1
  std::array<std::int32_t, 256> byte_piece_{};  // llama: byte -> its <0xNN> token, or -1
  detail::tok::PairMap merges_;                 // gpt2: (left, right) -> rank, merged id
};

}  // namespace dc
