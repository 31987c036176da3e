#!/usr/bin/env python3
"""Hugging Face oracle logits for the real SmolLM2-135M-Instruct Q4_1 GGUF.

Loads the GGUF with transformers (gguf_file=, dequantized to float32), tokenizes a 256-token
passage of real text (Vim's user manual, /usr/share/vim/vim90/doc/usr_02.txt from Debian's
vim-runtime), runs one full forward pass and stores, at several positions, the top-64 logits
(ids and values), the row's logsumexp and its argmax. Only token ids and numbers are committed.

    /opt/dcvenv/bin/python tools/make_smollm2_fixtures.py \
        --gguf ~/.cache/distillcache/SmolLM2-135M-Instruct.Q4_1.gguf --out tests/fixtures/smollm2
"""
import argparse
import json
import os

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

TEXT_FILE = "/usr/share/vim/vim90/doc/usr_02.txt"
SEQ = 256
POSITIONS = [0, 1, 2, 7, 31, 64, 127, 128, 200, 255]
TOP = 64


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    folder, name = os.path.split(os.path.abspath(os.path.expanduser(args.gguf)))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    with open(TEXT_FILE, encoding="utf-8") as f:
        text = f.read()
    ids = tok(text[:4000], add_special_tokens=False)["input_ids"][:SEQ]
    assert len(ids) == SEQ, len(ids)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()  # [SEQ, vocab]
    top = torch.topk(logits[POSITIONS], TOP, dim=-1)
    tensors = {
        "tokens": np.array(ids, dtype=np.int32),
        "positions": np.array(POSITIONS, dtype=np.int32),
        "top_ids": top.indices.numpy().astype(np.int32),
        "top_logits": top.values.numpy().astype(np.float32),
        "logsumexp": torch.logsumexp(logits[POSITIONS], dim=-1).numpy().astype(np.float32),
        "argmax": logits[POSITIONS].argmax(-1).numpy().astype(np.int32),
    }
    os.makedirs(args.out, exist_ok=True)
    save_file(tensors, os.path.join(args.out, "logits.safetensors"))
    meta = {
        "text_file": TEXT_FILE,
        "seq_len": SEQ,
        "positions": POSITIONS,
        "top": TOP,
        "decoded_passage_start": tok.decode(ids[:40]),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "gguf": name,
    }
    with open(os.path.join(args.out, "logits.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main()
