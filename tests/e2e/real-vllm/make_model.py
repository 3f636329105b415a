"""Build the suite's tiny model at run time: a byte-level BPE tokenizer trained here, a 2-layer
Llama config (random weights: vLLM serves it with --load-format dummy) and two LoRA adapters.

usage: make_model.py OUT_DIR
Writes OUT_DIR/model (config + tokenizer) and OUT_DIR/lora-a, OUT_DIR/lora-b.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<|bos|>", "<|eos|>", "<|pad|>", "<|end|>"]


def corpus():
    words = ("the quick brown fox jumps over the lazy dog while a model server answers "
             "requests for tokens prefix cache routing gateway latency adapter system user "
             "assistant hello world say something count numbers one two three four five").split()
    for i in range(2000):
        yield " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) + f" {i}"


def main(out):
    os.makedirs(out, exist_ok=True)
    mdir = os.path.join(out, "model")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>",
                                   eos_token="<|eos|>", pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(mdir)
    vocab = len(fast)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=4096, bos_token_id=fast.bos_token_id,
                      eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
                      tie_word_embeddings=False, torch_dtype="bfloat16",
                      architectures=["LlamaForCausalLM"])
    cfg.save_pretrained(mdir)
    # Adapters need a base model object; this one is random and never saved (vLLM uses
    # --load-format dummy).
    import torch
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(0)
    for i, name in enumerate(["lora-a", "lora-b"]):
        base = LlamaForCausalLM(cfg)
        lcfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                          init_lora_weights=False, task_type="CAUSAL_LM")
        peft_model = get_peft_model(base, lcfg)
        peft_model.save_pretrained(os.path.join(out, name))
        # vLLM checks base_model_name_or_path only loosely; point it at the served model dir.
        acfg_path = os.path.join(out, name, "adapter_config.json")
        acfg = json.load(open(acfg_path))
        acfg["base_model_name_or_path"] = mdir
        json.dump(acfg, open(acfg_path, "w"), indent=1)
    print(json.dumps({"model": mdir, "vocab_size": vocab,
                      "adapters": [os.path.join(out, n) for n in ("lora-a", "lora-b")]}))


if __name__ == "__main__":
    main(sys.argv[1])
