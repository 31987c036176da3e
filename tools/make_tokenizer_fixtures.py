#!/usr/bin/env python3
"""Oracle fixtures for dc::Tokenizer (include/distillcache/io/tokenizer.hpp).

Writes, under --out (default tests/fixtures/tokenizer):

  smollm2_cases.json  strings and the token ids Hugging Face gives for them with the SmolLM2
                      tokenizer loaded from the GGUF (AutoTokenizer.from_pretrained(dir,
                      gguf_file=...)). The vocabulary itself is not written: the C++ test reads it
                      from the same GGUF at test time.
  spm_tiny.gguf       a tiny SentencePiece BPE vocabulary (byte fallback) written the way
                      llama.cpp's converter writes a "llama" tokenizer, with no tensors.
  spm_cases.json      strings and SentencePiece's own encode ids for that vocabulary.

Usage (CPU only, a few seconds, deterministic):
  /opt/dcvenv/bin/python tools/make_tokenizer_fixtures.py \
      [--gguf ~/.cache/distillcache/SmolLM2-135M-Instruct.Q4_1.gguf] [--out tests/fixtures/tokenizer]

Needs transformers, tokenizers, gguf and sentencepiece (pip install sentencepiece).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def default_gguf() -> Path:
    env = os.environ.get("DC_SMOLLM2_GGUF")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "distillcache" / "SmolLM2-135M-Instruct.Q4_1.gguf"


# ---------------------------------------------------------------------------------------------
# Test strings
# ---------------------------------------------------------------------------------------------

GETTYSBURG = (
    "Four score and seven years ago our fathers brought forth on this continent, a new nation, "
    "conceived in Liberty, and dedicated to the proposition that all men are created equal.\n\n"
    "Now we are engaged in a great civil war, testing whether that nation, or any nation so "
    "conceived and so dedicated, can long endure. We are met on a great battle-field of that war. "
    "We have come to dedicate a portion of that field, as a final resting place for those who here "
    "gave their lives that that nation might live. It is altogether fitting and proper that we "
    "should do this.\n\n"
    "But, in a larger sense, we can not dedicate -- we can not consecrate -- we can not hallow -- "
    "this ground. The brave men, living and dead, who struggled here, have consecrated it, far "
    "above our poor power to add or detract. The world will little note, nor long remember what we "
    "say here, but it can never forget what they did here. It is for us the living, rather, to be "
    "dedicated here to the unfinished work which they who fought here have thus far so nobly "
    "advanced. It is rather for us to be here dedicated to the great task remaining before us -- "
    "that from these honored dead we take increased devotion to that cause for which they gave the "
    "last full measure of devotion -- that we here highly resolve that these dead shall not have "
    "died in vain -- that this nation, under God, shall have a new birth of freedom -- and that "
    "government of the people, by the people, for the people, shall not perish from the earth.\n"
    "-- Abraham Lincoln, November 19, 1863"
)

PYTHON_SNIPPET = '''def fib(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    out = [0, 1]
    while len(out) < n:
        out.append(out[-1] + out[-2])
    return out[:n]


if __name__ == "__main__":
\tprint(fib(10))  # tab-indented on purpose
'''

CPP_SNIPPET = '''#include <vector>

template <class T>
T sum(const std::vector<T>& xs) {
  T acc{};
  for (const auto& x : xs) acc += x;  // naive
  return acc;
}

int main() { return sum<int>({1, 2, 3}) == 6 ? 0 : 1; }
'''

# Named cases shared by both vocabularies (special-token cases are added per vocabulary).
COMMON_CASES: list[tuple[str, str]] = [
    ("empty", ""),
    ("single_space", " "),
    ("hello", "Hello world"),
    ("leading_space", " Hello world"),
    ("trailing_spaces", "Hello world   "),
    ("space_runs", "a  b   c    d     e"),
    ("indent_before_word", "        indented"),
    ("tabs", "tabs\tand\t\ttabs\t"),
    ("newlines", "line1\nline2\n\nline3\n"),
    ("crlf", "windows\r\nline\r\n\r\nend\r\n"),
    ("whitespace_only", "   \n\t  \r\n  "),
    ("mixed_ws_before_word", "a \t\n b\n\n  c"),
    ("contractions", "I'm sure they're here; we've seen it, she'll go, he'd say, it's John's, don't."),
    ("contractions_upper", "I'M SURE THEY'RE HERE, WE'VE, SHE'LL, HE'D, IT'S, DON'T"),
    ("apostrophes", "'s 't 're 've 'm 'll 'd ''s rock'n'roll ’s isn’t '"),
    ("digits", "1 12 123 1234 12345678901234567890"),
    ("numbers_in_text", "In 2024, 3.14159 and 1,000,000 people paid $19.99 (50% off)."),
    ("space_digit", "a  1 x  42  y   7"),
    ("unicode_digits", "٣٤٥ ४५६ x²³ ½ Ⅻ 𝟙𝟚"),
    ("accents", "Café naïve résumé façade Ångström Œuvre"),
    ("german", "Straße Grüße ÄÖÜ äöü"),
    ("combining", "e\u0301 a\u0308 n\u0303o Z\u0351\u0360a\u0336l\u0337g\u0338o"),
    ("devanagari", "नमस्ते दुनिया"),
    ("chinese", "你好，世界！这是一个测试。"),
    ("japanese", "こんにちは、世界。カタカナとひらがな"),
    ("korean", "안녕하세요 세계"),
    ("arabic_hebrew", "مرحبا بالعالم שלום עולם"),
    ("cyrillic_greek", "Привет, мир! Γειά σου Κόσμε"),
    ("thai", "สวัสดีชาวโลก"),
    ("emoji", "I love 🍕 and 🎉!"),
    ("emoji_zwj", "👨\u200d👩\u200d👧\u200d👦 family 👩🏽\u200d💻 coder 🏳️\u200d🌈"),
    ("emoji_skin_tones", "👍🏻👍🏼👍🏽👍🏾👍🏿"),
    ("flags", "🇫🇷🇯🇵 🇺🇳"),
    ("python_code", PYTHON_SNIPPET),
    ("cpp_code", CPP_SNIPPET),
    ("punctuation_runs", "Wait... what?!?! (really) [yes] {no} <tag/> --- *** ### @@@ ~~~"),
    ("punct_words", "foo!!!bar ???  !!! ,,,x"),
    ("url_email", "https://example.com/path?q=1&b=2#frag user@example.org"),
    ("markdown", "# Title\n\n- item 1\n- item 2\n\n**bold** _it_ `code`\n"),
    ("json", '{"key": [1, 2, {"nested": null}], "s": "a\\"b"}'),
    ("unicode_spaces", "a\u00a0b\u3000c\u2028d\u200be\u2009f\u0085g"),
    ("mixed_scripts", "naïveté日本語mix123abc"),
    ("math", "∑_{i=1}^{n} x_i² ≤ ∞ → ∀ε>0"),
    ("control_chars", "\x00a\x01b\x1f\x7f c"),
    ("lower_one_eighth_block", "\u2581x \u2581"),
    ("newer_unicode", "x\U000105c0\U000105c1 \U00031350\U00031351 y"),
    ("private_use", "\ue000\U0010fffd z"),
    ("long_passage", GETTYSBURG),
]


def random_strings(count: int, seed: int) -> list[str]:
    """Random strings over an alphabet chosen to hit every branch of the GPT-2 split."""
    rng = random.Random(seed)
    pools = [
        "abcxyzABCXYZ",
        "éüßøÆŒ",
        "αβγΩЖж",
        "日本語中文",
        "0123456789",
        "٣४²½Ⅻ",
        "'",
        "sStTmMdDlLrReEvV",
        " ",
        "  ",
        "\t\n\r",
        "\u00a0\u3000\u2028\u0085\u200b",
        "!?.,;:-_()[]{}<>/\\\"#$%&*+=@^`|~",
        "\u0301\u0308",
        "😀👍🏽\u200d❤️",
        "\U000105c0\U00031350",
    ]
    out = []
    for _ in range(count):
        n = rng.randint(1, 24)
        s = "".join(rng.choice(rng.choice(pools)) for _ in range(n))
        out.append(s)
    return out


# ---------------------------------------------------------------------------------------------
# (a) SmolLM2 through Hugging Face
# ---------------------------------------------------------------------------------------------

def make_smollm2(gguf_path: Path, out_dir: Path) -> dict:
    import transformers
    import tokenizers
    from tokenizers import Tokenizer, pre_tokenizers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    backend = tok.backend_tokenizer
    pre = json.loads(backend.to_str())["pre_tokenizer"]
    assert pre == {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                   "use_regex": True}, pre

    # The pipeline SmolLM2's own tokenizer.json declares and llama.cpp applies for pre "smollm":
    # every \p{N} character isolated first, then the GPT-2 split.
    digits = Tokenizer.from_str(backend.to_str())
    digits.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])

    messages = [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2? Answer in one word, then explain   why.\n"},
    ]
    chat = tok.apply_chat_template(messages, tokenize=False)
    chat_gen = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    cases = list(COMMON_CASES) + [
        ("unrepresentable_bytes", "a\x04b !\x04! \x06\x13\x14\x16\x1d x\x04\x05y \x04"),
        ("special_inline", "<|im_start|>user\nHi there<|im_end|>\n"),
        ("special_adjacent", "<|endoftext|><|endoftext|>text<|im_end|> <|im_start|>"),
        ("special_partial", "<|im_start| not closed <|im_end <|endoftext|"),
        ("special_other", "<repo_name>foo<file_sep>bar<filename>x.py<gh_stars>10"),
        ("special_in_word", "abc<|im_end|>def  <|im_start|>  ghi"),
        ("chat_template", chat),
        ("chat_template_generation_prompt", chat_gen),
    ]
    cases += [(f"random_{i:03d}", s) for i, s in enumerate(random_strings(150, seed=1234))]

    records = []
    n_digit_diff = 0
    n_decode_diff = 0
    for name, text in cases:
        ids = tok.encode(text, add_special_tokens=False)
        with_special = tok.encode(text, add_special_tokens=True)
        assert with_special == ids, (name, "add_special_tokens changed the ids")
        rec = {"name": name, "text": text, "ids": ids}
        alt = digits.encode(text, add_special_tokens=False).ids
        if alt != ids:
            rec["ids_split_digits"] = alt
            n_digit_diff += 1
        decoded = tok.decode(ids)
        if decoded != text:
            n_decode_diff += 1
            rec["decoded"] = decoded
        records.append(rec)

    # parse_special = false: the control tokens' text is split like any other text.
    unsplit_text = "<|im_start|>user\nHi<|im_end|>"
    unsplit = tok(unsplit_text, split_special_tokens=True, add_special_tokens=False)["input_ids"]
    assert 1 not in unsplit and 2 not in unsplit

    doc = {
        "description": (
            "Token ids of the SmolLM2-135M-Instruct tokenizer as Hugging Face builds it from the GGUF "
            "(AutoTokenizer.from_pretrained(dir, gguf_file=...)). 'ids': tokenizer.encode(text, "
            "add_special_tokens=False); add_special_tokens=True gives the same ids for every case "
            "(the GGUF says add_bos_token=false and the post-processor adds nothing). Hugging Face "
            "knows no 'smollm' pre-tokenizer for GGUF files, so it uses GPT2Tokenizer's plain "
            "ByteLevel split (GPT-2 regex). 'ids_split_digits' (only where it differs) is what "
            "SmolLM2's own tokenizer.json and llama.cpp's pre 'smollm' produce: each \\p{N} "
            "isolated first (Digits(individual_digits=True)), then the GPT-2 split. "
            "'decoded' (only where it is not the input) is tokenizer.decode(ids): the vocabulary "
            "has no token for 21 bytes (e.g. 0x04), which encode drops."),
        "gguf": gguf_path.name,
        "transformers_version": transformers.__version__,
        "tokenizers_version": tokenizers.__version__,
        "add_special_tokens_changes_ids": False,
        "parse_special_false": {"text": unsplit_text, "ids": unsplit},
        "cases": records,
    }
    path = out_dir / "smollm2_cases.json"
    path.write_text(json.dumps(doc, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    return {"smollm2_cases": len(records), "split_digits_differs": n_digit_diff,
            "decode_differs": n_decode_diff, "file": str(path)}


# ---------------------------------------------------------------------------------------------
# (b) A tiny SentencePiece BPE vocabulary, as llama.cpp's converter writes it
# ---------------------------------------------------------------------------------------------

SPM_EXTRA_TEXT = """
Café, naïve, résumé, façade and Straße are words with accents. Grüße aus München!
Γειά σου κόσμε. Привет, мир. The year 1863 and the number 3.14159 appear twice: 1863, 3.14159.
def main():
    return 0
    if x == 1:
        print("hello")
"""


def spm_training_text() -> str:
    parts = []
    licenses = Path("/usr/share/common-licenses")
    for name in ["Apache-2.0", "BSD", "MPL-2.0", "CC0-1.0"]:
        p = licenses / name
        if p.exists():
            parts.append(p.read_text(encoding="utf-8", errors="replace"))
    if not parts:  # no Debian licenses here: fall back to text we carry ourselves
        parts.append(GETTYSBURG * 4)
    parts.append(SPM_EXTRA_TEXT * 3)
    parts.append(GETTYSBURG)
    return "\n".join(parts)


def train_spm():
    """The tiny SentencePiece model (deterministic: one thread, fixed text)."""
    import sentencepiece as spm

    text = spm_training_text()
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([line for line in text.splitlines() if line.strip()]),
        model_writer=model,
        model_type="bpe",
        vocab_size=800,
        byte_fallback=True,
        character_coverage=0.995,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        allow_whitespace_only_pieces=True,
        split_digits=True,
        user_defined_symbols=["<sep>"],
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def make_spm(out_dir: Path) -> dict:
    import sentencepiece as spm
    import gguf

    sp = train_spm()

    # llama.cpp convert_hf_to_gguf: text, score and type of every piece (user-defined symbols are
    # added tokens there, USER_DEFINED).
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            t = gguf.TokenType.UNKNOWN
        elif sp.is_control(i):
            t = gguf.TokenType.CONTROL
        elif sp.is_unused(i):
            t = gguf.TokenType.UNUSED
        elif sp.is_byte(i):
            t = gguf.TokenType.BYTE
        elif sp.id_to_piece(i) == "<sep>":
            t = gguf.TokenType.USER_DEFINED
        else:
            t = gguf.TokenType.NORMAL
        types.append(int(t))

    gguf_path = out_dir / "spm_tiny.gguf"
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp) / "spm_tiny.gguf"
        w = gguf.GGUFWriter(str(tmp_path), "llama")
        w.add_name("distillcache spm_tiny tokenizer fixture")
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(sp.bos_id())
        w.add_eos_token_id(sp.eos_id())
        w.add_unk_token_id(sp.unk_id())
        w.add_add_bos_token(True)
        w.add_add_space_prefix(True)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        gguf_path.write_bytes(tmp_path.read_bytes())

    # Read it back with the reference reader: the vocabulary must survive the trip.
    r = gguf.GGUFReader(str(gguf_path))
    assert list(r.fields["tokenizer.ggml.tokens"].contents()) == tokens

    special = {"<s>": sp.bos_id(), "</s>": sp.eos_id(), "<unk>": sp.unk_id(), "<sep>": sp.piece_to_id("<sep>")}

    def llama_cpp_ids(text: str) -> list[int]:
        """llama.cpp's semantics: control/user-defined/unknown token text is matched verbatim, and
        each text fragment between them is encoded as a fresh sentence (with its own ▁ prefix)."""
        out, i, start = [], 0, 0
        while i < len(text):
            hit = max((s for s in special if text.startswith(s, i)), key=len, default=None)
            if hit is None:
                i += 1
                continue
            if start < i:
                out += sp.encode(text[start:i])
            out.append(special[hit])
            i += len(hit)
            start = i
        if start < len(text):
            out += sp.encode(text[start:])
        return out

    cases = [c for c in COMMON_CASES]
    cases += [
        ("special_bos_eos", "<s>Hello</s>"),
        ("special_inline", "one<sep>two <sep> three</s>"),
        ("special_adjacent", "<s><s>x<unk>y"),
        ("special_partial", "<s x </s <se"),
    ]
    cases += [(f"random_{i:03d}", s) for i, s in enumerate(random_strings(60, seed=99))]
    records = []
    n_bytes = 0
    for name, text in cases:
        if name.startswith("special_"):
            ids = llama_cpp_ids(text)
        else:
            assert not any(s in text for s in special), name
            ids = sp.encode(text)
        n_bytes += sum(1 for t in ids if sp.is_byte(t))
        rec = {"name": name, "text": text, "ids": ids}
        # U+2581 is the space marker: it decodes to a space, so such input cannot round-trip.
        if "\u2581" in text:
            rec["round_trip"] = False
        records.append(rec)

    doc = {
        "description": (
            "SentencePiece BPE (byte_fallback, identity normalization, add_dummy_prefix, "
            "remove_extra_whitespaces=false) trained by tools/make_tokenizer_fixtures.py; its "
            "vocabulary is in spm_tiny.gguf (tokenizer.ggml.model 'llama', byte pieces type 6, "
            "'<sep>' user-defined type 4). 'ids' are SentencePieceProcessor.encode(text) except "
            "the 'special_*' cases, which follow llama.cpp: control/user-defined token text is "
            "matched verbatim and each text fragment between such tokens is encoded on its own."),
        "sentencepiece_version": spm.__version__,
        "vocab_size": len(tokens),
        "bos": sp.bos_id(), "eos": sp.eos_id(), "unk": sp.unk_id(),
        "cases": records,
    }
    path = out_dir / "spm_cases.json"
    path.write_text(json.dumps(doc, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    return {"spm_cases": len(records), "spm_vocab": len(tokens), "byte_fallback_ids": n_bytes,
            "file": str(path), "gguf_bytes": gguf_path.stat().st_size}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=default_gguf())
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "tokenizer")
    args = ap.parse_args()
    if not args.gguf.exists():
        sys.exit(f"{args.gguf} not found: run scripts/fetch_model.sh")
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"smollm2": make_smollm2(args.gguf, args.out), "spm": make_spm(args.out)}
    total = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    report["fixture_bytes"] = total
    assert total < 300_000, f"tokenizer fixtures are {total} bytes (limit 300 KB)"
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
