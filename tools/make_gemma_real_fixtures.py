#!/usr/bin/env python3
"""Hugging Face oracle logits for the real Gemma 3 270M Q4_K_M GGUF (tests/cpu/test_gemma_real.cpp).

Loads the GGUF with transformers (gguf_file=: every tensor dequantized to float32 by the gguf
package, Gemma's norms turned back into HF's w of (1 + w)), tokenizes the start of a passage of
real text (Vim's user manual, /usr/share/vim/vim90/doc/usr_02.txt from Debian's vim-runtime) with
the GGUF's own tokenizer, puts <bos> in front as Gemma expects, runs one full forward pass in
fp32 with eager attention and writes, for every position, the top-16 logits (ids and values), the
row's logsumexp and its argmax. Only token ids and numbers are committed (a small JSON file).

    /opt/dcvenv/bin/python tools/make_gemma_real_fixtures.py \
        --gguf ~/.cache/distillcache/gemma-3-270m-q4_k_m.gguf --out tests/fixtures/gemma3/logits.json

CPU only, about two minutes (most of it building the 262k-entry tokenizer); deterministic.
"""
import argparse
import json
import os

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

TEXT_FILE = "/usr/share/vim/vim90/doc/usr_02.txt"
SEQ = 32
TOP = 16


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    folder, name = os.path.split(os.path.abspath(os.path.expanduser(args.gguf)))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    cfg = model.config
    with open(TEXT_FILE, encoding="utf-8") as f:
        text = f.read()
    ids = [tok.bos_token_id] + tok(text[:2000], add_special_tokens=False)["input_ids"][: SEQ - 1]
    assert len(ids) == SEQ, len(ids)
    with torch.no_grad():
        logits = model(torch.tensor([ids]), position_ids=torch.arange(SEQ)[None, :],
                       use_cache=False).logits[0].float()  # [SEQ, vocab]
    top = torch.topk(logits, TOP, dim=-1)
    doc = {
        "gguf": name,
        "text_file": TEXT_FILE,
        "decoded": tok.decode(ids),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "hf_config": {"layer_types": cfg.layer_types, "sliding_window": cfg.sliding_window,
                      "rope_parameters": cfg.rope_parameters,
                      "query_pre_attn_scalar": cfg.query_pre_attn_scalar,
                      "final_logit_softcapping": cfg.final_logit_softcapping,
                      "tie_word_embeddings": cfg.tie_word_embeddings},
        "tokens": ids,
        "top": TOP,
        "top_ids": top.indices.tolist(),
        "top_logits": [[float(v) for v in row] for row in top.values],
        "logsumexp": [float(v) for v in torch.logsumexp(logits, dim=-1)],
        "argmax": logits.argmax(-1).tolist(),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(json.dumps({k: doc[k] for k in ("decoded", "hf_config", "argmax")}, indent=1))
    print("next tokens:", repr(tok.decode(doc["argmax"])))


if __name__ == "__main__":
    main()
