#!/usr/bin/env bash
# Every bad input to the example programs ends in one line on stderr and exit status 1 (unusable
# input) or 2 (malformed command line), never a signal, a hang, an uncaught exception or output
# on stdout. See examples/common/cli.hpp for the contract.
#
#   bad_args.sh GENERATE EVAL FIXTURE_DIR [SMOLLM2_GGUF]
#
# train, infer and derive are found through $DC_TRAIN_BIN, $DC_INFER_BIN and $DC_DERIVE_BIN (their
# cases are skipped, with a note, when those are unset).
#
# The cases run on the tiny fixture models. The few that need a real tokenizer use the SmolLM2
# GGUF: the fourth argument, else $DC_SMOLLM2_GGUF, else the scripts/fetch_model.sh cache; they
# are skipped, with a note, when that file is absent.
#
# Prints a markdown table: case | example | message (as printed) | exit. Exit status 0 when every
# case behaves, 1 otherwise.
set -uo pipefail

if [ $# -lt 3 ]; then
  echo "usage: $0 GENERATE EVAL FIXTURE_DIR [SMOLLM2_GGUF]" >&2
  exit 2
fi
generate=$(realpath "$1")
eval_bin=$(realpath "$2")
fix=$(realpath "$3")
model=${4:-${DC_SMOLLM2_GGUF:-${XDG_CACHE_HOME:-$HOME/.cache}/distillcache/SmolLM2-135M-Instruct.Q4_1.gguf}}
if [ -f "$model" ]; then model=$(realpath "$model"); else model=""; fi
train_bin=${DC_TRAIN_BIN:+$(realpath "$DC_TRAIN_BIN")}
infer_bin=${DC_INFER_BIN:+$(realpath "$DC_INFER_BIN")}
derive_bin=${DC_DERIVE_BIN:+$(realpath "$DC_DERIVE_BIN")}
# A trained MLP policy (32, 32 SiLU: not a linear correction).
policy_file=$(realpath "$(dirname "$0")/../../bench/results/policies/smollm2-v2-32x32-silu.dcpolicy")
linear_file=$(realpath "$(dirname "$0")/../../bench/results/policies/smollm2-v4-linear-search.dcpolicy")
for f in "$generate" "$eval_bin"; do
  [ -x "$f" ] || { echo "bad_args: $f is not an executable" >&2; exit 1; }
done

start=$SECONDS
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The few cases that compute anything are tiny; one thread keeps them quick on a busy machine.
export OMP_NUM_THREADS=1
# No case needs a GPU, and "--device cuda" must fail the same way on a machine that has one.
export CUDA_VISIBLE_DEVICES=

# ---- Bad inputs on disk --------------------------------------------------------------------
# Everything runs in the scratch folder with relative paths, so the messages read the same on
# every machine (the table goes into the README).
cd "$tmp"
cp -r "$fix/tiny_mistral" "$fix/gguf/tiny_llama_tied.gguf" "$fix/gguf/types_f32.gguf" \
  "$fix/tokenizer/spm_tiny.gguf" .
tiny_hf=tiny_mistral
tiny_gguf=tiny_llama_tied.gguf
echo "just some notes" > "notes.txt"
cp "notes.txt" "notes.gguf"
: > "empty.gguf"
head -c 1000 "$tiny_gguf" > "cut_in_metadata.gguf"
head -c 100000 "$tiny_gguf" > "cut_in_tensors.gguf"
mkdir "no_config" && cp "$tiny_hf/model.safetensors" "no_config/"
mkdir "cut_weights" && cp "$tiny_hf/config.json" "cut_weights/" &&
  head -c 2000 "$tiny_hf/model.safetensors" > "cut_weights/model.safetensors"
mkdir "empty_weights" && cp "$tiny_hf/config.json" "empty_weights/" &&
  : > "empty_weights/model.safetensors"
mkdir "bad_json" && echo '{"hidden_size": ' > "bad_json/config.json" &&
  cp "$tiny_hf/model.safetensors" "bad_json/"
mkdir "zero_heads" && cp "$tiny_hf/model.safetensors" "zero_heads/" &&
  sed 's/"num_attention_heads": 4/"num_attention_heads": 0/' "$tiny_hf/config.json" > "zero_heads/config.json"
mkdir "wrong_weights" && cp "$tiny_hf/config.json" "wrong_weights/" &&
  cp "$fix/tiny_llama_tied/model.safetensors" "wrong_weights/"
head -c 40 "notes.txt" > "bad.dcpolicy"
printf 'DCPOLICY\x07\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00{}\x00\x00\x00\x00\x00\x00\x00\x00' > "future.dcpolicy"
mkdir "no_txt" && echo "not text" > "no_txt/data.bin"
mkdir "empty_txt" && : > "empty_txt/a.txt"
mkdir "short_txt" && echo "Hello there." > "short_txt/a.txt"
mkdir "words" && for i in $(seq 200); do printf 'the cat sat on the mat %d. ' "$i"; done > "words/a.txt"
long_prompt=$(for i in $(seq 9000); do printf 'word '; done)
ids_300=$(printf '1,%.0s' $(seq 299))1

# ---- The runner ----------------------------------------------------------------------------
failures=0
ran=0
skipped=()
rows=()

# bad NAME PROGRAM EXPECTED_EXIT KEYWORD -- ARGS...: one bad input.
bad() {
  local name=$1 prog=$2 want=$3 keyword=$4
  shift 5
  local bin=$generate
  [ "$prog" = eval ] && bin=$eval_bin
  [ "$prog" = train ] && bin=$train_bin
  [ "$prog" = infer ] && bin=$infer_bin
  [ "$prog" = derive ] && bin=$derive_bin
  local out=out err=err
  timeout 60 "$bin" "$@" > "$out" 2> "$err" < /dev/null
  local rc=$?
  ran=$((ran + 1))
  local msg problems=()
  msg=$(head -n 1 "$err")
  if [ "$rc" -eq 124 ]; then problems+=("hung (killed after 60 s)")
  elif [ "$rc" -ge 126 ]; then problems+=("exit $rc (signal or exec failure)")
  elif [ "$rc" -ne "$want" ]; then problems+=("exit $rc, expected $want")
  fi
  local lines
  lines=$(wc -l < "$err")
  if [ ! -s "$err" ]; then problems+=("nothing on stderr")
  elif [ "$lines" -ne 1 ] || [ "$(tail -c 1 "$err" | od -An -c | tr -d ' ')" != '\n' ]; then
    problems+=("stderr is not exactly one line")
  fi
  [[ "$msg" == "$prog: error: "?* ]] || problems+=("message does not start with '$prog: error: '")
  [[ "$msg" == *"$keyword"* ]] || problems+=("message lacks '$keyword'")
  if grep -qiE 'terminate called|segmentation|aborted|core dumped|sanitizer|runtime error:' "$err"; then
    problems+=("crash report on stderr")
  fi
  [ -s "$out" ] && problems+=("output on stdout")
  if [ ${#problems[@]} -gt 0 ]; then
    failures=$((failures + 1))
    {
      echo "FAIL: $name: $(IFS=';'; echo "${problems[*]}")"
      echo "  command: $prog $*" | cut -c1-300
      echo "  stderr:"; head -c 2000 "$err" | sed 's/^/    /'; echo
      echo "  stdout:"; head -c 500 "$out" | sed 's/^/    /'; echo
    } >&2
  fi
  rows+=("| $name | $prog | \`${msg//|/\\|}\` | $rc |")
}

# needs_model NAME: false (and noted) when the real model is absent.
needs_model() {
  [ -n "$model" ] && return 0
  skipped+=("'$1': no SmolLM2 GGUF (pass its path, set DC_SMOLLM2_GGUF or run scripts/fetch_model.sh)")
  return 1
}

# good NAME PROGRAM -- ARGS...: a control that must succeed (the harness and fixtures are fine).
good() {
  local name=$1 prog=$2
  shift 3
  local bin=$generate
  [ "$prog" = eval ] && bin=$eval_bin
  timeout 60 "$bin" "$@" > "out" 2> "err" < /dev/null
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    failures=$((failures + 1))
    echo "FAIL: control '$name' exited $rc:" >&2
    head -c 2000 "err" | sed 's/^/    /' >&2
  fi
}

G=(--model "$tiny_hf" --tokens 1,2,3)  # a valid generate command line, to add one bad flag to
E=(--model "$tiny_gguf" --text "empty_txt" --context 16 --continuation 4)  # fails only at the text

# ---- Controls ------------------------------------------------------------------------------
good "generate --help" generate -- --help
good "eval --help" eval -- --help
good "generate, tiny model" generate -- "${G[@]}" --max-new-tokens 2
if needs_model "eval, SmolLM2"; then
  good "eval, SmolLM2" eval -- --model "$model" --text "words" --context 16 --continuation 4 \
    --max-contexts 1 --policy streaming --budget 0.5 --csv "ok.csv" --per-context "per_context.csv"
  if [ "$(wc -l < ok.csv 2> /dev/null)" != 2 ]; then
    failures=$((failures + 1))
    echo "FAIL: control 'eval, SmolLM2' did not write a CSV header and one row" >&2
  fi
  # One context: its row's KL is the whole run's (the same sum over the same steps).
  if [ "$(sed -n 2p per_context.csv 2> /dev/null | cut -d, -f5)" != "$(sed -n 2p ok.csv | cut -d, -f4)" ] ||
     [ "$(wc -l < per_context.csv)" != 2 ]; then
    failures=$((failures + 1))
    echo "FAIL: control 'eval, SmolLM2': --per-context's one row does not give the run's KL" >&2
  fi
fi

# ---- generate: the command line ------------------------------------------------------------
bad "unknown flag"                        generate 2 "--bogus"            -- "${G[@]}" --bogus
bad "misspelt --model, no --model"        generate 2 "--modle"            -- --modle "$tiny_hf" --tokens 1
bad "stray positional argument"           generate 2 "stray"              -- "${G[@]}" stray
bad "--model missing"                     generate 2 "--model is required" -- --tokens 1,2,3
bad "--model without a value"             generate 2 "--model"            -- --model
bad "--model twice"                       generate 2 "--model"            -- "${G[@]}" --model "$tiny_hf"
bad "--prompt and --tokens together"      generate 2 "excludes"           -- "${G[@]}" --prompt hi
bad "no prompt at all"                    generate 1 "give a prompt"      -- --model "$tiny_hf"
bad "--prompt empty"                      generate 1 "give a prompt"      -- --model "$tiny_hf" --prompt ""
bad "--tokens empty"                      generate 1 "give a prompt"      -- --model "$tiny_hf" --tokens ""
bad "--tokens not numbers"                generate 1 "not an integer"     -- --model "$tiny_hf" --tokens abc
bad "--tokens with an empty item"         generate 1 "not an integer"     -- --model "$tiny_hf" --tokens 1,,2
bad "--tokens negative id"                generate 1 "out of range"       -- --model "$tiny_hf" --tokens 1,-1
bad "--tokens id beyond int32"            generate 1 "out of range"       -- --model "$tiny_hf" --tokens 99999999999
bad "--tokens id outside the vocabulary"  generate 1 "vocabulary"         -- --model "$tiny_hf" --tokens 1,256
bad "--max-new-tokens 0"                  generate 2 "--max-new-tokens"   -- "${G[@]}" --max-new-tokens 0
bad "--max-new-tokens negative"           generate 2 "--max-new-tokens"   -- "${G[@]}" --max-new-tokens -5
bad "--max-new-tokens not a number"       generate 2 "not an integer"     -- "${G[@]}" --max-new-tokens abc
bad "--max-new-tokens absurd"             generate 2 "--max-new-tokens"   -- "${G[@]}" --max-new-tokens 99999999999999999999
bad "--max-new-tokens past the context"   generate 1 "context of 256"     -- "${G[@]}" --max-new-tokens 1000
bad "--tokens longer than the context"    generate 1 "context of 256"     -- --model "$tiny_hf" --tokens "$ids_300"
bad "--temperature negative"              generate 2 "--temperature"      -- "${G[@]}" --temperature -1
bad "--temperature NaN"                   generate 2 "finite"             -- "${G[@]}" --temperature nan
bad "--temperature inf"                   generate 2 "finite"             -- "${G[@]}" --temperature inf
bad "--temperature not a number"          generate 2 "not a number"       -- "${G[@]}" --temperature warm
bad "--top-k negative"                    generate 2 "--top-k"            -- "${G[@]}" --top-k -1
bad "--top-k not a number"                generate 2 "not an integer"     -- "${G[@]}" --top-k many
bad "--seed negative"                     generate 2 "--seed"             -- "${G[@]}" --seed -1
bad "--max-chunk 0"                       generate 2 "--max-chunk"        -- "${G[@]}" --max-chunk 0
bad "--device cuda, no GPU"               generate 1 "--device cuda"      -- "${G[@]}" --device cuda
bad "--device bogus"                      generate 2 "--device"           -- "${G[@]}" --device tpu
bad "--dtype bogus"                       generate 2 "--dtype"            -- "${G[@]}" --dtype f64
bad "--dtype q4_1 on cuda"                generate 1 "CPU only"           -- "${G[@]}" --dtype q4_1 --device cuda
bad "--dtype gguf, not a GGUF model"      generate 1 "not a GGUF file"    -- "${G[@]}" --dtype gguf
bad "--kv-dtype bogus"                    generate 2 "--kv-dtype"         -- "${G[@]}" --kv-dtype f16
bad "--policy unknown"                    generate 1 "unknown policy"     -- "${G[@]}" --policy lru
bad "--budget 0"                          generate 1 "budget"             -- "${G[@]}" --policy h2o --budget 0
bad "--budget negative"                   generate 1 "budget"             -- "${G[@]}" --policy h2o --budget -0.5
bad "--budget above 1"                    generate 1 "budget"             -- "${G[@]}" --policy h2o --budget 1.5
bad "--budget NaN"                        generate 1 "budget"             -- "${G[@]}" --policy h2o --budget nan
bad "--budget not a number"               generate 2 "--budget"           -- "${G[@]}" --policy h2o --budget half
bad "--granularity unknown"               generate 2 "--granularity"      -- "${G[@]}" --policy h2o --budget 0.5 --granularity token
bad "--policy file missing"               generate 1 "none.dcpolicy"      -- "${G[@]}" --policy distillcache=none.dcpolicy --budget 0.5
bad "--policy file not a policy"          generate 1 "not a distillcache policy" -- "${G[@]}" --policy distillcache=notes.txt --budget 0.5
bad "--policy file of a future version"   generate 1 "version"            -- "${G[@]}" --policy distillcache=future.dcpolicy --budget 0.5
bad "--policy distillcache= (no path)"    generate 1 "no file given"      -- "${G[@]}" --policy distillcache= --budget 0.5

# ---- generate: the model -------------------------------------------------------------------
bad "model file missing"                  generate 1 "does not exist"     -- --model "none.gguf" --tokens 1
bad "folder without config.json"          generate 1 "no config.json"     -- --model "no_config" --tokens 1
bad "text file as --model"                generate 1 "neither a GGUF file" -- --model "notes.txt" --tokens 1
bad "text file named .gguf"               generate 1 "not a GGUF file"    -- --model "notes.gguf" --tokens 1
bad "empty .gguf"                         generate 1 "too short"          -- --model "empty.gguf" --tokens 1
bad "GGUF cut in the metadata"            generate 1 "left in the file"   -- --model "cut_in_metadata.gguf" --tokens 1
bad "GGUF cut in the tensor data"         generate 1 "truncated"          -- --model "cut_in_tensors.gguf" --tokens 1
bad "GGUF with only a tokenizer"          generate 1 "missing"            -- --model spm_tiny.gguf --tokens 1
bad "GGUF of an unsupported architecture" generate 1 "not supported"      -- --model types_f32.gguf --tokens 1
bad ".safetensors file as --model"        generate 1 "neither a GGUF file" -- --model "$tiny_hf/model.safetensors" --tokens 1
bad "safetensors cut short"               generate 1 "past the end"       -- --model "cut_weights" --tokens 1
bad "safetensors empty"                   generate 1 "model.safetensors"  -- --model "empty_weights" --tokens 1
bad "config.json not JSON"                generate 1 "not valid JSON"     -- --model "bad_json" --tokens 1
bad "config.json with 0 heads"            generate 1 "num_attention_heads" -- --model "zero_heads" --tokens 1
bad "weights of another model"            generate 1 "shape"              -- --model "wrong_weights" --tokens 1
bad "--prompt, model without tokenizer"   generate 1 "needs a tokenizer"  -- --model "$tiny_hf" --prompt hi
bad "--prompt the tokenizer cannot encode" generate 1 "cannot encode"     -- --model "$tiny_gguf" --prompt hi
if needs_model "generate: --prompt longer than the context"; then
  bad "--prompt longer than the context (SmolLM2)" generate 1 "context of 8192" -- --model "$model" --prompt "$long_prompt"
fi

# ---- eval ----------------------------------------------------------------------------------
bad "unknown flag"                        eval 2 "--bogus"               -- "${E[@]}" --bogus
bad "--model missing"                     eval 2 "--model is required"   -- --text "words"
bad "--text missing"                      eval 2 "--text is required"    -- --model "$tiny_gguf"
bad "model file missing"                  eval 1 "does not exist"        -- --model "none.gguf" --text "words"
bad "Hugging Face folder as --model"      eval 1 "is a folder"           -- --model "$tiny_hf" --text "words"
bad "text file as --model"                eval 1 "neither a GGUF file"    -- --model "notes.txt" --text "words"
bad "GGUF cut in the tensor data"         eval 1 "truncated"             -- --model "cut_in_tensors.gguf" --text "words"
bad "--text missing path"                 eval 1 "does not exist"        -- --model "$tiny_gguf" --text none --context 16 --continuation 4
bad "--text folder without .txt files"    eval 1 "no .txt files"         -- --model "$tiny_gguf" --text no_txt --context 16 --continuation 4
bad "--text files shorter than a window"  eval 1 "has 20 tokens"         -- "${E[@]}"
if needs_model "eval: --text shorter than a window (SmolLM2)"; then
  bad "--text shorter than a window (SmolLM2)" eval 1 "has 20 tokens"    -- --model "$model" --text "short_txt" --context 16 --continuation 4
fi
bad "--text the tokenizer cannot encode"  eval 1 "cannot encode"         -- --model "$tiny_gguf" --text "words" --context 16 --continuation 4
bad "--context 0"                         eval 2 "--context"             -- "${E[@]}" --context 0
bad "--context not a number"              eval 2 "not an integer"        -- "${E[@]}" --context lots
bad "--context past the model's"          eval 1 "context of 256"        -- --model "$tiny_gguf" --text empty_txt --context 300
bad "--continuation 0"                    eval 2 "--continuation"        -- "${E[@]}" --continuation 0
bad "--max-contexts 0"                    eval 2 "--max-contexts"        -- "${E[@]}" --max-contexts 0
bad "--mode bogus"                        eval 2 "--mode"                -- "${E[@]}" --mode both
bad "--dtype bogus"                       eval 2 "--dtype"               -- "${E[@]}" --dtype f64
bad "--chunk 0"                           eval 2 "--chunk"               -- "${E[@]}" --chunk 0
bad "--policy oracle in decode mode"      eval 1 "runs only on --text in --mode prefill" -- "${E[@]}" --policy oracle --mode decode
bad "--policy oracle twice"              eval 1 "given twice"           -- "${E[@]}" --policy oracle,oracle --mode prefill
bad "--sink negative"                     eval 2 "--sink"                -- "${E[@]}" --sink -1
bad "--recent negative"                   eval 2 "--recent"              -- "${E[@]}" --recent -1
bad "--sink + --recent above the budget"  eval 1 "exceed the budget"     -- "${E[@]}" --budget 0.5 --sink 4 --recent 5
bad "--budget 0"                          eval 1 "budget"                -- "${E[@]}" --budget 0
bad "--budget negative"                   eval 1 "budget"                -- "${E[@]}" --budget 0.25,-1
bad "--budget above 1"                    eval 1 "budget"                -- "${E[@]}" --budget 2
bad "--budget NaN"                        eval 1 "budget"                -- "${E[@]}" --budget nan
bad "--budget not a number"               eval 2 "--budget"              -- "${E[@]}" --budget 0.5,half
bad "--budget empty list"                 eval 1 "no budget"             -- "${E[@]}" --budget ,
bad "--policy unknown"                    eval 1 "unknown policy"        -- "${E[@]}" --policy streaming,lru
bad "--policy empty list"                 eval 1 "no policy"             -- "${E[@]}" --policy ,
bad "--policy file truncated"             eval 1 "bad.dcpolicy"          -- "${E[@]}" --policy distillcache=bad.dcpolicy
bad "--granularity unknown"               eval 1 "unknown granularity"   -- "${E[@]}" --granularity shared,token
bad "--granularity empty list"            eval 1 "--granularity"         -- "${E[@]}" --granularity ,
bad "--seed negative"                     eval 2 "--seed"                -- "${E[@]}" --seed -1
bad "--csv in a missing folder"           eval 1 "--csv"                 -- "${E[@]}" --csv /nonexistent/x.csv
bad "--csv is a folder"                   eval 1 "--csv"                 -- "${E[@]}" --csv tiny_mistral
# eval --task (RULER-style tasks, eval/task_suite.hpp)
K=(--model "$tiny_gguf" --task niah_single_1)
bad "--task unknown"                      eval 1 "unknown task"          -- --model "$tiny_gguf" --task niah_single_9
bad "--task empty list"                   eval 1 "no task"               -- --model "$tiny_gguf" --task ,
bad "--samples 0"                         eval 2 "--samples"             -- "${K[@]}" --samples 0
bad "--lengths not a number"              eval 1 "--lengths"             -- "${K[@]}" --lengths 1k
bad "--lengths past the model's"          eval 1 "context of 256"        -- "${K[@]}" --lengths 1024
bad "--protocol bogus"                    eval 2 "--protocol"            -- "${K[@]}" --protocol both
bad "--chat-template bogus"               eval 2 "--chat-template"       -- "${K[@]}" --chat-template jinja
bad "--task, model without chat template" eval 1 "chat_template"         -- "${K[@]}" --lengths 200
bad "--task-prompts in a missing folder"  eval 1 "--task-prompts"        -- "${K[@]}" --task-prompts /nonexistent/p.csv
bad "--answers in a missing folder"       eval 1 "--answers"             -- "${K[@]}" --answers /nonexistent/a.csv
bad "--answers without --task"            eval 1 "need --task"           -- "${E[@]}" --answers a.csv
bad "--per-context with --task"           eval 1 "--per-context writes"  -- "${K[@]}" --per-context c.csv
bad "--per-context in a missing folder"   eval 1 "--per-context"         -- "${E[@]}" --per-context /nonexistent/c.csv
if needs_model "eval --task: SmolLM2 cases"; then
  bad "--lengths too short for the task (SmolLM2)" eval 1 "too short for task" -- --model "$model" --task niah_single_1 --lengths 200
  bad "--words missing (SmolLM2)"         eval 1 "cannot be read"        -- --model "$model" --task niah_single_1 --words none.txt
  bad "--haystack missing (SmolLM2)"      eval 1 "does not exist"        -- --model "$model" --task niah_single_2 --haystack none
fi

# ---- train and infer -----------------------------------------------------------------------
T=(--model "$tiny_gguf" --out "run")
if [ -n "$train_bin" ]; then
  bad "train: --out missing"              train 2 "--out is required"    -- --model "$tiny_gguf"
  bad "train: --rollouts 1"               train 2 "--rollouts"           -- "${T[@]}" --rollouts 1
  bad "train: --budget 1"                 train 1 "must be in (0, 1)"    -- "${T[@]}" --budget 1
  bad "train: --budget not a number"      train 2 "not a number"         -- "${T[@]}" --budget 0.5,x
  bad "train: --hidden 0"                 train 1 "--hidden"             -- "${T[@]}" --hidden 32,0
  bad "train: --inputs unknown"           train 1 "unknown policy input" -- "${T[@]}" --inputs alpha,colour
  bad "train: --warmup past --updates"    train 1 "warm-up"              -- "${T[@]}" --updates 5 --warmup 10
  bad "train: --init-target unknown input" train 1 "unknown policy input 'colour'" -- "${T[@]}" --init-target h2o,max:colour=1
  bad "train: --init-target no number"    train 1 "no finite number"     -- "${T[@]}" --init-target alpha=x
  bad "train: --resume missing file"      train 1 "none.dcpolicy"        -- "${T[@]}" --resume none.dcpolicy
  bad "train: --resume corrupt file"      train 1 "bad.dcpolicy"         -- "${T[@]}" --resume bad.dcpolicy
  bad "train: --text too short"           train 1 "windows"              -- "${T[@]}" --text empty_txt --context 16 --continuation 4 --warmup 0
  bad "train: --lr NaN"                   train 2 "--lr"                 -- "${T[@]}" --lr nan
  bad "train: --task-solved-only alone"   train 1 "needs --tasks"        -- "${T[@]}" --task-solved-only
  bad "train: recent plus reserve >= 1"  train 1 "their sum must be below 1" -- "${T[@]}" --recent-fraction 0.5 --newest-query-reserve 0.5
  bad "train: reserve schedule out of order" train 1 "must increase" -- "${T[@]}" --newest-query-reserve 0.5:0.1,0.25:0.2
  bad "train: newest-query layers backwards" train 1 "ends before it begins" -- "${T[@]}" --newest-query-layers 20-18
  bad "train: newest-query layer past the model" train 1 "the model has" -- "${T[@]}" --newest-query-layers 1,40
  bad "train: newest-query threshold, no layers" train 1 "needs --newest-query-layers" -- "${T[@]}" --newest-query-layers-up-to 0.375
  bad "train: pins without guide layers" train 1 "needs --newest-query-pin-layers" -- "${T[@]}" --newest-query-pins 0.1
  bad "train: pin guide layer past the model" train 1 "the model has" -- "${T[@]}" --newest-query-pins 0.1 --newest-query-pin-layers 1,40
  bad "train: recent plus pins >= 1"  train 1 "their sum must be below 1" -- "${T[@]}" --recent-fraction 0.5 --newest-query-pins 0.5 --newest-query-pin-layers 1
  bad "train: reserve layers without a reserve" train 1 "needs --newest-query-reserve" -- "${T[@]}" --newest-query-reserve-layers 1
  bad "train: reserve elsewhere, no reserve layers" train 1 "needs --newest-query-reserve-layers" -- "${T[@]}" --newest-query-reserve 0.25 --newest-query-reserve-elsewhere 0.5:0.25
  bad "train: layer weights without search" train 1 "needs --search-rounds" -- "${T[@]}" --layer-budget-weights 1=2
  S=("${T[@]}" --search-rounds 2 --init-target none --activation relu --hidden 2)
  bad "train: layer weights, shared keep-set" train 1 "needs --granularity layer or head" -- "${S[@]}" --layer-budget-weights 1=2 --granularity shared
  bad "train: layer weight past the model" train 1 "layer 40 named; the model has" -- "${S[@]}" --layer-budget-weights 40=2
  bad "train: --search-modes alone"       train 1 "need --search-rounds" -- "${T[@]}" --search-modes prefill,decode
  bad "train: --search-modes unknown"     train 1 "'sideways' is not prefill or decode" -- "${S[@]}" --search-modes prefill,sideways
  bad "train: --search-from an MLP"       train 1 "is not a linear correction" -- "${S[@]}" --search-from "$policy_file"
  bad "train: --search-from other rules"  train 1 "; this run has score base none" -- "${S[@]}" --search-from "$linear_file" --newest-query-layers 1
  bad "train: --search-prune-context alone" train 1 "needs --search-prune" -- "${S[@]}" --search-prune-context 64
  bad "train: --search-balance unknown"   train 1 "unknown policy 'lru'" -- "${S[@]}" --search-balance lru
  bad "train: --search-worst-case alone" train 1 "give --search-balance" -- "${S[@]}" --search-worst-case
  if needs_model "train: --search-prune too many"; then  # checked before the search's work
    bad "train: --search-prune too many (SmolLM2)" train 1 "too few for it" -- --model "$model" --out run \
      --search-rounds 2 --init-target none --activation relu --hidden 2 --text words --context 8 --continuation 2 \
      --search-prune 4000
  fi
else
  skipped+=("train cases (DC_TRAIN_BIN unset)")
fi
if [ -n "$infer_bin" ]; then
  bad "infer: no prompt"                  infer 1 "exactly one of"       -- --model "$tiny_gguf"
  bad "infer: --budget 0"                 infer 2 "--budget"             -- --model "$tiny_gguf" --prompt hi --budget 0
  bad "infer: --policy unknown"           infer 1 "unknown policy"       -- --model "$tiny_gguf" --prompt hi --policy lru
  bad "infer: --policy file missing"      infer 1 "none.dcpolicy"        -- --model "$tiny_gguf" --prompt hi --policy distillcache=none.dcpolicy
  bad "infer: --text missing"             infer 1 "none.txt"             -- --model "$tiny_gguf" --text none.txt --policy h2o
else
  skipped+=("infer cases (DC_INFER_BIN unset)")
fi
if [ -n "$derive_bin" ]; then
  bad "derive: --out missing"             derive 2 "--out is required"   -- --from "$linear_file"
  bad "derive: --from corrupt"            derive 1 "bad.dcpolicy"        -- --from bad.dcpolicy --out x.dcpolicy
  bad "derive: reserve layers, no reserve" derive 1 "needs a newest-query reserve" -- --from "$linear_file" --out x.dcpolicy --newest-query-reserve-layers 18-20
  bad "derive: reserve elsewhere, every layer" derive 1 "a reserve elsewhere needs" -- --from "$linear_file" --out x.dcpolicy --newest-query-reserve 0.25 --newest-query-reserve-elsewhere 0.25
  bad "derive: recent plus reserve >= 1"  derive 1 "their sum must be below 1" -- --from "$linear_file" --out x.dcpolicy --newest-query-reserve 0.5
  bad "derive: --zero-input of an MLP"    derive 1 "must use ReLU"       -- --from "$policy_file" --out x.dcpolicy --zero-input alpha
  bad "derive: --zero-input it lacks"     derive 1 "has no input depth"  -- --from "$linear_file" --out x.dcpolicy --zero-input depth
  bad "derive: --layer-budget-weights x"  derive 1 "'x' is not a number" -- --from "$linear_file" --out x.dcpolicy --layer-budget-weights 1,x
  bad "derive: layer weights, no layer count" derive 1 "needs the model's layer count" -- --from "$linear_file" --out x.dcpolicy --layer-budget-weights 18-20=1.5
  bad "derive: --layer-rules-on-other-models keep" derive 2 "keep not in {map,drop}" -- --from "$linear_file" --out x.dcpolicy --layer-rules-on-other-models keep
  bad "derive: --model-layers alone"      derive 1 "give --layer-budget-weights or a layer list" -- --from "$linear_file" --out x.dcpolicy --model-layers 30
  shipped_file=$(realpath "$(dirname "$0")/../../policies/smollm2-135m-instruct.dcpolicy")  # weights for 30 layers
  bad "derive: a layer past the file's model" derive 1 "layer 40 named in rules for a model of 30 layers" -- --from "$shipped_file" --out x.dcpolicy --newest-query-layers 40
  bad "derive: --model-layers unlike the file's" derive 1 "holds rules for a model of 30 layers" -- --from "$shipped_file" --out x.dcpolicy --model-layers 18 --newest-query-layers 1
  bad "derive: newest-query threshold, no layers" derive 1 "needs newest_query_layers" -- --from "$linear_file" --out x.dcpolicy --newest-query-layers-up-to 0.375
  bad "derive: pins without guide layers" derive 1 "give --newest-query-pin-layers" -- --from "$linear_file" --out x.dcpolicy --newest-query-pins 0.1
  bad "derive: pin guide layers without pins" derive 1 "needs pins" -- --from "$linear_file" --out x.dcpolicy --newest-query-pin-layers 1
  bad "derive: pin schedule out of order" derive 1 "newest-query pins: budget fractions must increase" -- --from "$linear_file" --out x.dcpolicy --newest-query-pins 0.5:0.1,0.25:0.2 --newest-query-pin-layers 1
  bad "derive: pins that fill the budget at 50 %" derive 1 "reach 1 of the budget at budget fraction 0.5" -- --from "$shipped_file" --out x.dcpolicy --newest-query-pins 0.2 --newest-query-pin-layers 20-22
  bad "derive: --out unwritable"          derive 1 "--out"               -- --from "$linear_file" --out no_such_dir/x.dcpolicy --newest-query-layers 1
else
  skipped+=("derive cases (DC_DERIVE_BIN unset)")
fi

# ---- Report --------------------------------------------------------------------------------
echo "| case | example | message (as printed) | exit |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
for s in "${skipped[@]}"; do
  echo "note: skipped $s"
done
echo "bad_args: $ran bad inputs, $failures failures, $((SECONDS - start)) s"
[ "$failures" -eq 0 ]
