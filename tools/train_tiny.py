#!/usr/bin/env python3
"""Trains models/tiny-trained: a small qwen3_5_moe text model (Gated DeltaNet + gated attention,
routed MoE + shared expert, an MTP head) with transformers' own classes, on the Debian corpus of
tools/make_corpus.sh, and exports it in the MLX 4-bit layout lily loads, with a transformers
float32 reference for `lily eval`.

Runs on the GPU machine (torch + transformers + tokenizers):
  train_tiny.py --corpus DIR --out DIR [--seed 1234] [--minutes 7] [--steps N] [--smoke]
                [--hf-reference tools/hf_reference.py] [--template qwen3_5_chat_template.jinja]

--corpus holds train.txt, heldout.txt, chat_train.txt, chat_heldout.txt (documents separated by a
line "<|endoftext|>"). Steps:
 1. a byte-level BPE vocabulary (8192 ids including Qwen's 26 added tokens) with HF tokenizers,
    Qwen's NFC normalizer and pre-tokenizer pattern, the official Qwen3.5 chat template;
 2. Qwen3_5MoeForCausalLM from transformers (config below) plus an MTP block defined here
    (Qwen3-Next style: fc over [norm(embed(t+1)); norm(h_t)], one full-attention decoder layer
    with MoE, a norm, the shared lm_head; trained on token t+2 with weight 0.3);
    AdamW, bf16 autocast, 512-token windows, 20 % of the rows from the chat pairs;
    the step count is --steps, or (when absent) what fits --minutes after timing steps 10-30;
    it is written to the log so `--steps N --seed S` repeats a run;
 3. MLX affine quantisation (group 64; 4-bit, routers and shared-expert gates 8-bit), norms
    shifted to 1+w, conv1d [C,K,1], experts as switch_mlp stacks (model.md 7.2); MTP tensors kept
    under mtp.* in the same form;
 4. from the *dequantised* file, read back by tools/hf_reference.py's loader into a fresh
    transformers model in float32 (eager attention and experts, torch GDN, TF32 off): held-out
    perplexity, and the reference for a held-out slice (eval_text.txt + ref.bin, format below).

The GPU run, from a checkout whose git-ignored .devcarry_train/ holds this script,
tools/hf_reference.py, /work/shared/data/qwen3_5_chat_template.jinja and the corpus.tar.xz of
tools/make_corpus.sh (device `run` with carry [".devcarry_train"], timeout 600 s; about 8-9 min):
  set -o pipefail; cd .devcarry_train && tar xJf corpus.tar.xz && python3 train_tiny.py \
    --corpus out --out $OUT --minutes 5 --ppl-tokens 131072 \
    --template qwen3_5_chat_template.jinja --hf-reference hf_reference.py 2>&1 |
    tee $OUT/run.log | grep -v -i warn | cut -c1-400; rc=$?
  rm -f $OUT/model/generation_config.json; exit $rc
(generation_config.json is dropped to stay within 8 returned files; tools/install_tiny.sh writes
it again.) Then, here: tools/install_tiny.sh FILES_AT && git add models/tiny-trained.

Outputs in --out: model/ (config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, eval_text.txt, ref.bin, train_log.json), packed as model.tar plus the
separate large files for the transfer limit (see --pack).

ref.bin (little-endian): "LILYREF1" | u32 n | u32 vocab | u32 0 | u32 0 | i32 ids[n] |
  i32 argmax[n] (fp32 argmax of each row) | f32 nll[n] (-log p(ids[i+1]) after row i; 0 for the
  last row) | f16 logprob[n][vocab] (log_softmax of the fp32 logits, rounded to fp16).
"""
import argparse
import json
import math
import os
import struct
import sys
import time

VOCAB = 8192
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen's added tokens, in Qwen's order (content, special)
ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
         ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
         ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
         ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
         ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
         ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
         ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
         ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
         ("<think>", False), ("</think>", False)]
DOC_SEP = "\n<|endoftext|>\n"

SHAPE = dict(hidden_size=384, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
             head_dim=128, linear_num_key_heads=2, linear_num_value_heads=4,
             linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
             num_experts=16, num_experts_per_tok=4, moe_intermediate_size=64,
             shared_expert_intermediate_size=128)


def log(*a):
    print(*a, flush=True)


def read_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in f.read().split(DOC_SEP) if d.strip()]


# ---- 1. tokenizer ------------------------------------------------------------------------------

def train_tokenizer(texts):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(dropout=None, unk_token=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tr = trainers.BpeTrainer(vocab_size=VOCAB - len(ADDED), min_frequency=2, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             special_tokens=[])
    tok.train_from_iterator(texts, trainer=tr)
    if tok.get_vocab_size() != VOCAB - len(ADDED):
        raise SystemExit(f"BPE vocabulary has {tok.get_vocab_size()} ids, expected "
                         f"{VOCAB - len(ADDED)} (corpus too small?)")
    tok.add_tokens([AddedToken(c, special=s, normalized=False, single_word=False, lstrip=False,
                               rstrip=False) for c, s in ADDED])
    # Qwen's tokenizer.json carries the ByteLevel post-processor too
    from tokenizers import processors
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                              use_regex=False)
    return tok


def tokenizer_config(tok, template):
    dec = {}
    for c, s in ADDED:
        dec[str(tok.token_to_id(c))] = {"content": c, "lstrip": False, "normalized": False,
                                        "rstrip": False, "single_word": False, "special": s}
    return {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": dec,
            "additional_special_tokens": [c for c, s in ADDED if s][1:],
            "bos_token": None, "chat_template": template, "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 4096,
            "pad_token": "<|endoftext|>", "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}


def encode_docs(tok, docs, eos):
    out = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        out.extend(enc.ids)
        out.append(eos)
    return out


# ---- 2. model ----------------------------------------------------------------------------------

def text_config(eos_ids, vocab):
    rot = int(SHAPE["head_dim"] * 0.25)
    half = rot // 2
    sec = [half // 3 + (half % 3 > 0), half // 3 + (half % 3 > 1), half // 3]
    L = SHAPE["num_hidden_layers"]
    tc = dict(SHAPE)
    tc.update(model_type="qwen3_5_moe_text", vocab_size=vocab, hidden_act="silu",
              max_position_embeddings=4096, initializer_range=0.02, rms_norm_eps=1e-6,
              tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0,
              attn_output_gate=True,
              layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                           for i in range(L)],
              full_attention_interval=4,
              rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                               "partial_rotary_factor": 0.25, "mrope_section": sec,
                               "mrope_interleaved": True},
              partial_rotary_factor=0.25, router_aux_loss_coef=0.001,
              mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
              mamba_ssm_dtype="float32", use_cache=True, dtype="bfloat16",
              eos_token_id=eos_ids[0], pad_token_id=eos_ids[1], bos_token_id=None)
    return tc


def make_mtp_class(torch, modeling):
    nn = torch.nn

    class MTP(nn.Module):
        """Qwen3-Next style multi-token prediction block (names as the official checkpoints:
        mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.fc, mtp.layers.0.*, mtp.norm)."""

        def __init__(self, cfg1):
            super().__init__()
            H, eps = cfg1.hidden_size, cfg1.rms_norm_eps
            self.pre_fc_norm_embedding = modeling.Qwen3_5MoeRMSNorm(H, eps=eps)
            self.pre_fc_norm_hidden = modeling.Qwen3_5MoeRMSNorm(H, eps=eps)
            self.fc = nn.Linear(2 * H, H, bias=False)
            self.layers = nn.ModuleList([modeling.Qwen3_5MoeDecoderLayer(cfg1, 0)])
            self.norm = modeling.Qwen3_5MoeRMSNorm(H, eps=eps)

        def forward(self, emb_next, hidden, pos_emb):
            """emb_next: embeddings of tokens t+1; hidden: final-normed h_t; returns the normed
            state whose lm_head gives the logits of token t+2."""
            u = self.fc(torch.cat([self.pre_fc_norm_embedding(emb_next),
                                   self.pre_fc_norm_hidden(hidden)], dim=-1))
            T = u.shape[1]
            causal = torch.ones(T, T, dtype=torch.bool, device=u.device).tril()[None, None]
            u = self.layers[0](u, position_embeddings=pos_emb, attention_mask=causal)
            if isinstance(u, tuple):
                u = u[0]
            return self.norm(u)

    return MTP


def set_impl(model, attn, experts):
    ok = True
    for setter, val in (("set_attn_implementation", attn), ("set_experts_implementation",
                                                              experts)):
        fn = getattr(model, setter, None)
        if fn is not None:
            try:
                fn(val)
            except Exception as e:  # noqa: BLE001
                log(f"note: model.{setter}({val!r}) failed: {e!r}")
                ok = False
    for attr, val in (("_attn_implementation", attn), ("_experts_implementation", experts)):
        try:
            setattr(model.config, attr, val)
        except Exception:  # noqa: BLE001
            pass
    return ok


# ---- 3. MLX export -----------------------------------------------------------------------------

ZC_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight",
            "k_norm.weight")


def mlx_quantize(torch, w, bits, group=64):
    """MLX affine quantisation of w [..., out, in] (float32): returns (uint32 words as int64
    numpy-ready tensor, bf16 scales, bf16 biases). The larger-magnitude extreme of each group is
    the bias (exact), scale = -+(max-min)/(2^bits-1); q = clamp(rint((w-bias)/scale))."""
    shp = w.shape
    g = w.reshape(*shp[:-1], shp[-1] // group, group).float()
    wmax, wmin = g.amax(-1, keepdim=True), g.amin(-1, keepdim=True)
    nb = (1 << bits) - 1
    delta = ((wmax - wmin) / nb).clamp_min(1e-7)
    use_min = wmin.abs() > wmax.abs()
    scale = torch.where(use_min, delta, -delta).to(torch.bfloat16).float()
    bias = torch.where(use_min, wmin, wmax).to(torch.bfloat16).float()
    q = torch.clamp(torch.round((g - bias) / scale), 0, nb).to(torch.int64)
    per = 32 // bits
    q = q.reshape(*shp[:-1], shp[-1] // per, per)
    shifts = (torch.arange(per, dtype=torch.int64, device=q.device) * bits)
    words = (q << shifts).sum(-1)  # < 2^32, fits int64
    return (words, scale.squeeze(-1).to(torch.bfloat16), bias.squeeze(-1).to(torch.bfloat16))


def hf_canonical(torch, model, mtp):
    """{HF name: fp32 tensor} of the trained text model (model.*, lm_head.weight) and mtp.*."""
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    out = {}
    for k, v in sd.items():
        out[k] = v
    for k, v in (mtp.state_dict().items() if mtp is not None else []):
        out["mtp." + k] = v.detach().float().cpu()
    return out


def to_mlx(torch, hf, n_layers):
    """HF canonical -> (MLX tensors {name: tensor}, quantization table)."""
    out, qtab = {}, {"group_size": 64, "bits": 4, "mode": "affine"}

    def mlx_name(k):
        if k.startswith("model."):
            return "language_model.model." + k[len("model."):]
        if k.startswith("lm_head."):
            return "language_model." + k
        return k  # mtp.*

    def put_q(name, w, bits):
        words, s, b = mlx_quantize(torch, w, bits)
        out[name + ".weight"] = ("U32", words)
        out[name + ".scales"] = ("BF16", s)
        out[name + ".biases"] = ("BF16", b)
        if bits != 4:
            qtab[name] = {"group_size": 64, "bits": bits}

    for k in sorted(hf):
        v = hf[k]
        n = mlx_name(k)
        if k.endswith("mlp.experts.gate_up_proj"):
            i = v.shape[1] // 2
            base = n[:-len("experts.gate_up_proj")] + "switch_mlp."
            put_q(base + "gate_proj", v[:, :i].contiguous(), 4)
            put_q(base + "up_proj", v[:, i:].contiguous(), 4)
        elif k.endswith("mlp.experts.down_proj"):
            put_q(n[:-len("experts.down_proj")] + "switch_mlp.down_proj", v, 4)
        elif k.endswith("linear_attn.conv1d.weight"):
            out[n] = ("BF16", v.transpose(1, 2).contiguous().to(torch.bfloat16))
        elif k.endswith("A_log"):
            out[n] = ("F32", v.float())
        elif v.dim() == 1:
            shift = k.endswith(ZC_NORMS) or k in ("model.norm.weight", "mtp.norm.weight",
                                                   "mtp.pre_fc_norm_embedding.weight",
                                                   "mtp.pre_fc_norm_hidden.weight")
            out[n] = ("BF16", (1.0 + v if shift else v).to(torch.bfloat16))
        elif v.dim() == 2 and k.endswith(".weight") and v.shape[1] % 64 == 0:
            bits = 8 if (k.endswith("mlp.gate.weight") or k.endswith("shared_expert_gate.weight")) \
                else 4
            put_q(n[:-len(".weight")], v, bits)
        else:
            raise SystemExit(f"export: no rule for {k} {list(v.shape)}")
    return out, qtab


def write_safetensors(torch, path, tensors, meta):
    import numpy as np
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dt, t = tensors[name]
        t = t.detach().cpu().contiguous()
        if dt == "U32":
            raw = t.numpy().astype("<u4").tobytes()
        elif dt == "BF16":
            raw = t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
        elif dt == "F32":
            raw = t.float().numpy().astype("<f4").tobytes()
        else:
            raise SystemExit(f"dtype {dt}")
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def mtp_top1(torch, model, mtp, ho_ids, rot_out, dev, smoke, info):
    with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16):
        n = min(len(ho_ids) - 2, 16 * 1024 if not smoke else 2048)
        ids = ho_ids[:n + 1].view(1, -1).to(dev).long()
        hit, cnt = 0, 0
        for o in range(0, ids.shape[1] - 1, 1024):
            seg = ids[:, o:o + 1025]
            if seg.shape[1] < 3:
                break
            inp = seg[:, :-1]
            h = model.model(input_ids=inp, use_cache=False).last_hidden_state
            cos, sin = rot_out["pe"]
            Tn = inp.shape[1]
            hm = mtp(model.model.embed_tokens(seg[:, 1:Tn]), h[:, :Tn - 1],
                     (cos[:, :Tn - 1], sin[:, :Tn - 1]))
            pred = model.lm_head(hm).argmax(-1)
            hit += (pred == seg[:, 2:Tn + 1]).sum().item()
            cnt += pred.numel()
        info["mtp_top1_heldout"] = round(hit / max(1, cnt), 4)
    log(f"MTP head top-1 on held-out text (predicting token t+2): {info['mtp_top1_heldout']}")


# ---- main --------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--minutes", type=float, default=7.0)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--smoke", action="store_true", help="tiny run of every stage (checks)")
    ap.add_argument("--hf-reference", default=os.path.join(os.path.dirname(__file__),
                                                           "hf_reference.py"))
    ap.add_argument("--template", required=True)
    ap.add_argument("--ref-tokens", type=int, default=512)
    ap.add_argument("--ppl-tokens", type=int, default=262144)
    args = ap.parse_args()
    t_start = time.time()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    sys.path.insert(0, os.path.dirname(os.path.abspath(args.hf_reference)))
    import hf_reference as hfr
    hfr.block_fast_kernels()
    import numpy as np
    import torch
    import transformers
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as modeling
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"device {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'}")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    info = {"seed": args.seed, "smoke": args.smoke}

    # 1. corpus + tokenizer
    c = args.corpus
    train_docs, held_docs = read_docs(f"{c}/train.txt"), read_docs(f"{c}/heldout.txt")
    chat_tr, chat_ho = read_docs(f"{c}/chat_train.txt"), read_docs(f"{c}/chat_heldout.txt")
    if args.smoke:
        train_docs, chat_tr = train_docs[::10], chat_tr[::10]
    t0 = time.time()
    tok = train_tokenizer(train_docs[::4] + chat_tr[::4])  # a quarter of the documents: enough
    eos, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    log(f"tokenizer: {tok.get_vocab_size()} ids, <|endoftext|> {eos}, <|im_end|> {im_end}, "
        f"{time.time() - t0:.1f} s")
    t0 = time.time()
    tr_ids = torch.tensor(encode_docs(tok, train_docs, eos), dtype=torch.int32)
    ch_ids = torch.tensor(encode_docs(tok, chat_tr, eos), dtype=torch.int32)
    ho_ids = torch.tensor(encode_docs(tok, held_docs, eos), dtype=torch.int32)
    cho_ids = torch.tensor(encode_docs(tok, chat_ho, eos), dtype=torch.int32)
    bytes_tr = sum(len(d.encode()) for d in train_docs)
    info["corpus"] = {"train_docs": len(train_docs), "train_tokens": len(tr_ids),
                      "train_bytes": bytes_tr, "chat_train_tokens": len(ch_ids),
                      "heldout_tokens": len(ho_ids), "chat_heldout_tokens": len(cho_ids)}
    for fn in ("packages.txt", "stats.txt", "sha256.txt"):
        if os.path.isfile(f"{c}/{fn}"):
            with open(f"{c}/{fn}") as f:
                info["corpus"][fn.split(".")[0]] = f.read().splitlines()
    log(f"tokens: train {len(tr_ids)} ({bytes_tr / len(tr_ids):.2f} bytes/token), chat "
        f"{len(ch_ids)}, held out {len(ho_ids)} + chat {len(cho_ids)}; {time.time() - t0:.1f} s")

    # 2. model
    tc = text_config([im_end, eos], VOCAB)
    config = hfr.build_config(Qwen3_5MoeTextConfig, hfr.text_config_dict({"text_config": tc}))
    model = modeling.Qwen3_5MoeForCausalLM(config)
    c1 = dict(hfr.text_config_dict({"text_config": tc}), num_hidden_layers=1,
              layer_types=["full_attention"])
    config1 = hfr.build_config(Qwen3_5MoeTextConfig, c1)
    config1._attn_implementation = "sdpa"
    mtp = make_mtp_class(torch, modeling)(config1)
    with torch.no_grad():  # the main model's initialisation, done here by hand
        for name, p in mtp.named_parameters():
            if p.dim() == 1:
                p.zero_()  # all zero-centred (1 + w) norms: the MTP layer is full attention
            elif p.dim() >= 2:
                p.normal_(0.0, 0.02)
            else:
                raise SystemExit(f"mtp parameter {name} {list(p.shape)}: no init rule")
    model.to(dev)
    mtp.to(dev)
    if not set_impl(model, "sdpa", "grouped_mm"):
        set_impl(model, "sdpa", "eager")
    n_main = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    info["params"] = {"main": n_main, "mtp": n_mtp, "total": n_main + n_mtp}
    log(f"parameters: main {n_main}, mtp {n_mtp}, total {n_main + n_mtp}")

    rot_out = {}
    model.model.rotary_emb.register_forward_hook(lambda m, a, o: rot_out.__setitem__("pe", o))
    router_out = []

    def rhook(m, a, o):
        router_out.append(o)
    gates = [l.mlp.gate for l in model.model.layers] + [mtp.layers[0].mlp.gate]
    for g in gates:
        g.register_forward_hook(rhook)
    E, K = SHAPE["num_experts"], SHAPE["num_experts_per_tok"]
    use_mtp = [True]

    def losses(ids):
        router_out.clear()
        inp = ids[:, :-1]
        h = model.model(input_ids=inp, use_cache=False).last_hidden_state
        logits = model.lm_head(h)
        ce = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB),
                                               ids[:, 1:].reshape(-1).long())
        ce2 = torch.zeros((), device=ce.device)
        # MTP: position t sees embed(x_{t+1}) and h_t, predicts x_{t+2}
        T = inp.shape[1]
        if use_mtp[0]:
            cos, sin = rot_out["pe"]
            emb_next = model.model.embed_tokens(ids[:, 1:T])
            hm = mtp(emb_next, h[:, :T - 1], (cos[:, :T - 1], sin[:, :T - 1]))
            ce2 = torch.nn.functional.cross_entropy(
                model.lm_head(hm).float().reshape(-1, VOCAB), ids[:, 2:T + 1].reshape(-1).long())
        aux = 0.0
        for o in router_out:
            if isinstance(o, tuple) and len(o) >= 3:
                rl, idx = o[0].float(), o[2]
            else:
                rl = (o[0] if isinstance(o, tuple) else o).float()
                idx = rl.topk(K, dim=-1).indices
            P = torch.softmax(rl, -1).mean(0)
            f = torch.zeros(E, device=rl.device).scatter_add_(
                0, idx.reshape(-1), torch.ones(idx.numel(), device=rl.device)) / idx.numel()
            aux = aux + E * (f * P).sum()
        aux = aux / len(router_out)
        return ce, ce2, aux

    gen = torch.Generator().manual_seed(args.seed)
    T = args.seq

    def batch(bs):
        rows = []
        kind = torch.rand(bs, generator=gen) < 0.2
        for i in range(bs):
            src = ch_ids if kind[i] else tr_ids
            o = int(torch.randint(0, len(src) - T - 2, (1,), generator=gen))
            rows.append(src[o:o + T + 1])
        return torch.stack(rows).to(dev, non_blocking=True).long()

    decay, no_decay = [], []
    for mod in (model, mtp):
        for n, p in mod.named_parameters():
            (decay if p.dim() >= 2 and "embed" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr,
                            betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if dev == "cuda" else {}))
    warm = 20 if args.smoke else 100
    total = args.steps or (30 if args.smoke else 0)

    def lr_at(s, total):
        if s < warm:
            return args.lr * (s + 1) / warm
        p = min(1.0, (s - warm) / max(1, total - warm))
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    # experts implementation: grouped_mm when it runs, else eager
    model.train()
    mtp.train()
    def probe():
        with torch.autocast(dev, dtype=torch.bfloat16):
            a, b, cc = losses(batch(2))
        (a + b + 0.01 * cc).backward()
        opt.zero_grad(set_to_none=True)

    for impl in ("grouped_mm", "eager", "eager-no-mtp"):
        if impl == "eager-no-mtp":
            use_mtp[0] = False
        if not set_impl(model, "sdpa", impl.split("-")[0]) and impl == "grouped_mm":
            continue  # this transformers has no grouped_mm experts
        try:
            probe()
            info["experts_impl"] = impl
            break
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            log(f"training step with experts {impl} failed ({e!r})")
            opt.zero_grad(set_to_none=True)
            if impl == "eager-no-mtp":
                raise
    info["mtp_trained"] = use_mtp[0]
    log(f"experts implementation: {info['experts_impl']}")
    # restart the batch stream so that the run does not depend on the probe
    gen.manual_seed(args.seed)

    budget = args.minutes * 60.0
    t_train = time.time()
    step, t_mark, hist = 0, None, []
    while True:
        if total and step >= total:
            break
        if step == 10:
            torch.cuda.synchronize() if dev == "cuda" else None
            t_mark = time.time()
        if step == 30 and not total:
            torch.cuda.synchronize() if dev == "cuda" else None
            per = (time.time() - t_mark) / 20
            total = max(warm + 20, int((budget - (time.time() - t_train)) / per) + 30)
            log(f"{per * 1000:.1f} ms/step ({args.batch * T / per / 1e3:.0f}K tok/s): "
                f"{total} steps fit {args.minutes} min")
        lr = lr_at(step, total or 10 ** 9)
        for gopt in opt.param_groups:
            gopt["lr"] = lr
        ids = batch(args.batch)
        with torch.autocast(dev, dtype=torch.bfloat16):
            ce, ce2, aux = losses(ids)
            loss = ce + 0.3 * ce2 + 0.01 * aux
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(list(model.parameters()) + list(mtp.parameters()),
                                            1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == (total or 0) - 1:
            hist.append([step, round(ce.item(), 4), round(ce2.item(), 4), round(float(aux), 4)])
            log(f"step {step}/{total} lr {lr:.2e} ce {ce.item():.3f} mtp {ce2.item():.3f} "
                f"aux {float(aux):.3f} |g| {gn.item():.2f} {time.time() - t_train:.0f} s")
        step += 1
    train_s = time.time() - t_train
    info["train"] = {"steps": step, "batch": args.batch, "seq": T, "lr": args.lr,
                     "seconds": round(train_s, 1), "tokens": step * args.batch * T,
                     "loss_history": hist,
                     "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"}
    log(f"trained {step} steps in {train_s:.0f} s")

    # MTP acceptance on held-out text (bf16 autocast, trained weights)
    model.eval()
    mtp.eval()
    try:
        if not use_mtp[0]:
            raise RuntimeError("the MTP block could not be trained")
        mtp_top1(torch, model, mtp, ho_ids, rot_out, dev, args.smoke, info)
    except Exception as e:  # noqa: BLE001 - a diagnostic; the export must still happen
        log(f"MTP acceptance failed: {e!r}")
        info["mtp_top1_heldout"] = None

    # 3. export
    md = os.path.join(args.out, "model")
    os.makedirs(md, exist_ok=True)
    hf = hf_canonical(torch, model, mtp if use_mtp[0] else None)
    tensors, qtab = to_mlx(torch, hf, SHAPE["num_hidden_layers"])
    cfg = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
           "tie_word_embeddings": False, "eos_token_id": [im_end, eos], "dtype": "bfloat16",
           "text_config": tc, "quantization": qtab, "quantization_config": qtab}
    with open(os.path.join(md, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(md, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [im_end, eos], "pad_token_id": eos}, f, indent=2)
    write_safetensors(torch, os.path.join(md, "model.safetensors"), tensors, {"format": "mlx"})
    tok.save(os.path.join(md, "tokenizer.json"))
    with open(args.template, encoding="utf-8") as f:
        template = f.read()
    with open(os.path.join(md, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(tok, template), f, indent=2, ensure_ascii=False)
    log(f"exported: model.safetensors {os.path.getsize(os.path.join(md, 'model.safetensors'))} "
        f"bytes")

    # 4. reference from the dequantised file, float32
    torch.cuda.empty_cache() if dev == "cuda" else None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    with open(os.path.join(md, "config.json")) as f:
        cfg2 = json.load(f)
    ckpt, layout, notes = hfr.load_checkpoint(torch, md, cfg2)
    for nn_ in notes:
        log("  " + nn_)
    rconf = hfr.build_config(Qwen3_5MoeTextConfig, hfr.text_config_dict(cfg2))
    ref = modeling.Qwen3_5MoeForCausalLM(rconf)
    set_impl(ref, "eager", "eager")
    state = hfr.to_model_state(torch, ckpt, ref.state_dict(), False)
    ref.load_state_dict(state, strict=True)
    ref = ref.to(dev, torch.float32).eval()
    nll_sum, nll_n = 0.0, 0
    n = min(len(ho_ids) - 1, args.ppl_tokens if not args.smoke else 4096)
    W = 1024
    with torch.no_grad():
        for o in range(0, n - 1, W * 8):
            rows = []
            for r in range(8):
                s = o + r * W
                if s + W + 1 <= n + 1:
                    rows.append(ho_ids[s:s + W + 1])
            if not rows:
                break
            ids = torch.stack(rows).to(dev).long()
            lg = ref(input_ids=ids[:, :-1], use_cache=False).logits.float()
            nll = torch.nn.functional.cross_entropy(lg.reshape(-1, VOCAB),
                                                    ids[:, 1:].reshape(-1), reduction="sum")
            nll_sum += nll.item()
            nll_n += ids[:, 1:].numel()
        ppl = math.exp(nll_sum / nll_n)
        # chat held-out (the part after the first window is skipped when short)
        m2 = min(len(cho_ids) - 1, 64 * 1024 if not args.smoke else 2048) // W * W
        cs, cn = 0.0, 0
        for o in range(0, m2, W):
            ids = cho_ids[o:o + W + 1].view(1, -1).to(dev).long()
            lg = ref(input_ids=ids[:, :-1], use_cache=False).logits.float()
            cs += torch.nn.functional.cross_entropy(lg[0], ids[0, 1:], reduction="sum").item()
            cn += W
    info["heldout_ppl_fp32_dequantised"] = round(ppl, 4)
    info["heldout_ppl_tokens"] = nll_n
    info["chat_heldout_ppl_fp32_dequantised"] = round(math.exp(cs / max(cn, 1)), 4) if cn else None
    log(f"held-out PPL (transformers fp32, dequantised 4-bit): {ppl:.3f} over {nll_n} tokens "
        f"(windows of {W}); chat held-out {info['chat_heldout_ppl_fp32_dequantised']}")

    # reference slice: the start of the first held-out prose document (few runs of spaces, so
    # not a rendered man page), cut where it re-tokenizes identically
    text = next((d for d in held_docs if len(d) > 6000 and d.count("   ") < len(d) / 400),
                held_docs[0])
    full = tok.encode(text[:20000], add_special_tokens=False).ids
    N = min(args.ref_tokens, len(full))
    while N > 8:
        piece = tok.decode(full[:N], skip_special_tokens=False)
        again = tok.encode(piece, add_special_tokens=False).ids
        if again == full[:N]:
            break
        N -= 1
    ids_l = full[:N]
    with open(os.path.join(md, "eval_text.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(piece)
    with torch.no_grad():
        ids = torch.tensor([ids_l], device=dev)
        lg = ref(input_ids=ids, use_cache=False).logits[0].float()
    lp = torch.log_softmax(lg, -1)
    am = lg.argmax(-1).to(torch.int32).cpu()
    nll = torch.zeros(N)
    nll[:-1] = -lp[torch.arange(N - 1, device=dev), ids[0, 1:]].cpu()
    with open(os.path.join(md, "ref.bin"), "wb") as f:
        f.write(b"LILYREF1" + struct.pack("<4I", N, VOCAB, 0, 0))
        f.write(np.asarray(ids_l, dtype="<i4").tobytes())
        f.write(am.numpy().astype("<i4").tobytes())
        f.write(nll.numpy().astype("<f4").tobytes())
        f.write(lp.cpu().numpy().astype("<f2").tobytes())
    info["ref"] = {"tokens": N, "ppl": round(math.exp(nll[:-1].mean().item()), 4)}
    log(f"reference slice: {N} tokens, PPL {info['ref']['ppl']:.3f}")

    # a few greedy chat answers from the fp32 reference (for the log)
    samples = []
    try:
        for q in ("What does the grep command do?", "What does the word lily mean?",
                  "What is the Python module json for?")[:1 if args.smoke else 3]:
            p = (f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n<think>\n")
            ids = torch.tensor([tok.encode(p, add_special_tokens=False).ids], device=dev)
            with torch.no_grad():
                for _ in range(8 if args.smoke else 60):
                    nxt = ref(input_ids=ids, use_cache=False).logits[0, -1].argmax()
                    ids = torch.cat([ids, nxt.view(1, 1)], 1)
                    if nxt.item() in (im_end, eos):
                        break
            samples.append(tok.decode(ids[0].tolist(), skip_special_tokens=False))
            log("sample: " + samples[-1].replace("\n", "\\n"))
    except Exception as e:  # noqa: BLE001 - for the log only
        log(f"samples failed: {e!r}")
    info["samples"] = samples
    info["seconds_total"] = round(time.time() - t_start, 1)
    with open(os.path.join(md, "train_log.json"), "w") as f:
        json.dump(info, f, indent=1)
    log(json.dumps({k: v for k, v in info.items() if k not in ("samples",)}, indent=None))


if __name__ == "__main__":
    main()
