#!/usr/bin/env python3
"""Reference logits for a qwen3_5_moe checkpoint from HF transformers (teacher-forced, fp32).

Usage:
  hf_reference.py --model DIR --tokens FILE --out FILE [--dtype float32|bfloat16]
                  [--fnv-out FILE] [--device cuda|cpu] [--convert-only] [--selfcheck N]

tokens: little-endian int32 ids. out: little-endian float32 [n_tokens][vocab], row i = logits
after tokens 0..i, from ONE forward pass over the whole sequence with no cache.

The checkpoint is read here, not by from_pretrained: the safetensors files are parsed directly
(8-byte header length, JSON header, raw little-endian data), names and shapes are converted to
exactly what the instantiated Qwen3_5MoeForCausalLM's state_dict() holds, everything is upcast
to float32 and loaded with load_state_dict(strict=True). Handled layouts:
  - HF: model.language_model.* (or text-only model.*) + lm_head.weight; experts either per
    expert (mlp.experts.N.{gate,up,down}_proj.weight) or fused (mlp.experts.gate_up_proj
    [E,2I,H], mlp.experts.down_proj [E,H,I]).
  - MLX affine (model.md 7.2): language_model.model.* / language_model.lm_head.*, uint32-packed
    weights with bf16 scales/biases per group (W = scale*q + bias), switch_mlp stacks,
    conv1d [C,K,1], zero-centred norms stored shifted (w_mlx = 1 + w_hf).
The fast GDN kernels (fla, causal-conv1d) are blocked before transformers is imported, so the
model runs its pure-torch chunked path; the script reports which functions ran. TF32 is off.

The FNV-1a 64 of config.json followed by every *.safetensors file (sorted by name) is printed and
optionally written to --fnv-out, so a test can tell whether a regenerated checkpoint is the same.

Every failure prints what was expected and what was found, because this runs unattended on a
remote machine.
"""
import argparse
import json
import os
import re
import struct
import sys
import time

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK64 = (1 << 64) - 1


def die(msg):
    print("hf_reference: ERROR: " + msg, file=sys.stderr, flush=True)
    sys.exit(2)


def checkpoint_files(model_dir):
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        die(f"{model_dir}/config.json not found")
    st = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not st:
        die(f"no *.safetensors files in {model_dir}")
    return st


def fnv1a64(model_dir):
    """FNV-1a 64 over config.json then each *.safetensors (sorted by name), as hex."""
    h = FNV_OFFSET
    names = ["config.json"] + checkpoint_files(model_dir)
    for name in names:
        with open(os.path.join(model_dir, name), "rb") as f:
            while True:
                buf = f.read(1 << 20)
                if not buf:
                    break
                # Process in Python ints; slow but only a few MB for the fixture models.
                for b in buf:
                    h = ((h ^ b) * FNV_PRIME) & MASK64
    return f"{h:016x}"


# ---- safetensors -------------------------------------------------------------------------------

def st_dtypes(torch):
    return {
        "F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2),
        "F64": (torch.float64, 8), "I64": (torch.int64, 8), "I32": (torch.int32, 4),
        "I16": (torch.int16, 2), "I8": (torch.int8, 1), "U8": (torch.uint8, 1),
        "BOOL": (torch.bool, 1),
        # U32 is read as int32 bit patterns; dequantisation masks the bits it needs.
        "U32": (torch.int32, 4),
    }


def read_safetensors(torch, path):
    """Returns {name: (dtype_string, tensor)} with tensors in their stored dtype (U32 -> int32)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        die(f"{path}: too short for a safetensors file ({len(data)} bytes)")
    (hlen,) = struct.unpack("<Q", data[:8])
    if 8 + hlen > len(data):
        die(f"{path}: header length {hlen} past the end of the file ({len(data)} bytes)")
    try:
        header = json.loads(data[8:8 + hlen].decode("utf-8"))
    except Exception as e:  # noqa: BLE001 - report any parse problem
        die(f"{path}: header is not valid JSON: {e}")
    base = 8 + hlen
    dt = st_dtypes(torch)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = info["dtype"], info["shape"]
        a, b = info["data_offsets"]
        if dtype not in dt:
            die(f"{path}: tensor {name} has unsupported dtype {dtype}")
        tdt, size = dt[dtype]
        n = 1
        for s in shape:
            n *= s
        if b - a != n * size or base + b > len(data):
            die(f"{path}: tensor {name} {dtype}{shape}: data_offsets [{a},{b}) do not fit "
                f"{n * size} bytes within a file of {len(data)} bytes")
        if n == 0:
            t = torch.zeros(shape, dtype=tdt)
        else:
            t = torch.frombuffer(bytearray(data[base + a:base + b]), dtype=tdt).reshape(shape)
        out[name] = (dtype, t)
    return out


# ---- checkpoint -> canonical float32 HF text weights -------------------------------------------

# Zero-centred norms ("1 + w"): MLX stores them already shifted (model.md 2.1).
SHIFTED_NORM = re.compile(
    r"^model\.(norm|layers\.\d+\.(input_layernorm|post_attention_layernorm|self_attn\.q_norm|"
    r"self_attn\.k_norm))\.weight$")


def canonical_name(name):
    """Maps a stored tensor name to the text model's HF name (model.X / lm_head.X), or None."""
    for skip in ("model.visual.", "visual.", "vision_tower.", "mtp.", "model.mtp.",
                 "language_model.model.mtp."):
        if name.startswith(skip):
            return None
    for pre, rep in (("model.language_model.", "model."), ("language_model.model.", "model."),
                     ("language_model.lm_head.", "lm_head."), ("model.", "model."),
                     ("lm_head.", "lm_head.")):
        if name.startswith(pre):
            return rep + name[len(pre):]
    return None


def quant_params(qcfg, module_path):
    """(bits, group) from the MLX table for a stored module path (name without .weight)."""
    if not qcfg:
        return None
    ent = qcfg.get(module_path)
    if ent is False:
        return (0, 0)
    if isinstance(ent, dict):
        return (int(ent.get("bits", qcfg.get("bits", 4))),
                int(ent.get("group_size", qcfg.get("group_size", 64))))
    return (int(qcfg.get("bits", 4)), int(qcfg.get("group_size", 64)))


def dequantize(torch, name, w, scales, biases, bits_cfg):
    """MLX affine dequantisation: W[o][c] = scales[o][c/g] * q[o][c] + biases[o][c/g] (fp32).
    w holds uint32 words (as int32) packing 32/bits elements each, LSB first."""
    words = w.shape[-1]
    groups = scales.shape[-1]
    if scales.shape != biases.shape or scales.shape[:-1] != w.shape[:-1]:
        die(f"{name}: quantized shapes disagree: weight {list(w.shape)} scales "
            f"{list(scales.shape)} biases {list(biases.shape)}")
    # Infer bits from the shapes for each candidate group size; prefer the table's value.
    cands = []
    for g in (bits_cfg[1] if bits_cfg else 64, 32, 64, 128):
        cols = groups * g
        if (words * 32) % cols == 0 and (words * 32) // cols in (2, 3, 4, 5, 6, 8):
            cands.append(((words * 32) // cols, g))
    if not cands:
        die(f"{name}: cannot infer bits: {words} uint32 words per row, {groups} groups per row")
    bits, group = cands[0]
    if bits_cfg and bits_cfg[0] and (bits, group) != tuple(bits_cfg):
        die(f"{name}: config says bits={bits_cfg[0]} group_size={bits_cfg[1]}, but the shapes "
            f"(weight {list(w.shape)}, scales {list(scales.shape)}) imply bits={bits} "
            f"group_size={group}")
    if bits not in (2, 4, 8):
        die(f"{name}: {bits}-bit packing is not supported (only 2, 4, 8)")
    per = 32 // bits
    mask = (1 << bits) - 1
    w64 = w.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(per, dtype=torch.int64) * bits
    q = (w64.unsqueeze(-1) >> shifts) & mask           # [..., out, words, per]
    q = q.reshape(*w.shape[:-1], words * per).to(torch.float32)
    s = scales.to(torch.float32).repeat_interleave(group, dim=-1)
    b = biases.to(torch.float32).repeat_interleave(group, dim=-1)
    return s * q + b, bits, group


def load_checkpoint(torch, model_dir, cfg):
    """Returns ({canonical name: float32 tensor}, layout string, notes list)."""
    files = checkpoint_files(model_dir)
    raw = {}
    for fn in files:
        for name, v in read_safetensors(torch, os.path.join(model_dir, fn)).items():
            if name in raw:
                die(f"tensor {name} appears in more than one file")
            raw[name] = v
    qcfg = cfg.get("quantization") or cfg.get("quantization_config")
    is_mlx = any(n.endswith(".scales") for n in raw) or \
        any(n.startswith("language_model.") for n in raw)
    notes = []
    out = {}
    skipped = []
    consumed = set()
    deq = {}
    for name in sorted(raw):
        if name in consumed:
            continue
        dtype, t = raw[name]
        if name.endswith(".scales") or name.endswith(".biases"):
            continue  # handled with their .weight
        cname = canonical_name(name)
        if cname is None:
            skipped.append(name)
            continue
        if name.endswith(".weight") and (name[:-7] + ".scales") in raw:
            mod = name[:-7]
            if (mod + ".biases") not in raw:
                die(f"{mod}.scales present but {mod}.biases missing")
            t, bits, group = dequantize(torch, name, t, raw[mod + ".scales"][1],
                                        raw[mod + ".biases"][1], quant_params(qcfg, mod))
            consumed.update((mod + ".scales", mod + ".biases"))
            key = f"{bits}-bit/g{group}"
            deq[key] = deq.get(key, 0) + 1
        else:
            t = t.to(torch.float32)
        out[cname] = t
    leftovers = [n for n in raw if (n.endswith(".scales") or n.endswith(".biases"))
                 and n not in consumed and canonical_name(n) is not None]
    if leftovers:
        die(f"quantization companions without a .weight: {leftovers[:5]}")
    if deq:
        notes.append("dequantized (MLX affine): " +
                     ", ".join(f"{v} tensors {k}" for k, v in sorted(deq.items())))
    if skipped:
        notes.append(f"skipped {len(skipped)} non-text tensors (e.g. {skipped[0]})")
    if is_mlx:
        for k in list(out):
            if SHIFTED_NORM.match(k):
                out[k] = out[k] - 1.0
            if k.endswith("linear_attn.conv1d.weight") and out[k].dim() == 3 \
                    and out[k].shape[2] == 1 and out[k].shape[1] != 1:
                out[k] = out[k].transpose(1, 2).contiguous()  # [C,K,1] -> [C,1,K]
        notes.append("MLX layout: zero-centred norms un-shifted (w - 1), conv1d [C,K,1] -> [C,1,K]")
    return out, ("mlx" if is_mlx else "hf"), notes


EXPERT_KEY = re.compile(r"^(model\.layers\.\d+\.mlp\.)(experts|switch_mlp)\.(.+)$")


def collect_experts(torch, sd):
    """Pulls every expert tensor out of sd into {layer prefix: (gate [E,I,H], up [E,I,H],
    down [E,H,I])}, whatever the stored form."""
    per = {}
    for k in list(sd):
        m = EXPERT_KEY.match(k)
        if not m:
            continue
        per.setdefault(m.group(1), {})[m.group(2) + "." + m.group(3)] = sd.pop(k)
    res = {}
    for pre, d in per.items():
        if "experts.gate_up_proj" in d:
            gu, down = d.pop("experts.gate_up_proj"), d.pop("experts.down_proj", None)
            if down is None or gu.dim() != 3 or gu.shape[1] % 2:
                die(f"{pre}experts: fused gate_up_proj {list(gu.shape)} needs [E,2I,H] and "
                    f"a down_proj")
            i = gu.shape[1] // 2
            res[pre] = (gu[:, :i], gu[:, i:], down)
        elif "switch_mlp.gate_proj.weight" in d:
            res[pre] = (d.pop("switch_mlp.gate_proj.weight"), d.pop("switch_mlp.up_proj.weight"),
                        d.pop("switch_mlp.down_proj.weight"))
        else:
            ids = sorted({int(k.split(".")[1]) for k in d if re.match(r"experts\.\d+\.", k)})
            if not ids or ids != list(range(len(ids))):
                die(f"{pre}experts: unrecognised expert keys {sorted(d)[:6]}")
            try:
                g = torch.stack([d.pop(f"experts.{e}.gate_proj.weight") for e in ids])
                u = torch.stack([d.pop(f"experts.{e}.up_proj.weight") for e in ids])
                dn = torch.stack([d.pop(f"experts.{e}.down_proj.weight") for e in ids])
            except KeyError as e:
                die(f"{pre}experts: missing per-expert tensor {e}")
            res[pre] = (g, u, dn)
        if d:
            die(f"{pre}: leftover expert tensors not understood: {sorted(d)}")
    return res


def fit(name, t, want_shape):
    """Returns t in want_shape: as is, or with its last two dims swapped when only that fits."""
    want = tuple(want_shape)
    if tuple(t.shape) == want:
        return t
    if t.dim() >= 2 and tuple(t.shape[:-2]) + (t.shape[-1], t.shape[-2]) == want:
        return t.transpose(-1, -2).contiguous()
    if t.numel() == _numel(want) and t.dim() != len(want):
        return t.reshape(want)
    die(f"{name}: checkpoint shape {list(t.shape)} does not fit the model's {list(want)}")


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def to_model_state(torch, ckpt, model_sd, tie):
    """Maps canonical weights onto the model's own state_dict keys and shapes."""
    ckpt = dict(ckpt)
    experts = collect_experts(torch, ckpt)
    new = {}
    for key, ref in model_sd.items():
        m = EXPERT_KEY.match(key)
        if m and m.group(2) == "experts" and m.group(1) in experts:
            g, u, d = experts[m.group(1)]
            rest = m.group(3)
            if rest == "gate_up_proj":
                new[key] = fit(key, torch.cat([g, u], dim=1), ref.shape)
            elif rest == "down_proj":
                new[key] = fit(key, d, ref.shape)
            elif rest in ("gate_proj", "up_proj"):
                new[key] = fit(key, g if rest == "gate_proj" else u, ref.shape)
            else:
                mm = re.match(r"^(\d+)\.(gate|up|down)_proj\.weight$", rest)
                if not mm:
                    die(f"model expects expert parameter {key}, which this script cannot map")
                e, which = int(mm.group(1)), mm.group(2)
                src = {"gate": g, "up": u, "down": d}[which]
                if e >= src.shape[0]:
                    die(f"{key}: checkpoint has only {src.shape[0]} experts")
                new[key] = fit(key, src[e], ref.shape)
            continue
        if key in ckpt:
            new[key] = fit(key, ckpt.pop(key), ref.shape)
        elif key == "lm_head.weight" and "model.embed_tokens.weight" in ckpt and tie:
            new[key] = fit(key, ckpt["model.embed_tokens.weight"], ref.shape)
    missing = [k for k in model_sd if k not in new]
    unused = sorted(ckpt)
    if missing or unused:
        lines = ["weight mapping failed:"]
        for k in missing:
            lines.append(f"  model expects {k} {list(model_sd[k].shape)}: nothing maps to it")
        for k in unused:
            lines.append(f"  checkpoint tensor {k} {list(ckpt[k].shape)}: model has no such key")
        die("\n".join(lines))
    return new


# ---- transformers ------------------------------------------------------------------------------

def block_fast_kernels():
    """Makes the optional fast-kernel packages unimportable, so transformers keeps the torch
    implementations of the gated delta rule and the causal conv."""
    for mod in ("fla", "causal_conv1d", "flash_linear_attention"):
        sys.modules.setdefault(mod, None)


def text_config_dict(cfg):
    tc = dict(cfg.get("text_config") or cfg)
    for k in ("model_type", "quantization", "quantization_config", "architectures",
              "transformers_version", "auto_map", "text_config", "vision_config", "torch_dtype",
              "dtype"):
        tc.pop(k, None)
    if "tie_word_embeddings" not in tc and "tie_word_embeddings" in cfg:
        tc["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    return tc


def build_config(tc_cls, tc):
    try:
        return tc_cls(**tc)
    except Exception as e:  # noqa: BLE001 - strict dataclass configs raise various types
        fields = getattr(tc_cls, "__dataclass_fields__", None)
        if not fields:
            die(f"{tc_cls.__name__}(**text_config) failed: {e!r}")
        keep = {k: v for k, v in tc.items()
                if k in fields or k in ("full_attention_interval", "partial_rotary_factor")}
        dropped = sorted(set(tc) - set(keep))
        print(f"note: {tc_cls.__name__}(**text_config) failed ({e!r}); retrying without "
              f"{dropped}", flush=True)
        try:
            return tc_cls(**keep)
        except Exception as e2:  # noqa: BLE001
            die(f"{tc_cls.__name__} rejected the text config: {e2!r}\ntext_config = "
                f"{json.dumps(tc, indent=1)[:3000]}")


GDN_FUNCS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
             "causal_conv1d_fn", "causal_conv1d_update",
             "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule")


def instrument_gdn(model, modeling, calls):
    """Wraps the GDN kernels (module globals and per-instance attributes, depending on the
    transformers version) with call counters and reports where each comes from."""
    def wrap(label, fn):
        def w(*a, **k):
            calls[label] = calls.get(label, 0) + 1
            return fn(*a, **k)
        w.__wrapped__ = fn
        return w

    origin = {}
    for name in GDN_FUNCS:
        fn = getattr(modeling, name, None)
        if callable(fn):
            origin["global " + name] = f"{getattr(fn, '__module__', '?')}." \
                                       f"{getattr(fn, '__qualname__', '?')}"
            setattr(modeling, name, wrap("global " + name, fn))
    for mod in model.modules():
        if type(mod).__name__.endswith("GatedDeltaNet"):
            for name in GDN_FUNCS:
                fn = mod.__dict__.get(name)
                if callable(fn):
                    origin["attr " + name] = f"{getattr(fn, '__module__', '?')}." \
                                             f"{getattr(fn, '__qualname__', '?')}"
                    setattr(mod, name, wrap("attr " + name, fn))
    return origin


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--fnv-out", default=None)
    ap.add_argument("--convert-only", action="store_true",
                    help="only read and convert the checkpoint (no transformers needed)")
    ap.add_argument("--selfcheck", type=int, default=0,
                    help="also decode the first N tokens one at a time with the HF cache and "
                         "report the difference to the one-pass logits")
    args = ap.parse_args()
    t0 = time.time()

    block_fast_kernels()
    import torch

    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    fnv = fnv1a64(args.model)
    print(f"checkpoint {args.model}: fnv1a64 {fnv}", flush=True)
    if args.fnv_out:
        with open(args.fnv_out, "w") as f:
            f.write(fnv + "\n")

    with open(args.tokens, "rb") as f:
        tb = f.read()
    if len(tb) == 0 or len(tb) % 4:
        die(f"{args.tokens}: {len(tb)} bytes is not a non-empty multiple of 4 (int32 LE ids)")
    toks = list(struct.unpack(f"<{len(tb) // 4}i", tb))

    ckpt, layout, notes = load_checkpoint(torch, args.model, cfg)
    for n in notes:
        print("  " + n)
    print(f"layout {layout}: {len(ckpt)} text tensors, "
          f"{sum(t.numel() for t in ckpt.values())} values", flush=True)
    tc = text_config_dict(cfg)
    vocab = int(tc.get("vocab_size", 0))
    bad = [t for t in toks if t < 0 or t >= vocab]
    if bad:
        die(f"{args.tokens}: {len(bad)} ids outside [0, {vocab}), e.g. {bad[:5]}")
    if args.convert_only:
        for k in sorted(ckpt):
            print(f"  {k} {list(ckpt[k].shape)} mean {ckpt[k].float().mean().item():+.4f}")
        return

    try:
        import transformers
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as modeling
        from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import \
            Qwen3_5MoeTextConfig
    except Exception as e:  # noqa: BLE001
        die(f"cannot import transformers' qwen3_5_moe: {e!r}")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}", flush=True)

    config = build_config(Qwen3_5MoeTextConfig, tc)
    for attr, val in (("_attn_implementation", "eager"), ("_experts_implementation", "eager")):
        try:
            setattr(config, attr, val)
        except Exception as e:  # noqa: BLE001
            print(f"note: cannot set config.{attr}: {e!r}")
    print(f"layer_types: {config.layer_types}")
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(0)

    cls = modeling.Qwen3_5MoeForCausalLM
    model = cls(config)
    for setter, val in (("set_attn_implementation", "eager"),
                        ("set_experts_implementation", "eager")):
        fn = getattr(model, setter, None)
        if fn is not None:
            try:
                fn(val)
            except Exception as e:  # noqa: BLE001
                print(f"note: model.{setter}({val!r}) failed: {e!r}")
    impls = {}
    for getter in ("get_attn_implementation", "get_experts_implementation"):
        fn = getattr(model, getter, None)
        if fn is not None:
            try:
                impls[getter[4:]] = fn()
            except Exception as e:  # noqa: BLE001
                impls[getter[4:]] = f"? ({e!r})"
    impls.setdefault("attn_implementation", getattr(model.config, "_attn_implementation", "?"))
    impls.setdefault("experts_implementation",
                     getattr(model.config, "_experts_implementation", "?"))
    print(f"implementations: {impls}")
    for name, val in impls.items():
        if "eager" not in str(val):
            die(f"{name} is {val!r}, not 'eager'")

    model_sd = model.state_dict()
    state = to_model_state(torch, ckpt, model_sd, bool(getattr(config, "tie_word_embeddings",
                                                                False)))
    res = model.load_state_dict(state, strict=True)
    if getattr(res, "missing_keys", None) or getattr(res, "unexpected_keys", None):
        die(f"load_state_dict: missing {res.missing_keys} unexpected {res.unexpected_keys}")
    dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    model = model.to(device=dev, dtype=dtype).eval()
    nonfloat = [n for n, p in model.named_parameters() if p.dtype != dtype]
    if nonfloat:
        die(f"parameters not in {dtype}: {nonfloat[:5]}")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model {cls.__name__}: {len(state)} tensors, {n_params} parameters loaded, "
          f"device {dev}, dtype {args.dtype}", flush=True)

    calls = {}
    origin = instrument_gdn(model, modeling, calls)
    n_gdn = sum(1 for t in config.layer_types if t == "linear_attention")
    for k, v in sorted(origin.items()):
        print(f"  GDN function {k}: {v}")
        if not v.startswith("transformers."):
            die(f"GDN function {k} comes from {v}, not transformers' torch fallback")

    ids = torch.tensor([toks], dtype=torch.long, device=dev)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False)
    logits = out.logits[0].float()
    if dev == "cuda":
        torch.cuda.synchronize()
    print(f"GDN calls during the forward pass: {calls}")
    chunk = sum(v for k, v in calls.items() if "chunk" in k)
    if n_gdn and not any("chunk" in k for k in origin):
        print("WARNING: no chunked GDN function found to instrument in this transformers "
              "version; fla and causal_conv1d were blocked from import, so only the torch path "
              "exists", flush=True)
    elif n_gdn and chunk < n_gdn:
        die(f"expected the chunked GDN function to run {n_gdn} times (once per GDN layer), "
            f"counted {chunk}: the fast path may have been taken")
    if tuple(logits.shape) != (len(toks), vocab):
        die(f"logits shape {list(logits.shape)}, expected [{len(toks)}, {vocab}]")
    if not torch.isfinite(logits).all():
        die("logits contain NaN or inf")
    arr = logits.cpu().contiguous()
    with open(args.out, "wb") as f:
        f.write(arr.numpy().astype("<f4").tobytes())
    am = arr.argmax(dim=1).tolist()
    print(f"logits [{len(toks)}, {vocab}] -> {args.out}; max|logit| {arr.abs().max().item():.4f}; "
          f"row std {arr.std(dim=1).mean().item():.4f}; argmax[0:12] {am[:12]}")

    if args.selfcheck > 0:
        # Diagnostic only (the logits are already written): HF's own cached decode, token by
        # token with explicit positions, against its one-pass logits.
        try:
            n = min(args.selfcheck, len(toks))
            rows, past = [], None
            with torch.no_grad():
                for i in range(n):
                    o = model(input_ids=ids[:, i:i + 1], past_key_values=past, use_cache=True,
                              position_ids=torch.tensor([[i]], device=dev))
                    past = o.past_key_values
                    rows.append(o.logits[0, -1].float())
            inc = torch.stack(rows).cpu()
            d = (inc - arr[:n]).abs().max(dim=1).values / arr[:n].abs().max(dim=1).values
            agree = (inc.argmax(1) == arr[:n].argmax(1)).float().mean().item()
            print(f"selfcheck: HF cached decode of {n} tokens vs one pass: worst row "
                  f"max|d|/max|ref| {d.max().item():.3e}, top-1 agreement {agree * 100:.2f}%")
        except Exception as e:  # noqa: BLE001 - diagnostic only
            print(f"selfcheck: could not run HF cached decode ({e!r}); logits are unaffected")
    print(f"done in {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
