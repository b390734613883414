#!/usr/bin/env bash
# Installs what tools/train_tiny.py wrote on the GPU machine as models/tiny-trained, writes its
# generation_config.json and README.md (from train_log.json), and prints `lily info` and the
# `lily eval` table of every CPU numeric path (the rows for BENCHMARKS.md "Quality gates").
#
#   tools/install_tiny.sh DIR [LILY_BIN]
#
# DIR: the folder the run's $OUT came back to (holding model/ or the files themselves).
# LILY_BIN defaults to build/lily. Nothing is committed here; `git add models/tiny-trained` after.
set -euo pipefail
src=${1:?usage: install_tiny.sh DIR [LILY_BIN]}
root=$(cd "$(dirname "$0")/.." && pwd)
lily=${2:-$root/build/lily}
[ -f "$src/model/model.safetensors" ] && src=$src/model
dst=$root/models/tiny-trained
mkdir -p "$dst"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json eval_text.txt ref.bin \
         train_log.json; do
    [ -f "$src/$f" ] || { echo "install_tiny: $src/$f is missing" >&2; exit 1; }
    cp "$src/$f" "$dst/$f"
done
python3 - "$dst" <<'PY'
import json, sys, os
d = sys.argv[1]
cfg = json.load(open(f"{d}/config.json"))
log = json.load(open(f"{d}/train_log.json"))
tc = cfg["text_config"]
eos = cfg["eos_token_id"]
json.dump({"eos_token_id": eos, "pad_token_id": eos[-1]}, open(f"{d}/generation_config.json", "w"),
          indent=2)
p, tr, co = log["params"], log["train"], log["corpus"]
n_attn = sum(t == "full_attention" for t in tc["layer_types"])
size = os.path.getsize(f"{d}/model.safetensors")
pk = "\n".join(f"  - {l}" for l in co.get("packages", [])) or "  (see tools/make_corpus.sh)"
samples = "\n\n".join("    " + s.replace("\n", "\n    ") for s in log.get("samples", []))
readme = f"""# tiny-trained: a small trained `qwen3_5_moe` model

A {p['total'] / 1e6:.1f}M-parameter model of the Qwen3.5/3.6 hybrid MoE architecture
({p['main'] / 1e6:.1f}M in the text model, {p['mtp'] / 1e6:.1f}M in the MTP block), trained from scratch on English
text from Debian packages so that lily's quality gates and demo run on a model that means
something. It knows manual pages, the Python documentation and dictionary definitions, and
little else.

## Shape

- hidden {tc['hidden_size']}, {tc['num_hidden_layers']} layers ({tc['num_hidden_layers'] - n_attn} Gated DeltaNet + {n_attn} gated full attention, every 4th),
  vocabulary {tc['vocab_size']} (byte-level BPE, Qwen's pre-tokenizer pattern and added tokens)
- attention: {tc['num_attention_heads']} query heads, {tc['num_key_value_heads']} KV heads, head dim {tc['head_dim']}, partial RoPE 0.25, theta 1e7
- GDN: {tc['linear_num_key_heads']} key heads x {tc['linear_key_head_dim']}, {tc['linear_num_value_heads']} value heads x {tc['linear_value_head_dim']}, conv 4
- MoE: {tc['num_experts']} experts top-{tc['num_experts_per_tok']} of width {tc['moe_intermediate_size']}, shared expert of width {tc['shared_expert_intermediate_size']}
- MTP: one full-attention MoE layer over [norm(embed(t+1)); norm(h_t)] sharing the lm_head
  (`mtp.*` tensors, same MLX form; top-1 on held-out text for token t+2: {log.get('mtp_top1_heldout')})
- MLX affine 4-bit, group 64 (routers and shared-expert gates 8-bit): model.safetensors, {size} bytes.
  `lily convert --model models/tiny-trained --out DIR` writes the HF bf16 layout.

## How it was made

1. `tools/make_corpus.sh`: {co['train_bytes'] / 1e6:.1f} MB of training text ({co['train_tokens']} tokens) from these
   Debian bookworm packages (man pages rendered with groff, HTML to text, GCIDE entries), plus
   {co['chat_train_tokens']} tokens of chat-formatted question/answer pairs built from man-page NAME lines,
   the Python module index and dictionary definitions; 2 % of the documents are held out:
{pk}
2. `tools/train_tiny.py --seed {log['seed']} --steps {tr['steps']}` on {tr['device']} with torch and
   transformers' own `Qwen3_5MoeForCausalLM`: {tr['steps']} steps of {tr['batch']} x {tr['seq']} tokens ({tr['tokens'] / 1e6:.1f}M
   tokens) in {tr['seconds']:.0f} s, AdamW lr {tr['lr']}, bf16 autocast, experts {log.get('experts_impl')}.
3. Exported to the MLX layout by the same script; the reference below is computed from the
   dequantized file, read back into a fresh transformers model in float32.

## Quality

- held-out perplexity (transformers float32, dequantized 4-bit weights, windows of 1024 tokens,
  {log['heldout_ppl_tokens']} tokens): **{log['heldout_ppl_fp32_dequantised']}**; held-out chat pairs: {log.get('chat_heldout_ppl_fp32_dequantised')}
- `eval_text.txt` + `ref.bin`: a held-out slice of {log['ref']['tokens']} tokens and transformers' float32
  log-probabilities for it (format in tools/cmd_eval.c), used by `lily eval` and
  tests/scripts/eval_gate.sh.

Greedy answers of the float32 reference to chat prompts:

{samples}
"""
open(f"{d}/README.md", "w").write(readme)
PY
"$lily" info --model "$dst"
m=$dst
row() { # label env... -- args
    local label=$1
    shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" "$lily" eval --model "$m" --text "$dst/eval_text.txt" --ref "$dst/ref.bin" \
        --json "$@" | python3 -c '
import json, sys
r = json.load(sys.stdin)
print("| %s | %.4f | %+.3f %% | %.2e | %.2e | %.2f %% |" % (sys.argv[1], r["ppl"],
      r["ppl_delta_pct"], r["mean_kl"], r["max_kl"], r["top1_pct"]))' "$label"
}
echo
echo "| path | PPL | vs transformers | mean KL | max KL | top-1 |"
echo "|---|---|---|---|---|---|"
row "CPU fp32 (--precision exact), prefill" X=1 -- --precision exact
row "CPU default (int16 VNNI), prefill" X=1 --
row "CPU default (int16 VNNI), decode" X=1 -- --mode decode
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$lily" convert --model "$dst" --out "$tmp/hf" >/dev/null
m=$tmp/hf
row "CPU fp32, HF bf16 layout (lily convert)" X=1 -- --precision exact
