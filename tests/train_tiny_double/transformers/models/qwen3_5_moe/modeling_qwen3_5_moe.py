# test double: the parameter names and shapes of transformers' qwen3_5_moe, simplified math
import torch, torch.nn as nn, torch.nn.functional as F
class Qwen3_5MoeRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__(); self.weight = nn.Parameter(torch.zeros(dim)); self.eps = eps
    def forward(self, x):
        o = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (o * (1 + self.weight.float())).type_as(x)
class Rot(nn.Module):
    def __init__(self, c):
        super().__init__(); self.d = int(c.head_dim * 0.25)
    def forward(self, x, pos):
        inv = 1.0 / (1e7 ** (torch.arange(0, self.d, 2).float() / self.d))
        f = pos[..., None].float() * inv
        e = torch.cat([f, f], -1)
        return e.cos().expand(x.shape[0], -1, -1), e.sin().expand(x.shape[0], -1, -1)
class Attn(nn.Module):
    def __init__(self, c):
        super().__init__(); H, D = c.hidden_size, c.head_dim
        self.c = c
        self.q_proj = nn.Linear(H, c.num_attention_heads * D * 2, bias=False)
        self.k_proj = nn.Linear(H, c.num_key_value_heads * D, bias=False)
        self.v_proj = nn.Linear(H, c.num_key_value_heads * D, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * D, H, bias=False)
        self.q_norm = Qwen3_5MoeRMSNorm(D); self.k_norm = Qwen3_5MoeRMSNorm(D)
    def forward(self, h, position_embeddings, attention_mask=None, **k):
        B, T, _ = h.shape; c = self.c; D = c.head_dim
        q, g = self.q_proj(h).view(B, T, -1, 2 * D).chunk(2, -1)
        q = self.q_norm(q).transpose(1, 2); kk = self.k_norm(self.k_proj(h).view(B, T, -1, D)).transpose(1, 2)
        v = self.v_proj(h).view(B, T, -1, D).transpose(1, 2)
        r = c.num_attention_heads // c.num_key_value_heads
        kk, v = kk.repeat_interleave(r, 1), v.repeat_interleave(r, 1)
        if attention_mask is not None: assert attention_mask.dtype == torch.bool and attention_mask.shape[-1] == T, attention_mask.shape
        cos, sin = position_embeddings; assert cos.shape[1] == T, (cos.shape, T)
        sc = (q @ kk.transpose(-1, -2)) * D ** -0.5
        sc = sc.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        o = (sc.float().softmax(-1).to(v.dtype) @ v).transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(o * torch.sigmoid(g.reshape(B, T, -1))), None
class GDN(nn.Module):
    def __init__(self, c):
        super().__init__(); H = c.hidden_size
        kd, vd, nv = c.linear_num_key_heads * c.linear_key_head_dim, c.linear_num_value_heads * c.linear_value_head_dim, c.linear_num_value_heads
        self.in_proj_qkv = nn.Linear(H, 2 * kd + vd, bias=False); self.in_proj_z = nn.Linear(H, vd, bias=False)
        self.in_proj_b = nn.Linear(H, nv, bias=False); self.in_proj_a = nn.Linear(H, nv, bias=False)
        self.conv1d = nn.Conv1d(2 * kd + vd, 2 * kd + vd, 4, groups=2 * kd + vd, bias=False, padding=3)
        self.dt_bias = nn.Parameter(torch.ones(nv)); self.A_log = nn.Parameter(torch.zeros(nv))
        self.norm = nn.Module(); self.norm.weight = nn.Parameter(torch.ones(c.linear_value_head_dim))
        self.out_proj = nn.Linear(vd, H, bias=False); self.kd = kd
    def forward(self, hidden_states, **k):
        x = self.conv1d(self.in_proj_qkv(hidden_states).transpose(1, 2))[..., :hidden_states.shape[1]].transpose(1, 2)
        v = F.silu(x[..., 2 * self.kd:]) * F.silu(self.in_proj_z(hidden_states))
        return self.out_proj(v) + 0 * (self.in_proj_a(hidden_states).sum() + self.in_proj_b(hidden_states).sum() + self.dt_bias.sum() + self.A_log.sum() + self.norm.weight.sum())
class Router(nn.Module):
    def __init__(self, c):
        super().__init__(); self.weight = nn.Parameter(torch.zeros(c.num_experts, c.hidden_size)); self.k = c.num_experts_per_tok
    def forward(self, h):
        l = F.linear(h.reshape(-1, h.shape[-1]), self.weight)
        p = l.float().softmax(-1); v, i = p.topk(self.k, -1)
        return l, (v / v.sum(-1, keepdim=True)).to(l.dtype), i
class Experts(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(c.num_experts, 2 * c.moe_intermediate_size, c.hidden_size))
        self.down_proj = nn.Parameter(torch.empty(c.num_experts, c.hidden_size, c.moe_intermediate_size))
    def forward(self, h, idx, w):
        out = torch.zeros_like(h)
        for e in range(self.gate_up_proj.shape[0]):
            tok, pos = torch.where(idx == e)
            if tok.numel() == 0: continue
            g, u = F.linear(h[tok], self.gate_up_proj[e]).chunk(2, -1)
            out.index_add_(0, tok, (F.linear(F.silu(g) * u, self.down_proj[e]) * w[tok, pos, None]).to(out.dtype))
        return out
class MLP(nn.Module):
    def __init__(self, c, I):
        super().__init__(); H = c.hidden_size
        self.gate_proj = nn.Linear(H, I, bias=False); self.up_proj = nn.Linear(H, I, bias=False); self.down_proj = nn.Linear(I, H, bias=False)
    def forward(self, x): return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
class Moe(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate = Router(c); self.experts = Experts(c); self.shared_expert = MLP(c, c.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(c.hidden_size, 1, bias=False)
    def forward(self, h):
        B, T, H = h.shape; x = h.reshape(-1, H)
        _, w, i = self.gate(x)
        y = self.experts(x, i, w) + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return y.reshape(B, T, H)
class Qwen3_5MoeDecoderLayer(nn.Module):
    def __init__(self, c, idx):
        super().__init__(); self.t = c.layer_types[idx]
        if self.t == "linear_attention": self.linear_attn = GDN(c)
        else: self.self_attn = Attn(c)
        self.mlp = Moe(c); self.input_layernorm = Qwen3_5MoeRMSNorm(c.hidden_size); self.post_attention_layernorm = Qwen3_5MoeRMSNorm(c.hidden_size)
    def forward(self, h, position_embeddings, attention_mask=None, **k):
        x = self.input_layernorm(h)
        x = self.linear_attn(hidden_states=x) if self.t == "linear_attention" else self.self_attn(x, position_embeddings, attention_mask)[0]
        h = h + x
        return h + self.mlp(self.post_attention_layernorm(h))
class _Out:
    def __init__(self, **k): self.__dict__.update(k)
class TextModel(nn.Module):
    def __init__(self, c):
        super().__init__(); self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([Qwen3_5MoeDecoderLayer(c, i) for i in range(c.num_hidden_layers)])
        self.norm = Qwen3_5MoeRMSNorm(c.hidden_size); self.rotary_emb = Rot(c)
    def forward(self, input_ids, use_cache=False):
        h = self.embed_tokens(input_ids)
        pe = self.rotary_emb(h, torch.arange(input_ids.shape[1])[None])
        for l in self.layers: h = l(h, pe)
        return _Out(last_hidden_state=self.norm(h))
class Qwen3_5MoeForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__(); self.config = c
        self.model = TextModel(c); self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        for m in self.modules():
            if isinstance(m, Experts): nn.init.normal_(m.gate_up_proj, 0, 0.02); nn.init.normal_(m.down_proj, 0, 0.02)
            if isinstance(m, Router): nn.init.normal_(m.weight, 0, 0.02)
    def set_attn_implementation(self, v): pass
    def set_experts_implementation(self, v):
        if v == "grouped_mm": raise ValueError("mock: no grouped_mm")
    def forward(self, input_ids, use_cache=False):
        return _Out(logits=self.lm_head(self.model(input_ids).last_hidden_state))
