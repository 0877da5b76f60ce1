"""Write a tiny Hugging Face Llama directory (safetensors, bf16, tokenizer.json) as one GGUF
file with PyPI's ``gguf`` package: ``python gguf_writer.py MODEL_DIR OUT.gguf``.

Run in a venv holding ``gguf`` (numpy comes with it); it reads the safetensors header and its
bf16 bytes itself, so no torch is needed. The weights are the model's, with llama.cpp's
layout (q and k rows permuted for its RoPE, as convert_hf_to_gguf.py does) and two changes
the tests need (tests/support/llamacpp_cpu.py says why): residual dimension 0 carries a
constant that the output head turns into a large negative logit for every token that is not
printable text by itself (or only spaces), and the head's other weights are scaled up.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import gguf
import numpy as np

#: The constant residual dimension, and how strongly the head reads it against a token.
CARRIER = 0.1
BANNED = -40.0
#: The output head's own weights, scaled so greedy choices are no near-ties.
SHARPEN = 5.0
_PER_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte (the inverse of bytes_to_unicode)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _printable(token: str, decoder: dict[str, int]) -> bool:
    """Whether the token is whole printable text by itself, not only spaces (a space or a
    newline inside it is fine)."""
    try:
        text = bytes(decoder[c] for c in token).decode("utf-8")
    except (KeyError, UnicodeDecodeError):
        return False
    return bool(text.strip()) and all(c.isprintable() or c in " \n" for c in text)


class SafeTensors:
    def __init__(self, path: Path) -> None:
        self.raw = path.read_bytes()
        (size,) = struct.unpack("<Q", self.raw[:8])
        self.header = json.loads(self.raw[8 : 8 + size])
        self.base = 8 + size

    def tensor(self, name: str) -> np.ndarray:
        meta = self.header[name]
        start, end = meta["data_offsets"]
        data = self.raw[self.base + start : self.base + end]
        assert meta["dtype"] == "BF16", meta["dtype"]
        bits = np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(meta["shape"]).copy()


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    shape = weights.shape
    return (
        weights.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
    )


def main(source: Path, out: Path) -> None:
    config = json.loads((source / "config.json").read_text())
    tokenizer = json.loads((source / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    tokens = [""] * len(vocab)
    for text, index in vocab.items():
        tokens[index] = text
    special = {t["id"] for t in tokenizer["added_tokens"] if t.get("special")}
    decoder = _byte_decoder()
    banned = [i for i, t in enumerate(tokens) if i in special or not _printable(t, decoder)]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config.get("rope_parameters", {}).get("rope_theta", 10000.0))
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [
            gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
            for i in range(len(tokens))
        ]
    )
    writer.add_token_merges(
        [" ".join(m) if isinstance(m, list) else m for m in tokenizer["model"]["merges"]]
    )
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_add_bos_token(True)
    template = source / "chat_template.jinja"
    if template.exists():
        writer.add_chat_template(template.read_text())

    weights = SafeTensors(source / "model.safetensors")
    embed = weights.tensor("model.embed_tokens.weight")
    embed[:, 0] = CARRIER  # every token carries the constant in dimension 0
    head = weights.tensor("lm_head.weight") * SHARPEN
    head[:, 0] = 0.0
    head[banned, 0] = BANNED
    finite = not np.isnan(embed[:, 1:]).any()
    tensors = {"token_embd.weight": embed, "output.weight": head}
    tensors["output_norm.weight"] = weights.tensor("model.norm.weight")
    for layer in range(config["num_hidden_layers"]):
        for hf, name in _PER_LAYER.items():
            data = weights.tensor(f"model.layers.{layer}.{hf}.weight")
            if name == "attn_q":
                data = _permute(data, heads)
            elif name == "attn_k":
                data = _permute(data, kv_heads)
            elif name in ("attn_output", "ffn_down") and finite:
                data[0, :] = 0.0  # nothing writes into the carrier dimension
            tensors[f"blk.{layer}.{name}.weight"] = data
    for name, data in tensors.items():
        writer.add_tensor(name, data.astype(np.float32 if data.ndim == 1 else np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
