# test double of HF tokenizers: byte-level ids (0..255), added tokens after the "BPE" ids
import json, re
class Regex:
    def __init__(self, p): self.p = p
class AddedToken:
    def __init__(self, c, special=False, **k): self.content, self.special = c, special
class _NS:
    def __init__(self, *a, **k): pass
class models: BPE = _NS
class normalizers: NFC = _NS
class decoders: ByteLevel = _NS
class processors: ByteLevel = _NS
class pre_tokenizers:
    Sequence = _NS; Split = _NS
    class ByteLevel(_NS):
        @staticmethod
        def alphabet(): return []
class trainers:
    class BpeTrainer:
        def __init__(self, vocab_size, **k): self.vocab_size = vocab_size
class _Enc:
    def __init__(self, ids): self.ids = ids
class Tokenizer:
    def __init__(self, model):
        self.n = 0; self.added = []
    def train_from_iterator(self, texts, trainer): self.n = trainer.vocab_size; list(texts)
    def get_vocab_size(self): return self.n + len(self.added)
    def add_tokens(self, toks): self.added += toks
    def token_to_id(self, c):
        for i, t in enumerate(self.added):
            if t.content == c: return self.n + i
    def encode(self, text, add_special_tokens=False):
        if not self.added: return _Enc(list(text.encode()))
        pat = "(" + "|".join(re.escape(t.content) for t in self.added) + ")"
        ids = []
        for part in re.split(pat, text):
            tid = self.token_to_id(part)
            ids += [tid] if tid is not None else list(part.encode())
        return _Enc(ids)
    def encode_batch(self, texts, add_special_tokens=False): return [self.encode(t) for t in texts]
    def decode(self, ids, skip_special_tokens=False):
        out = b""
        for i in ids:
            out += bytes([i]) if i < 256 else (self.added[i - self.n].content.encode() if i >= self.n else b"")
        return out.decode("utf-8", "replace")
    def save(self, path): json.dump({"mock": True}, open(path, "w"))
