#!/usr/bin/env python3
"""Oracle ids for dc::Tokenizer on Gemma 3's SentencePiece vocabulary (tests/cpu/test_tokenizer_gemma.cpp).

Writes --out (default tests/fixtures/tokenizer/gemma3_cases.json): strings and the token ids
Hugging Face gives for them with the Gemma 3 tokenizer built from the GGUF's own vocabulary
(AutoTokenizer.from_pretrained(dir, gguf_file=...), which works offline; Gemma's tokenizer.json
is not reachable here). The vocabulary itself is not written: the C++ test reads it from the same
GGUF (scripts/fetch_gemma.sh) at test time.

The strings are make_tokenizer_fixtures.py's named cases and random strings (imported, not
copied), Gemma's chat-turn markers, and text with the GGUF's user-defined tokens (runs of spaces,
tabs and newlines, HTML tags).

Usage (CPU only, about a minute, most of it building the 262k-entry tokenizer; deterministic):
  /opt/dcvenv/bin/python tools/make_gemma_tokenizer_fixtures.py \
      [--gguf ~/.cache/distillcache/gemma-3-270m-q4_k_m.gguf] [--out tests/fixtures/tokenizer/gemma3_cases.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tokenizer_fixtures import COMMON_CASES, ROOT, random_strings  # noqa: E402


def default_gguf() -> Path:
    env = os.environ.get("DC_GEMMA3_GGUF")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "distillcache" / "gemma-3-270m-q4_k_m.gguf"


GEMMA_CASES: list[tuple[str, str]] = [
    ("chat_turn", "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n"),
    ("special_in_word", "abc<end_of_turn>def  <start_of_turn>  ghi"),
    ("bos_text", "<bos>text after a literal bos"),
    ("html", "<table><tr><td>cell</td></tr></table> <h1>Title</h1><br>"),
    ("whitespace_tokens", "x" + " " * 31 + "y\t\t\tz\n\n\n\nw"),
    ("code_indent", "def f(x):\n    if x:\n        return 1\n    return 0\n"),
    ("emoji", "emoji 🤗 test 👩‍👩‍👧 🇫🇷"),
    ("unknown_bytes", "\x00\x01\x7f control \x1b[0m"),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", type=Path, default=default_gguf())
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "tokenizer" / "gemma3_cases.json")
    args = ap.parse_args()

    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.gguf.parent), gguf_file=args.gguf.name)
    assert len(tok) == 262144, len(tok)
    cases = list(COMMON_CASES) + GEMMA_CASES
    cases += [(f"random_{i:03d}", s) for i, s in enumerate(random_strings(300, seed=4321))]
    records = []
    for name, text in cases:
        ids = tok.encode(text, add_special_tokens=False)
        with_bos = tok.encode(text, add_special_tokens=True)
        assert with_bos == [tok.bos_token_id] + ids, (name, with_bos[:3])
        rec = {"name": name, "text": text, "ids": ids}
        decoded = tok.decode(ids)
        if decoded != text:
            rec["decoded"] = decoded
        records.append(rec)
    doc = {
        "description": "Token ids of Gemma 3 270M's tokenizer as Hugging Face builds it from the GGUF "
                       "(AutoTokenizer.from_pretrained(dir, gguf_file=...)): 'ids' = "
                       "tokenizer.encode(text, add_special_tokens=False); with add_special_tokens=True "
                       "only <bos> (id 2) is prepended. 'decoded' (only where it differs from text) = "
                       "tokenizer.decode(ids).",
        "transformers_version": transformers.__version__,
        "gguf": args.gguf.name,
        "cases": records,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(json.dumps({"cases": len(records), "decoded_differs": sum("decoded" in r for r in records)}))


if __name__ == "__main__":
    main()
