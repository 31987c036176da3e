#!/usr/bin/env python3
"""Which of a task prompt's answer tokens each policy's keep-sets hold, layer by layer.

Inputs are what `examples/eval --task ...` writes: `--task-prompts P` (every prompt's token ids
and expected answers) and `--keep-sets K` (every student's kept positions after the prompt's
compression, one row per policy, budget, prompt, layer and KV head). The answer strings (a
needle's value, a variable's name, a frequent word) are found in the prompt's context by
decoding its token ids with the model's own vocabulary (read from the GGUF file, byte-level BPE
as SmolLM2's: 'Ġ' is a space), and every token that overlaps an occurrence counts as an answer
token. The share of those the keep-sets hold (kept answer tokens over answer tokens, summed over
KV heads and prompts) is printed
per policy and layer, for every occurrence together and with --by-occurrence per occurrence rank
(first written, second, ...), which tells a rule that keeps one needle of four from one that keeps them all.

    python3 bench/answer_keep_share.py --model M.gguf --prompts P.csv --keep-sets K.csv [--budget 0.125]

Standard library only (no numpy), so it runs wherever the evaluator does.
"""
import argparse
import bisect
import collections
import csv
import struct
import sys

csv.field_size_limit(sys.maxsize)

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def gguf_tokens(path):
    """tokenizer.ggml.tokens of a GGUF v2/v3 file, as a list of str."""
    with open(path, "rb") as f:
        def read(fmt):
            size = struct.calcsize(fmt)
            data = f.read(size)
            if len(data) != size:
                raise SystemExit(f"{path}: truncated GGUF header")
            return struct.unpack(fmt, data)[0]

        def read_string():
            n = read("<Q")
            return f.read(n).decode("utf-8", errors="replace")

        def read_value(kind):
            if kind == _STRING:
                return read_string()
            if kind == _ARRAY:
                item, count = read("<I"), read("<Q")
                return [read_value(item) for _ in range(count)]
            if kind not in _SCALAR:
                raise SystemExit(f"{path}: unknown GGUF value type {kind}")
            return read(_SCALAR[kind])

        if f.read(4) != b"GGUF":
            raise SystemExit(f"{path}: not a GGUF file")
        version = read("<I")
        if version not in (2, 3):
            raise SystemExit(f"{path}: GGUF version {version} not supported")
        read("<Q")  # tensor count
        for _ in range(read("<Q")):
            key, kind = read_string(), read("<I")
            value = read_value(kind)
            if key == "tokenizer.ggml.tokens":
                return value
    raise SystemExit(f"{path}: no tokenizer.ggml.tokens")


def _byte_level_table():
    """GPT-2's byte-level BPE alphabet: the character that stands for each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


_BYTE_OF_CHAR = _byte_level_table()


def byte_level_text(token):
    """A byte-level BPE token's text: its characters map back to bytes."""
    try:
        return bytes(_BYTE_OF_CHAR[c] for c in token).decode("utf-8", errors="replace")
    except KeyError:  # a special token such as <|im_start|>
        return token


def answer_positions(ids, context_tokens, answers, vocab):
    """For each answer, a list of occurrences (in prompt order), each a list of token positions
    inside the context that overlap it."""
    texts = [byte_level_text(vocab[i]) for i in ids[:context_tokens]]
    starts, text = [], ""
    for t in texts:
        starts.append(len(text))
        text += t
    found = []
    for answer in answers:
        occurrences, at = [], text.find(answer)
        while at >= 0:
            stop = at + len(answer)
            # The tokens overlapping [at, stop): from the one holding character `at` (the last
            # start at or before it) to the last that starts before `stop`.
            first, last = bisect.bisect_right(starts, at) - 1, bisect.bisect_left(starts, stop)
            occurrences.append([p for p in range(first, last) if len(texts[p]) > 0])
            at = text.find(answer, stop)
        found.append(occurrences)
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the GGUF file the prompts were built with")
    ap.add_argument("--prompts", required=True, help="eval --task-prompts output")
    ap.add_argument("--keep-sets", required=True, help="eval --keep-sets output")
    ap.add_argument("--budget", type=float, help="only this budget")
    ap.add_argument("--by-occurrence", action="store_true",
                    help="also a row per occurrence rank (first written, second, ...): for needles, not for fwe/cwe")
    ap.add_argument("--layers", default="", help="layer groups for the columns, e.g. 0-3,4-13,14-17 (default: each)")
    args = ap.parse_args()

    vocab = gguf_tokens(args.model)
    prompts = list(csv.DictReader(open(args.prompts)))
    occurrences = {}  # prompt index -> [(rank, [positions])] of every answer's occurrences
    for index, p in enumerate(prompts):
        ids = [int(x) for x in p["prompt_ids"].split()]
        per_answer = answer_positions(ids, int(p["context_tokens"]), p["answers"].split("|"), vocab)
        flat = [pos for occ in per_answer for pos in occ]
        flat.sort(key=lambda positions: positions[0])
        occurrences[index] = list(enumerate(flat))
    missing = [i for i, occ in occurrences.items() if not occ]
    if missing:
        print(f"# {len(missing)} prompts have no answer in their context (first: {missing[0]})", file=sys.stderr)

    # (policy, budget, layer) -> [kept answer tokens, answer tokens] over heads and prompts,
    # and the same per occurrence rank.
    total = collections.defaultdict(lambda: [0, 0])
    by_rank = collections.defaultdict(lambda: [0, 0])
    layers = set()
    for row in csv.DictReader(open(args.keep_sets)):
        budget = float(row["budget"])
        if args.budget is not None and abs(budget - args.budget) > 1e-9:
            continue
        kept = set(int(x) for x in row["positions"].split())
        layer = int(row["layer"])
        layers.add(layer)
        key = (row["policy"], budget, layer)
        for rank, positions in occurrences.get(int(row["context"]), []):
            hit = sum(p in kept for p in positions)
            total[key][0] += hit
            total[key][1] += len(positions)
            by_rank[key + (rank,)][0] += hit
            by_rank[key + (rank,)][1] += len(positions)

    groups = []
    if args.layers:
        for part in args.layers.split(","):
            lo, _, hi = part.partition("-")
            groups.append((part, range(int(lo), int(hi or lo) + 1)))
    else:
        groups = [(str(l), [l]) for l in sorted(layers)]

    policies = sorted({(k[0], k[1]) for k in total})
    ranks = sorted({k[3] for k in by_rank}) if args.by_occurrence else []
    print("| policy | budget | occurrence | " + " | ".join(name for name, _ in groups) + " |")
    print("|---|---|---|" + "---|" * len(groups))
    for policy, budget in policies:
        for label, table, extra in [("all", total, ())] + [(str(r + 1), by_rank, (r,)) for r in ranks]:
            cells = []
            for _, ls in groups:
                kept = sum(table[(policy, budget, l) + extra][0] for l in ls)
                count = sum(table[(policy, budget, l) + extra][1] for l in ls)
                cells.append(f"{kept / count:.2f}" if count else "-")
            print(f"| {policy} | {budget:g} | {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
