class Qwen3_5MoeTextConfig:
    def __init__(self, **kw):
        self.__dict__.update(kw)
        if getattr(self, "layer_types", None) is None:
            self.layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(self.num_hidden_layers)]
